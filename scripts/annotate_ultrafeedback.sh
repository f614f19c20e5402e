#!/usr/bin/env bash
# Phase 1 on UltraFeedback: GPT-4o critiques of assistant answers.
#   OPENAI_API_KEY=... INPUT=data/ultrafeedback_rm.jsonl bash scripts/annotate_ultrafeedback.sh
#   INPUT=HuggingFaceH4/ultrafeedback_binarized bash scripts/annotate_ultrafeedback.sh --split train_prefs --field_map '{"response": "chosen"}'
#   TEXT2GRAD_TINY=1 bash scripts/annotate_ultrafeedback.sh  # offline smoke run
DATASET=ultrafeedback
DEFAULT_INPUT=data/ultrafeedback.jsonl
TINY_FIELD_MAP='{"prompt": "prompt", "response": "response"}'
source "$(dirname "${BASH_SOURCE[0]}")/_annotate_common.sh"
