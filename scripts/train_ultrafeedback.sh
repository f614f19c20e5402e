#!/usr/bin/env bash
# UltraFeedback policy phase: SFT (TRL SFTTrainer) -> Text2Grad PPO with the trained reward model [-> DPO baseline].
#
#   bash scripts/train_ultrafeedback.sh                              # real run (configs/ultrafeedback/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_ultrafeedback.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="sft ppo dpo" bash scripts/train_ultrafeedback.sh         # also the DPO baseline
#   TEXT2GRAD_TINY=1 bash scripts/train_ultrafeedback.sh             # tiny offline model and data (CI smoke test)
#
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), INPUT (default
# HuggingFaceH4/ultrafeedback_binarized, or a local copy), DATA_DIR (default data/ultrafeedback), PREPARE_ARGS,
# DATASET / SFT_DATASET / DPO_DATASET (override one prepared file),
# OUT (output root, default runs/ultrafeedback), PHASES (default "sft ppo"), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), NUM_PROCESSES (all phases), PPO_PROCESSES
# (PPO only), NUM_MACHINES / MACHINE_RANK / MAIN_PROCESS_IP (several machines: the same command on each with its
# own rank; configs/accelerate/multinode_deepspeed_<stage>.yaml), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# reference critic against the chosen answer (no reward model is trained) and DeepSpeed runs on CPU
# (DS_ACCELERATOR=cpu). Both read what prepare-data made of train_prefs (30 % SFT / 50 % RM / 20 % RL by prompt):
# DATA_DIR/sft.jsonl, DATA_DIR/rl_prompts.jsonl, and DATA_DIR/preference_pairs.jsonl (the RM part) for DPO.
NAME=ultrafeedback
DEFAULT_PHASES="sft ppo"
configure() {  # the dataset-specific part; everything else is in scripts/_train_policy.sh
    if [ "$TINY" = 1 ]; then
        SOURCE=(--critic reference --critic_kwargs '{"reference_field": "reference"}')
        SFT_PROMPT=(--use_chat_template false); PPO_PROMPT=(--use_chat_template false); DPO_PROMPT=(--use_chat_template false)
    fi
}
source "$(dirname "${BASH_SOURCE[0]}")/_train_policy.sh"
