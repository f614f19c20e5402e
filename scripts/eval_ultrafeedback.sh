#!/usr/bin/env bash
# UltraFeedback policy evaluation: ARC-Challenge (log-likelihood accuracy), then, when a judge is configured,
# AlpacaEval 2.0 style (pairwise win rate vs the baseline outputs) and MT-Bench style (1-10 grades).
#
#   MODEL=meta-llama/Meta-Llama-3-8B-Instruct ADAPTER=runs/ultrafeedback/policy \
#       ARC_DATA=allenai/ai2_arc ALPACA_DATA=alpaca_eval.json MTBENCH_DATA=mt_bench_question.jsonl \
#       JUDGE_MODEL=gpt-4-turbo bash scripts/eval_ultrafeedback.sh
#   TEXT2GRAD_TINY=1 bash scripts/eval_ultrafeedback.sh   # offline smoke run on the tiny world (python -m text2grad.apps.tiny)
#
# Environment: MODEL (required), ADAPTER, OUTPUT_DIR (default runs/eval/ultrafeedback), ARC_DATA (a file, or
# allenai/ai2_arc with ARC_CONFIG=ARC-Challenge, the default, and ARC_SPLIT=test), ALPACA_DATA (JSON/JSONL with
# instruction + output), MTBENCH_DATA (JSONL with turns), JUDGE_MODEL / JUDGE_BASE_URL / JUDGE_API_KEY_ENV,
# CONFIG (default configs/ultrafeedback/eval.yaml). A suite whose data variable is unset is skipped and says so;
# the judged suites are skipped without JUDGE_MODEL. Extra arguments go to every Python call.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
CONFIG="${CONFIG:-configs/ultrafeedback/eval.yaml}"
OUTPUT_DIR="${OUTPUT_DIR:-runs/eval/ultrafeedback}"
extra=()
if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    TINY_DIR="${TINY_DIR:-runs/tiny}"
    world="$TINY_DIR/ultrafeedback"
    "$PYTHON" -m text2grad.apps.tiny --dataset ultrafeedback --output_dir "$world"
    MODEL="${MODEL:-$world/model}"
    # Tiny stand-ins built from the tiny world's eval records: a two-choice set (chosen vs rejected, in a
    # seeded order) for the ARC scorer, the prompts with their chosen answers as the AlpacaEval baseline,
    # and two-turn questions for MT-Bench.
    "$PYTHON" - "$world" <<'PY'
import json, random, sys
from pathlib import Path
from text2grad.core.data import iter_jsonl, write_jsonl
world = Path(sys.argv[1])
records = list(iter_jsonl(world / "data" / "eval.jsonl"))
rng = random.Random(0)
arc = []
for r in records:
    chosen_first = rng.random() < 0.5
    choices = [r["chosen"], r["rejected"]] if chosen_first else [r["rejected"], r["chosen"]]
    arc.append({"id": r["id"], "question": r["prompt"], "choices": choices, "answer": 0 if chosen_first else 1})
write_jsonl(world / "data" / "arc_tiny.jsonl", arc)
write_jsonl(world / "data" / "alpaca_tiny.jsonl", [{"id": r["id"], "instruction": r["prompt"], "output": r["chosen"]} for r in records])
write_jsonl(world / "data" / "mt_bench_tiny.jsonl",
            [{"question_id": r["id"], "category": "advice", "turns": [r["prompt"], "Say that again in one sentence."]} for r in records[:4]])
PY
    ARC_DATA="${ARC_DATA:-$world/data/arc_tiny.jsonl}"
    ALPACA_DATA="${ALPACA_DATA:-$world/data/alpaca_tiny.jsonl}"
    MTBENCH_DATA="${MTBENCH_DATA:-$world/data/mt_bench_tiny.jsonl}"
    extra+=(--max_new_tokens 12 --batch_size 4 --device cpu --progress_bar false)
fi
: "${MODEL:?set MODEL to the policy (hub id or directory), or TEXT2GRAD_TINY=1}"
common=(--config "$CONFIG" --model "$MODEL" --output_dir "$OUTPUT_DIR")
if [ -n "${ADAPTER:-}" ]; then common+=(--adapter "$ADAPTER"); fi
judge=()
if [ -n "${JUDGE_MODEL:-}" ]; then
    judge+=(--judge_model "$JUDGE_MODEL")
    if [ -n "${JUDGE_BASE_URL:-}" ]; then judge+=(--judge_base_url "$JUDGE_BASE_URL"); fi
    if [ -n "${JUDGE_API_KEY_ENV:-}" ]; then judge+=(--judge_api_key_env "$JUDGE_API_KEY_ENV"); fi
fi

if [ -n "${ARC_DATA:-}" ]; then
    arc=(--task arc --dataset_path "$ARC_DATA")
    if [ ! -e "$ARC_DATA" ]; then arc+=(--dataset_config "${ARC_CONFIG:-ARC-Challenge}" --dataset_split "${ARC_SPLIT:-test}"); fi
    "$PYTHON" -m text2grad.apps.evaluation.qa "${common[@]}" "${arc[@]}" "${extra[@]}" "$@"
else
    echo "[eval_ultrafeedback] ARC skipped: set ARC_DATA (e.g. allenai/ai2_arc or a JSONL file)"
fi
if [ ${#judge[@]} -eq 0 ]; then
    echo "[eval_ultrafeedback] AlpacaEval and MT-Bench skipped: they need a judge (set JUDGE_MODEL, and JUDGE_BASE_URL for a local server)"
    exit 0
fi
if [ -n "${ALPACA_DATA:-}" ]; then
    "$PYTHON" -m text2grad.apps.evaluation.qa "${common[@]}" --task alpaca_eval --dataset_path "$ALPACA_DATA" "${judge[@]}" "${extra[@]}" "$@"
else
    echo "[eval_ultrafeedback] AlpacaEval skipped: set ALPACA_DATA (JSON/JSONL with instruction and output)"
fi
if [ -n "${MTBENCH_DATA:-}" ]; then
    "$PYTHON" -m text2grad.apps.evaluation.qa "${common[@]}" --task mt_bench --dataset_path "$MTBENCH_DATA" "${judge[@]}" "${extra[@]}" "$@"
else
    echo "[eval_ultrafeedback] MT-Bench skipped: set MTBENCH_DATA (JSONL with turns)"
fi
