#!/usr/bin/env bash
# Phase 1 on SLF5K: GPT-4o critiques of model summaries (CRITIC=human grounds SLF5K's human feedback instead).
#   OPENAI_API_KEY=... bash scripts/annotate_slf5k.sh
#   CRITIC=human INPUT=data/slf5k_train.jsonl bash scripts/annotate_slf5k.sh --concurrency 32
#   TEXT2GRAD_TINY=1 bash scripts/annotate_slf5k.sh          # offline smoke run
DATASET=slf5k
DEFAULT_INPUT=JeremyAlain/SLF5K
TINY_FIELD_MAP='{"prompt": "post", "response": "summary", "feedback": "feedback"}'
source "$(dirname "${BASH_SOURCE[0]}")/_annotate_common.sh"
