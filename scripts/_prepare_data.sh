# Sourced by the per-dataset scripts: `ensure_prepared DATASET` makes sure DATA_DIR holds what
# `text2grad prepare-data` writes for DATASET (annotation_input.jsonl, sft.jsonl, rl_prompts.jsonl, eval.jsonl,
# preference_pairs.jsonl, prepare_report.json), running it on INPUT when the report is missing.
#   INPUT         the dataset as it is: hub id (default) or a local copy in the native layout
#   DATA_DIR      where the prepared files go (default data/DATASET)
#   PREPARE_ARGS  extra prepare-data flags, e.g. "--seed 1" or, for KodCode, "--completions runs/gpt35.jsonl"
#   REPREPARE=1   rebuild DATA_DIR even when it is already prepared
# Expects PY (the Python to run). PREPARE_FLAGS (an array, optional) carries the calling script's defaults.
declare -A T2G_HUB_IDS=([slf5k]=JeremyAlain/SLF5K [kodcode]=KodCode/KodCode-Light-RL-10K
                        [ultrafeedback]=HuggingFaceH4/ultrafeedback_binarized)

ensure_prepared() {
    local dataset="$1"
    INPUT="${INPUT:-${T2G_HUB_IDS[$dataset]}}"
    DATA_DIR="${DATA_DIR:-data/$dataset}"
    if [ -f "$DATA_DIR/prepare_report.json" ] && [ "${REPREPARE:-0}" != "1" ]; then
        echo "[prepare-data] using $DATA_DIR (already prepared; REPREPARE=1 rebuilds it from INPUT)" >&2
        return 0
    fi
    local extra=()
    read -r -a extra <<< "${PREPARE_ARGS:-}"
    "$PY" -m text2grad.apps.prepare_data --dataset "$dataset" --dataset_path "$INPUT" --output_dir "$DATA_DIR" \
        ${PREPARE_FLAGS[@]+"${PREPARE_FLAGS[@]}"} ${extra[@]+"${extra[@]}"} >&2
}
