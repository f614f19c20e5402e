#!/usr/bin/env bash
# SLF5K policy phase: SFT (TRL SFTTrainer) -> Text2Grad PPO with the trained reward model [-> DPO baseline].
#
#   bash scripts/train_slf5k.sh                              # real run (configs/slf5k/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_slf5k.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="sft ppo dpo" bash scripts/train_slf5k.sh         # also the DPO baseline
#   TEXT2GRAD_TINY=1 bash scripts/train_slf5k.sh             # tiny offline model and data (CI smoke test)
#
# Data: `text2grad prepare-data --dataset slf5k` on INPUT (default JeremyAlain/SLF5K, or a local copy) into DATA_DIR
# (default data/slf5k) if not done yet; SFT on sft.jsonl (ideal human summaries), PPO on rl_prompts.jsonl, DPO on
# preference_pairs.jsonl (SLF5K's human comparisons, "Summary A"/"Summary B").
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), INPUT, DATA_DIR, PREPARE_ARGS,
# DATASET / SFT_DATASET / DPO_DATASET (override one prepared file),
# OUT (output root, default runs/slf5k), PHASES (default "sft ppo"), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), NUM_PROCESSES (all phases) and PPO_PROCESSES
# (PPO only: the paper's batch of 12 rollouts splits over 1, 2, 3 or 6 processes, e.g. PPO_PROCESSES=6 on 8 GPUs),
# NUM_MACHINES / MACHINE_RANK / MAIN_PROCESS_IP (several machines: the same command on each with its own rank;
# configs/accelerate/multinode_deepspeed_<stage>.yaml), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# reference-summary critic (no reward model is trained) and DeepSpeed runs on CPU (DS_ACCELERATOR=cpu).
NAME=slf5k
DEFAULT_PHASES="sft ppo"
configure() {  # the dataset-specific part; everything else is in scripts/_train_policy.sh
    if [ "$TINY" = 1 ]; then
        SOURCE=(--critic reference --critic_kwargs '{"reference_field": "reference"}')
    fi
}
source "$(dirname "${BASH_SOURCE[0]}")/_train_policy.sh"
