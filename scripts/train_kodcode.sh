#!/usr/bin/env bash
# KodCode policy phase: NL-Gradient PPO from the instruct model with the trained reward model (the paper does
# no SFT here; PHASES="sft ppo" adds it) [-> DPO baseline on test-built preference pairs].
#
#   bash scripts/train_kodcode.sh                              # real run (configs/kodcode/{sft,ppo,dpo}.yaml)
#   DEEPSPEED=zero3 bash scripts/train_kodcode.sh              # every phase under accelerate + DeepSpeed ZeRO-3
#   PHASES="ppo dpo" DPO_DATASET=runs/kodcode/pairs.jsonl bash scripts/train_kodcode.sh   # + DPO baseline
#   TEXT2GRAD_TINY=1 bash scripts/train_kodcode.sh             # tiny offline model and data (CI smoke test)
#
# Environment: MODEL (base model), REWARD_MODEL (trained reward model dir), DATASET (hub id or file),
# OUT (output root, default runs/kodcode), PHASES (default "ppo"), DPO_DATASET (pass/fail pairs), DEEPSPEED (zero2|zero3),
# ACCELERATE_CONFIG (overrides the accelerate config DEEPSPEED picks), PYTHON, and PPO_ARGS / SFT_ARGS /
# DPO_ARGS (extra flags, e.g. PPO_ARGS="--reward_mode scalar"). In tiny mode the feedback comes from the
# unit tests in the sandbox (feedback_source code_tests, record field "test") and DeepSpeed runs on CPU
# (DS_ACCELERATOR=cpu).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-runs/kodcode}"
PHASES="${PHASES:-ppo}"
read -r -a SFT_EXTRA <<< "${SFT_ARGS:-}"
read -r -a PPO_EXTRA <<< "${PPO_ARGS:-}"
read -r -a DPO_EXTRA <<< "${DPO_ARGS:-}"

if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    OUT="${OUT%/}/tiny"
    "$PY" -m text2grad.tiny --dataset kodcode --output_dir "$OUT/world"
    MODEL="$OUT/world/model"
    DATASET="$OUT/world/data/train.jsonl"
    SOURCE=(--feedback_source code_tests --feedback_source_kwargs '{"tests_field": "test", "timeout_s": 20}')
    TINY_PROMPT=(--use_chat_template false)
    SFT_SIZE=(--use_chat_template false --max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    PPO_SIZE=(--num_iterations 2 --batch_size 4 --num_mini_batches 2 --num_ppo_epochs 1 --response_length 12
              --dtype auto --gradient_checkpointing false --progress_bar false --overwrite_output_dir true)
    DPO_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    ACCEL_PREFIX="cpu_deepspeed_"
    export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
else
    MODEL="${MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
    DATASET="${DATASET:-KodCode/KodCode-Light-RL-10K}"
    REWARD_MODEL="${REWARD_MODEL:-runs/kodcode/reward_model}"
    SOURCE=(--feedback_source reward_model --feedback_source_kwargs "{\"path\": \"$REWARD_MODEL\"}")
    SFT_SIZE=(); PPO_SIZE=(); DPO_SIZE=(); TINY_PROMPT=()
    DPO_DATASET="${DPO_DATASET:-runs/kodcode/pairs.jsonl}"
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
    echo "[train_kodcode] phase: $phase"
    case "$phase" in
        sft)
            "${HF_LAUNCH[@]}" policy_optimization.sft --config configs/kodcode/sft.yaml --model_name_or_path "$MODEL" \
                --dataset_path "$DATASET" --output_dir "$OUT/sft" "${SFT_DS[@]}" "${SFT_SIZE[@]}" "${SFT_EXTRA[@]}" ;;
        ppo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${LAUNCH[@]}" policy_optimization.train --config configs/kodcode/ppo.yaml --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/ppo" "${SOURCE[@]}" "${TINY_PROMPT[@]}" "${PPO_SIZE[@]}" "${PPO_EXTRA[@]}" ;;
        dpo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${HF_LAUNCH[@]}" policy_optimization.dpo --config configs/kodcode/dpo.yaml --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "${DPO_DATASET:?set DPO_DATASET to a JSONL of question/chosen/rejected pairs}" --output_dir "$OUT/dpo" "${SFT_DS[@]}" "${DPO_SIZE[@]}" "${DPO_EXTRA[@]}" ;;
        *) echo "[train_kodcode] unknown phase '$phase' (use sft, ppo, dpo)" >&2; exit 2 ;;
    esac
done
echo "[train_kodcode] done: outputs in $OUT"
