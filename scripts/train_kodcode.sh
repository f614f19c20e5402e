#!/usr/bin/env bash
# KodCode policy phase: Text2Grad PPO from the instruct model with the trained reward model (the paper does
# no SFT here; PHASES="sft ppo" adds it) [-> DPO baseline on test-built preference pairs].
#
#   bash scripts/train_kodcode.sh                              # real run (configs/kodcode/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_kodcode.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="ppo dpo" bash scripts/train_kodcode.sh              # + DPO baseline on test-judged pairs
#   TEXT2GRAD_TINY=1 bash scripts/train_kodcode.sh             # tiny offline model and data (CI smoke test)
#
# Data: `text2grad prepare-data --dataset kodcode` on INPUT (default KodCode/KodCode-Light-RL-10K, or a local copy)
# into DATA_DIR (default data/kodcode) if not done yet: PPO on rl_prompts.jsonl (questions disjoint from the reward
# model's, with the required signature from test_info in the prompt), DPO on preference_pairs.jsonl (a passing vs
# a failing program per question, judged by the unit tests). The failing programs are COMPLETIONS_MODEL's (default
# MODEL) or PREPARE_ARGS="--completions FILE.jsonl".
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), INPUT, DATA_DIR, PREPARE_ARGS,
# COMPLETIONS_MODEL, DATASET / SFT_DATASET / DPO_DATASET (override one prepared file),
# OUT (output root, default runs/kodcode), PHASES (default "ppo"), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), NUM_PROCESSES (all phases), PPO_PROCESSES
# (PPO only), NUM_MACHINES / MACHINE_RANK / MAIN_PROCESS_IP (several machines: the same command on each with its
# own rank; configs/accelerate/multinode_deepspeed_<stage>.yaml), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# unit tests in the sandbox (critic code_tests, record field "test") and DeepSpeed runs on CPU
# (DS_ACCELERATOR=cpu).
NAME=kodcode
DEFAULT_PHASES="ppo"
configure() {  # the dataset-specific part; everything else is in scripts/_train_policy.sh
    if [ "$TINY" = 1 ]; then
        SOURCE=(--critic code_tests --critic_kwargs '{"tests_field": "test", "timeout_s": 20}')
        SFT_PROMPT=(--use_chat_template false); PPO_PROMPT=(--use_chat_template false)
    fi
    if [[ " ${PREPARE_ARGS:-} " != *" --completions "* ]]; then
        PREPARE_FLAGS=(--completions_model "${COMPLETIONS_MODEL:-$MODEL}")
    fi
}
source "$(dirname "${BASH_SOURCE[0]}")/_train_policy.sh"
