#!/usr/bin/env bash
# Phase 1 on KodCode: GPT-4o code reviews (CRITIC=code_tests runs each solution against its unit tests in the
# sandbox instead: no API, no cost).
#   OPENAI_API_KEY=... bash scripts/annotate_kodcode.sh
#   CRITIC=code_tests bash scripts/annotate_kodcode.sh
#   TEXT2GRAD_TINY=1 [CRITIC=code_tests] bash scripts/annotate_kodcode.sh   # offline smoke run
DATASET=kodcode
DEFAULT_INPUT=KodCode/KodCode-Light-RL-10K
TINY_FIELD_MAP='{"prompt": "question", "response": "solution", "tests": "test"}'
source "$(dirname "${BASH_SOURCE[0]}")/_annotate_common.sh"
