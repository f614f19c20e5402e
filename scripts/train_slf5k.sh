#!/usr/bin/env bash
# SLF5K policy phase: SFT (TRL SFTTrainer) -> NL-Gradient PPO with the trained reward model [-> DPO baseline].
#
#   bash scripts/train_slf5k.sh                              # real run (configs/slf5k/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_slf5k.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="sft ppo dpo" bash scripts/train_slf5k.sh         # also the DPO baseline
#   TEXT2GRAD_TINY=1 bash scripts/train_slf5k.sh             # tiny offline model and data (CI smoke test)
#
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), DATASET (hub id or file),
# OUT (output root, default runs/slf5k), PHASES (default "sft ppo"), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# reference-summary critic (no reward model is trained) and DeepSpeed runs on CPU (DS_ACCELERATOR=cpu).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-runs/slf5k}"
PHASES="${PHASES:-sft ppo}"
read -r -a SFT_EXTRA <<< "${SFT_ARGS:-}"
read -r -a PPO_EXTRA <<< "${PPO_ARGS:-}"
read -r -a DPO_EXTRA <<< "${DPO_ARGS:-}"

if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    OUT="${OUT%/}/tiny"
    "$PY" -m text2grad.tiny --dataset slf5k --output_dir "$OUT/world"
    MODEL="$OUT/world/model"
    DATASET="$OUT/world/data/train.jsonl"
    SOURCE=(--feedback_source reference --feedback_source_kwargs '{"reference_field": "reference"}')
    SFT_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    PPO_SIZE=(--num_iterations 2 --batch_size 4 --num_mini_batches 2 --num_ppo_epochs 1 --response_length 12
              --dtype auto --gradient_checkpointing false --progress_bar false --overwrite_output_dir true)
    DPO_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    ACCEL_PREFIX="cpu_deepspeed_"
    export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
else
    MODEL="${MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
    DATASET="${DATASET:-JeremyAlain/SLF5K}"
    REWARD_MODEL="${REWARD_MODEL:-runs/slf5k/reward_model}"
    SOURCE=(--feedback_source reward_model --feedback_source_kwargs "{\"path\": \"$REWARD_MODEL\"}")
    SFT_SIZE=(); PPO_SIZE=(); DPO_SIZE=()
    ACCEL_PREFIX="deepspeed_"
fi

LAUNCH=("$PY" -m)
SFT_DS=()
if [ -n "${DEEPSPEED:-}" ]; then
    LAUNCH=(accelerate launch --config_file "${ACCELERATE_CONFIG:-configs/accelerate/${ACCEL_PREFIX}${DEEPSPEED}.yaml}" -m)
    [ "${TEXT2GRAD_TINY:-0}" = "1" ] || SFT_DS=(--deepspeed "configs/deepspeed/${DEEPSPEED}.json")
fi
# SFT and DPO use the transformers Trainer, whose DeepSpeed path needs a GPU: on CPU (tiny mode) only PPO is
# launched under DeepSpeed.
HF_LAUNCH=("${LAUNCH[@]}")
[ "${TEXT2GRAD_TINY:-0}" = "1" ] && HF_LAUNCH=("$PY" -m)

for phase in $PHASES; do
    echo "[train_slf5k] phase: $phase"
    case "$phase" in
        sft)
            "${HF_LAUNCH[@]}" policy_optimization.sft --config configs/slf5k/sft.yaml --model_name_or_path "$MODEL" \
                --dataset_path "$DATASET" --output_dir "$OUT/sft" "${SFT_DS[@]}" "${SFT_SIZE[@]}" "${SFT_EXTRA[@]}" ;;
        ppo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${LAUNCH[@]}" policy_optimization.train --config configs/slf5k/ppo.yaml --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/ppo" "${SOURCE[@]}" "${PPO_SIZE[@]}" "${PPO_EXTRA[@]}" ;;
        dpo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${HF_LAUNCH[@]}" policy_optimization.dpo --config configs/slf5k/dpo.yaml --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/dpo" "${SFT_DS[@]}" "${DPO_SIZE[@]}" "${DPO_EXTRA[@]}" ;;
        *) echo "[train_slf5k] unknown phase '$phase' (use sft, ppo, dpo)" >&2; exit 2 ;;
    esac
done
echo "[train_slf5k] done: outputs in $OUT"
