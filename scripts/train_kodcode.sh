#!/usr/bin/env bash
# KodCode policy phase: NL-Gradient PPO from the instruct model with the trained reward model (the paper does
# no SFT here; PHASES="sft ppo" adds it) [-> DPO baseline on test-built preference pairs].
#
#   bash scripts/train_kodcode.sh                              # real run (configs/kodcode/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_kodcode.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="ppo dpo" DPO_DATASET=runs/kodcode/pairs.jsonl bash scripts/train_kodcode.sh   # + DPO baseline
#     (build the pairs first from unit tests: python -m policy_optimization.code_pairs --help)
#   TEXT2GRAD_TINY=1 bash scripts/train_kodcode.sh             # tiny offline model and data (CI smoke test)
#
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), DATASET (hub id or file),
# OUT (output root, default runs/kodcode), PHASES (default "ppo"), DPO_DATASET (pass/fail pairs), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# unit tests in the sandbox (feedback_source code_tests, record field "test") and DeepSpeed runs on CPU
# (DS_ACCELERATOR=cpu).
NAME=kodcode
DEFAULT_PHASES="ppo"
configure() {  # the dataset-specific part; everything else is in scripts/_train_policy.sh
    if [ "$TINY" = 1 ]; then
        SOURCE=(--feedback_source code_tests --feedback_source_kwargs '{"tests_field": "test", "timeout_s": 20}')
        SFT_PROMPT=(--use_chat_template false); PPO_PROMPT=(--use_chat_template false)
    else
        DATASET="${DATASET:-KodCode/KodCode-Light-RL-10K}"
        DPO_DATASET="${DPO_DATASET:-runs/kodcode/pairs.jsonl}"
    fi
    SFT_DATASET="$DATASET"
}
source "$(dirname "${BASH_SOURCE[0]}")/_train_policy.sh"
