#!/usr/bin/env bash
# Fold a LoRA reward model into its base model: a standalone directory with weights, tokenizer and config.
#   bash scripts/merge_rm.sh runs/slf5k/reward_model runs/slf5k/reward_model_merged
#   bash scripts/merge_rm.sh runs/slf5k/reward_model/checkpoint-800 /tmp/rm_800 --dtype bf16
# Extra flags go to `python -m reward_model.merge` (see its --help).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
if [ $# -lt 2 ]; then
    echo "usage: bash scripts/merge_rm.sh ADAPTER_DIR OUTPUT_DIR [--dtype bf16] [--base_model ID_OR_PATH]" >&2
    exit 2
fi
ADAPTER="$1"
OUTPUT="$2"
shift 2
exec "${PYTHON:-python}" -m reward_model.merge --adapter "$ADAPTER" --output_dir "$OUTPUT" "$@"
