#!/usr/bin/env bash
# Phase 1 on SLF5K: GPT-4o critiques of model summaries (CRITIC=human grounds SLF5K's human feedback instead).
# The data: `text2grad prepare-data --dataset slf5k` on INPUT (default JeremyAlain/SLF5K, read through its JSONL
# files; or a local copy of them) into DATA_DIR (default data/slf5k), done first if needed.
#   OPENAI_API_KEY=... bash scripts/annotate_slf5k.sh
#   CRITIC=human INPUT=/path/to/SLF5K bash scripts/annotate_slf5k.sh --concurrency 32
#   TEXT2GRAD_TINY=1 bash scripts/annotate_slf5k.sh          # offline smoke run
DATASET=slf5k
source "$(dirname "${BASH_SOURCE[0]}")/_annotate_common.sh"
