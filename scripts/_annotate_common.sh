# Shared by scripts/annotate_<dataset>.sh; sourced, not run. Expects DATASET (slf5k, kodcode, ultrafeedback).
#
#   INPUT=... DATA_DIR=... OUTPUT=... CRITIC=llm|human|code_tests bash scripts/annotate_<dataset>.sh [extra flags]
#   TEXT2GRAD_TINY=1 bash scripts/annotate_<dataset>.sh     # offline smoke run (CI): tiny data + scripted local server
#   TEXT2GRAD_TINY=1 INPUT=tests/fixtures/<dataset> bash scripts/annotate_<dataset>.sh   # the same on given native rows
#
# First `text2grad prepare-data` turns INPUT (the dataset's hub id by default, or a local copy in its native
# layout) into DATA_DIR (default data/<dataset>) unless that is already done (scripts/_prepare_data.sh), then
# DATA_DIR/annotation_input.jsonl is annotated. Extra flags go straight to `python -m text2grad.annotate` (see its
# --help), e.g. --model, --base_url, --cot false, --concurrency 32, --max_cost_usd 20. Rerunning the same command
# resumes an interrupted run.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
cd "$ROOT"
source scripts/_prepare_data.sh

OUTPUT="${OUTPUT:-runs/$DATASET/annotations.jsonl}"
CRITIC="${CRITIC:-}"
EXTRA=()
[ -n "$CRITIC" ] && EXTRA+=(--critic "$CRITIC")

if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    # Offline: a generated tiny dataset in the native layout (prepared below exactly like the real one),
    # annotated by a scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py), so the real client,
    # retries and resume logic run end to end without an API.
    WORK="${TINY_DIR:-$(mktemp -d)}"
    mkdir -p "$WORK"
    "$PY" -m text2grad.apps.tiny --dataset "$DATASET" --output_dir "$WORK" --prepare false >/dev/null 2>&1
    INPUT="${INPUT:-$WORK/raw}"                 # generated native-layout rows unless INPUT names others
    DATA_DIR="$WORK/data"
    COMPLETIONS_MODEL="$WORK/model"             # KodCode's negatives come from the tiny model ...
    PREPARE_ARGS="--max_new_tokens 24 ${PREPARE_ARGS:-}"  # ... writing short programs
    OUTPUT="$WORK/annotations.${CRITIC:-llm}.jsonl"
    EXTRA+=(--progress_bar false)
    if [ "$CRITIC" != "code_tests" ]; then
        rm -f "$WORK/fake_openai.url"
        "$PY" "$ROOT/tests/fake_openai.py" --port_file "$WORK/fake_openai.url" &
        SERVER_PID=$!
        trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
        for _ in $(seq 1 200); do [ -s "$WORK/fake_openai.url" ] && break; sleep 0.05; done
        [ -s "$WORK/fake_openai.url" ] || { echo "scripted server did not start" >&2; exit 1; }
        # An unset variable as the key source: the local server gets a placeholder, never a real key.
        EXTRA+=(--base_url "$(cat "$WORK/fake_openai.url")" --api_key_env TEXT2GRAD_TINY_NO_KEY)
    fi
fi

# KodCode's reward-model data needs failing programs next to the references: a model's completions, scored by
# the unit tests in the sandbox (COMPLETIONS_MODEL, default the policy model; or PREPARE_ARGS="--completions FILE").
PREPARE_FLAGS=()
if [ "$DATASET" = "kodcode" ] && [[ " ${PREPARE_ARGS:-} " != *" --completions "* ]]; then
    PREPARE_FLAGS=(--completions_model "${COMPLETIONS_MODEL:-meta-llama/Llama-3.1-8B-Instruct}")
fi
ensure_prepared "$DATASET"

"$PY" -m text2grad.annotate --config "configs/$DATASET/annotation.yaml" \
    --dataset_path "$DATA_DIR/annotation_input.jsonl" --output "$OUTPUT" "${EXTRA[@]}" "$@"
echo "annotations: $OUTPUT"
