# Shared by scripts/train_<dataset>.sh (policy phase: SFT -> NL-Gradient PPO [-> DPO baseline]); sourced, not run.
# Expects NAME (the dataset: configs/NAME/{sft,ppo,dpo}.yaml, runs/NAME), DEFAULT_PHASES, and a function
# `configure` that sets what is dataset-specific. It is called once with TINY=1 or TINY=0:
#   TINY=1: DATASET is already the generated tiny training data; set SOURCE (the tiny-mode feedback flags).
#   TINY=0: SOURCE already points at REWARD_MODEL; give DATASET its default (${DATASET:-...}).
#   Both: set SFT_DATASET and DPO_DATASET (DPO_DATASET may stay unset: the dpo phase then asks for it), and
#   optionally SFT_PROMPT / PPO_PROMPT / DPO_PROMPT (extra flags per phase, e.g. --use_chat_template false).
# The environment variables are documented in the per-dataset scripts.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-runs/$NAME}"
PHASES="${PHASES:-$DEFAULT_PHASES}"
read -r -a SFT_EXTRA <<< "${SFT_ARGS:-}"
read -r -a PPO_EXTRA <<< "${PPO_ARGS:-}"
read -r -a DPO_EXTRA <<< "${DPO_ARGS:-}"
SFT_PROMPT=(); PPO_PROMPT=(); DPO_PROMPT=()

if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    TINY=1
    OUT="${OUT%/}/tiny"
    "$PY" -m text2grad.apps.tiny --dataset "$NAME" --output_dir "$OUT/world"
    MODEL="$OUT/world/model"
    DATASET="$OUT/world/data/train.jsonl"
    SFT_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    PPO_SIZE=(--num_iterations 2 --batch_size 4 --num_mini_batches 2 --num_ppo_epochs 1 --response_length 12
              --dtype auto --gradient_checkpointing false --progress_bar false --overwrite_output_dir true)
    DPO_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    ACCEL_PREFIX="cpu_deepspeed_"
    export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
else
    TINY=0
    MODEL="${MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
    REWARD_MODEL="${REWARD_MODEL:-runs/$NAME/reward_model}"
    SOURCE=(--feedback_source reward_model --feedback_source_kwargs "{\"path\": \"$REWARD_MODEL\"}")
    SFT_SIZE=(); PPO_SIZE=(); DPO_SIZE=()
    ACCEL_PREFIX="deepspeed_"
fi
configure

LAUNCH=("$PY" -m)
SFT_DS=()
if [ -n "${DEEPSPEED:-}" ]; then
    LAUNCH=(accelerate launch --config_file "${ACCELERATE_CONFIG:-configs/accelerate/${ACCEL_PREFIX}${DEEPSPEED}.yaml}" -m)
    [ "$TINY" = "1" ] || SFT_DS=(--deepspeed "configs/deepspeed/${DEEPSPEED}.json")
fi
# SFT and DPO use the transformers Trainer, whose DeepSpeed path needs a GPU: on CPU (tiny mode) only PPO is
# launched under DeepSpeed.
HF_LAUNCH=("${LAUNCH[@]}")
[ "$TINY" = "1" ] && HF_LAUNCH=("$PY" -m)

for phase in $PHASES; do
    echo "[train_$NAME] phase: $phase"
    case "$phase" in
        sft)
            "${HF_LAUNCH[@]}" policy_optimization.sft --config "configs/$NAME/sft.yaml" --model_name_or_path "$MODEL" \
                --dataset_path "$SFT_DATASET" --output_dir "$OUT/sft" "${SFT_DS[@]}" "${SFT_PROMPT[@]}" "${SFT_SIZE[@]}" "${SFT_EXTRA[@]}" ;;
        ppo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${LAUNCH[@]}" policy_optimization.train --config "configs/$NAME/ppo.yaml" --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/ppo" "${SOURCE[@]}" "${PPO_PROMPT[@]}" "${PPO_SIZE[@]}" "${PPO_EXTRA[@]}" ;;
        dpo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${HF_LAUNCH[@]}" policy_optimization.dpo --config "configs/$NAME/dpo.yaml" --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "${DPO_DATASET:?set DPO_DATASET to a JSONL of question/chosen/rejected pairs}" \
                --output_dir "$OUT/dpo" "${SFT_DS[@]}" "${DPO_PROMPT[@]}" "${DPO_SIZE[@]}" "${DPO_EXTRA[@]}" ;;
        *) echo "[train_$NAME] unknown phase '$phase' (use sft, ppo, dpo)" >&2; exit 2 ;;
    esac
done
echo "[train_$NAME] done: outputs in $OUT"
