#!/usr/bin/env bash
# UltraFeedback policy phase: SFT (TRL SFTTrainer) -> NL-Gradient PPO with the trained reward model [-> DPO baseline].
#
#   bash scripts/train_ultrafeedback.sh                              # real run (configs/ultrafeedback/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_ultrafeedback.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="sft ppo dpo" bash scripts/train_ultrafeedback.sh         # also the DPO baseline
#   TEXT2GRAD_TINY=1 bash scripts/train_ultrafeedback.sh             # tiny offline model and data (CI smoke test)
#
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), DATASET (hub id or file),
# OUT (output root, default runs/ultrafeedback), PHASES (default "sft ppo"), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# reference critic against the chosen answer (no reward model is trained) and DeepSpeed runs on CPU
# (DS_ACCELERATOR=cpu). The real run reads the three UltraFeedback splits (30 % SFT / 50 % RM / 20 % RL):
# SFT_DATASET (default data/ultrafeedback/sft.jsonl), DATASET = the RL prompts, DPO_DATASET (the RM split).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-runs/ultrafeedback}"
PHASES="${PHASES:-sft ppo}"
read -r -a SFT_EXTRA <<< "${SFT_ARGS:-}"
read -r -a PPO_EXTRA <<< "${PPO_ARGS:-}"
read -r -a DPO_EXTRA <<< "${DPO_ARGS:-}"

if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    OUT="${OUT%/}/tiny"
    "$PY" -m text2grad.tiny --dataset ultrafeedback --output_dir "$OUT/world"
    MODEL="$OUT/world/model"
    DATASET="$OUT/world/data/train.jsonl"
    SOURCE=(--feedback_source reference --feedback_source_kwargs '{"reference_field": "chosen"}')
    SFT_DATASET="$DATASET"; DPO_DATASET="$DATASET"
    TINY_PROMPT=(--use_chat_template false)
    SFT_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    PPO_SIZE=(--num_iterations 2 --batch_size 4 --num_mini_batches 2 --num_ppo_epochs 1 --response_length 12
              --dtype auto --gradient_checkpointing false --progress_bar false --overwrite_output_dir true)
    DPO_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    ACCEL_PREFIX="cpu_deepspeed_"
    export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
else
    MODEL="${MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
    DATASET="${DATASET:-data/ultrafeedback/rl.jsonl}"
    REWARD_MODEL="${REWARD_MODEL:-runs/ultrafeedback/reward_model}"
    SOURCE=(--feedback_source reward_model --feedback_source_kwargs "{\"path\": \"$REWARD_MODEL\"}")
    SFT_DATASET="${SFT_DATASET:-data/ultrafeedback/sft.jsonl}"
    DPO_DATASET="${DPO_DATASET:-data/ultrafeedback/rm.jsonl}"
    SFT_SIZE=(); PPO_SIZE=(); DPO_SIZE=(); TINY_PROMPT=()
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
    echo "[train_ultrafeedback] phase: $phase"
    case "$phase" in
        sft)
            "${HF_LAUNCH[@]}" policy_optimization.sft --config configs/ultrafeedback/sft.yaml --model_name_or_path "$MODEL" \
                --dataset_path "$SFT_DATASET" --output_dir "$OUT/sft" "${SFT_DS[@]}" "${TINY_PROMPT[@]}" "${SFT_SIZE[@]}" "${SFT_EXTRA[@]}" ;;
        ppo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${LAUNCH[@]}" policy_optimization.train --config configs/ultrafeedback/ppo.yaml --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/ppo" "${SOURCE[@]}" "${TINY_PROMPT[@]}" "${PPO_SIZE[@]}" "${PPO_EXTRA[@]}" ;;
        dpo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${HF_LAUNCH[@]}" policy_optimization.dpo --config configs/ultrafeedback/dpo.yaml --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DPO_DATASET" --output_dir "$OUT/dpo" "${SFT_DS[@]}" "${TINY_PROMPT[@]}" "${DPO_SIZE[@]}" "${DPO_EXTRA[@]}" ;;
        *) echo "[train_ultrafeedback] unknown phase '$phase' (use sft, ppo, dpo)" >&2; exit 2 ;;
    esac
done
echo "[train_ultrafeedback] done: outputs in $OUT"
