#!/usr/bin/env bash
# Phase 1 on KodCode: GPT-4o code reviews of the reference solutions AND a model's completions, each shown with the
# unit tests and their execution result (CRITIC=code_tests turns the test run itself into the critique: no API).
# The data: `text2grad prepare-data --dataset kodcode` on INPUT (default KodCode/KodCode-Light-RL-10K) into DATA_DIR
# (default data/kodcode), done first: COMPLETIONS_MODEL (default meta-llama/Llama-3.1-8B-Instruct) writes the
# completions, or PREPARE_ARGS="--completions FILE.jsonl" brings your own (question_id + completion).
#   OPENAI_API_KEY=... bash scripts/annotate_kodcode.sh
#   CRITIC=code_tests COMPLETIONS_MODEL=Qwen/Qwen2.5-0.5B-Instruct bash scripts/annotate_kodcode.sh
#   TEXT2GRAD_TINY=1 [CRITIC=code_tests] bash scripts/annotate_kodcode.sh   # offline smoke run
DATASET=kodcode
source "$(dirname "${BASH_SOURCE[0]}")/_annotate_common.sh"
