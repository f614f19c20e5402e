#!/usr/bin/env bash
# SLF5K policy phase: SFT (TRL SFTTrainer) -> NL-Gradient PPO with the trained reward model [-> DPO baseline].
#
#   bash scripts/train_slf5k.sh                              # real run (configs/slf5k/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_slf5k.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="sft ppo dpo" bash scripts/train_slf5k.sh         # also the DPO baseline
#   TEXT2GRAD_TINY=1 bash scripts/train_slf5k.sh             # tiny offline model and data (CI smoke test)
#
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), DATASET (hub id or file),
# OUT (output root, default runs/slf5k), PHASES (default "sft ppo"), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# reference-summary critic (no reward model is trained) and DeepSpeed runs on CPU (DS_ACCELERATOR=cpu).
NAME=slf5k
DEFAULT_PHASES="sft ppo"
configure() {  # the dataset-specific part; everything else is in scripts/_train_policy.sh
    if [ "$TINY" = 1 ]; then
        SOURCE=(--feedback_source reference --feedback_source_kwargs '{"reference_field": "reference"}')
    else
        DATASET="${DATASET:-JeremyAlain/SLF5K}"
    fi
    SFT_DATASET="$DATASET"; DPO_DATASET="$DATASET"
}
source "$(dirname "${BASH_SOURCE[0]}")/_train_policy.sh"
