#!/usr/bin/env bash
# Phase 1 on UltraFeedback: GPT-4o critiques of both the chosen and the rejected answer of each reward-model pair.
# The data: `text2grad prepare-data --dataset ultrafeedback` on INPUT (default HuggingFaceH4/ultrafeedback_binarized,
# split train_prefs 30 % SFT / 50 % RM / 20 % RL by prompt) into DATA_DIR (default data/ultrafeedback), done first.
#   OPENAI_API_KEY=... bash scripts/annotate_ultrafeedback.sh
#   INPUT=/path/to/ultrafeedback_binarized bash scripts/annotate_ultrafeedback.sh --concurrency 32
#   TEXT2GRAD_TINY=1 bash scripts/annotate_ultrafeedback.sh  # offline smoke run
DATASET=ultrafeedback
source "$(dirname "${BASH_SOURCE[0]}")/_annotate_common.sh"
