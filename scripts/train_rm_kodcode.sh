#!/usr/bin/env bash
# Phase 2 on KodCode: train the generative reward model (critique + span JSON) on the phase-1 annotations.
#   bash scripts/train_rm_kodcode.sh                               # one device: python -m reward_model.train
#   NUM_GPUS=8 bash scripts/train_rm_kodcode.sh                    # DeepSpeed ZeRO-3 on 8 GPUs
#   NUM_GPUS=8 DS_CONFIG=configs/deepspeed/zero2.json bash scripts/train_rm_kodcode.sh   # ZeRO-2
#   bash scripts/train_rm_kodcode.sh --train_file my.jsonl --learning_rate 2e-5          # flags override the YAML
#   TEXT2GRAD_TINY=1 bash scripts/train_rm_kodcode.sh              # offline smoke run: generated tiny model + data
# Settings: configs/kodcode/reward_model.yaml. Output: runs/kodcode/reward_model (adapter, tokenizer, config).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
cd "$ROOT"

DATASET=kodcode
NUM_GPUS="${NUM_GPUS:-1}"
DS_CONFIG="${DS_CONFIG:-configs/deepspeed/zero3.json}"
EXTRA=()
if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    WORK="${TINY_DIR:-$(mktemp -d)}"
    "$PY" -m text2grad.tiny --dataset "$DATASET" --output_dir "$WORK" >/dev/null 2>&1
    EXTRA+=(--model_name_or_path "$WORK/model" --train_file "$WORK/annotations.jsonl" --output_dir "$WORK/reward_model"
            --max_steps 2 --save_steps 2 --logging_steps 1 --max_length 512 --per_device_train_batch_size 2
            --bf16 false --gradient_checkpointing false --dtype fp32 --disable_tqdm true)
fi

if [ "$NUM_GPUS" -gt 1 ]; then
    # DS_ACCELERATOR=cpu runs the same ZeRO path on CPU processes (how CI tests it).
    "$PY" -m deepspeed.launcher.runner --num_gpus "$NUM_GPUS" --module reward_model.train \
        --config "configs/$DATASET/reward_model.yaml" --deepspeed "$DS_CONFIG" "${EXTRA[@]}" "$@"
else
    "$PY" -m reward_model.train --config "configs/$DATASET/reward_model.yaml" "${EXTRA[@]}" "$@"
fi
