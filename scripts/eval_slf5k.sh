#!/usr/bin/env bash
# SLF5K summarization evaluation: ROUGE-1/2/L, BLEU, BERTScore, reference perplexity, optional judged win rate.
#
#   MODEL=meta-llama/Llama-3.1-8B-Instruct ADAPTER=runs/slf5k/policy DATA=data/slf5k/validation.jsonl \
#       bash scripts/eval_slf5k.sh
#   JUDGE_MODEL=gpt-4o BASELINE=runs/eval/slf5k_ppo/predictions.jsonl MODEL=... DATA=... bash scripts/eval_slf5k.sh
#   TEXT2GRAD_TINY=1 bash scripts/eval_slf5k.sh      # offline smoke run on the tiny world (python -m text2grad.apps.tiny)
#
# Environment: MODEL (hub id or dir; required unless PREDICTIONS is set), ADAPTER, DATA (required), OUTPUT_DIR
# (default runs/eval/slf5k), PREDICTIONS (score this JSONL of {id, prediction} instead of generating),
# JUDGE_MODEL / JUDGE_BASE_URL / JUDGE_API_KEY_ENV (the judge; key read from $OPENAI_API_KEY by default),
# BASELINE (predictions JSONL of the system to compare with; without it the judge compares with the references),
# CONFIG (default configs/slf5k/eval.yaml). Extra arguments are passed to the Python entry point.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
CONFIG="${CONFIG:-configs/slf5k/eval.yaml}"
OUTPUT_DIR="${OUTPUT_DIR:-runs/eval/slf5k}"
extra=()
if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    TINY_DIR="${TINY_DIR:-runs/tiny}"
    "$PYTHON" -m text2grad.apps.tiny --dataset slf5k --output_dir "$TINY_DIR/slf5k"
    MODEL="${MODEL:-$TINY_DIR/slf5k/model}"
    DATA="${DATA:-$TINY_DIR/slf5k/data/eval.jsonl}"
    extra+=(--max_new_tokens 12 --batch_size 4 --device cpu --progress_bar false)
fi
: "${DATA:?set DATA to the eval data (a .jsonl/.json file or a hub id), or TEXT2GRAD_TINY=1}"
args=(--config "$CONFIG" --dataset_path "$DATA" --output_dir "$OUTPUT_DIR")
if [ -n "${PREDICTIONS:-}" ]; then
    args+=(--predictions_file "$PREDICTIONS")
    if [ -z "${MODEL:-}" ]; then args+=(--metrics rouge,bleu,bertscore); fi  # perplexity needs the policy
fi
if [ -n "${MODEL:-}" ]; then args+=(--model "$MODEL"); fi
if [ -n "${ADAPTER:-}" ]; then args+=(--adapter "$ADAPTER"); fi
if [ -n "${JUDGE_MODEL:-}" ]; then
    args+=(--judge_model "$JUDGE_MODEL")
    if [ -n "${JUDGE_BASE_URL:-}" ]; then args+=(--judge_base_url "$JUDGE_BASE_URL"); fi
    if [ -n "${JUDGE_API_KEY_ENV:-}" ]; then args+=(--judge_api_key_env "$JUDGE_API_KEY_ENV"); fi
    if [ -n "${BASELINE:-}" ]; then args+=(--baseline_predictions "$BASELINE"); else args+=(--judge_against_reference true); fi
fi
exec "$PYTHON" -m text2grad.apps.evaluation.summarization "${args[@]}" "${extra[@]}" "$@"
