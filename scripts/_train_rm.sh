#!/usr/bin/env bash
# Shared by scripts/train_rm_<dataset>.sh (phase 2: train the generative reward model); run, not sourced:
#   bash scripts/_train_rm.sh DATASET [flags for python -m reward_model.train, which override the YAML]
# Environment: NUM_GPUS (>1: DeepSpeed), DS_CONFIG (default configs/deepspeed/zero3.json), HOSTFILE (several
# machines: a DeepSpeed hostfile, see configs/deepspeed/hostfile.example; MASTER_ADDR/MASTER_PORT optional), TEXT2GRAD_TINY=1
# (offline smoke run on a generated tiny model + data, in TINY_DIR or a temp dir), PYTHON.
# Settings: configs/DATASET/reward_model.yaml. Output: runs/DATASET/reward_model (adapter, tokenizer, config).
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bash scripts/_train_rm.sh DATASET [flags] (or bash scripts/train_rm_<dataset>.sh [flags])" >&2
    exit 2
fi
DATASET="$1"; shift
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
cd "$ROOT"

NUM_GPUS="${NUM_GPUS:-1}"
DS_CONFIG="${DS_CONFIG:-configs/deepspeed/zero3.json}"
EXTRA=()
if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    WORK="${TINY_DIR:-$(mktemp -d)}"
    "$PY" -m text2grad.apps.tiny --dataset "$DATASET" --output_dir "$WORK" >/dev/null 2>&1
    EXTRA+=(--model_name_or_path "$WORK/model" --dataset_path "$WORK/annotations.jsonl" --output_dir "$WORK/reward_model"
            --max_steps 2 --save_steps 2 --logging_steps 1 --max_length 512 --per_device_train_batch_size 2
            --bf16 false --gradient_checkpointing false --dtype fp32 --progress_bar false)
fi

if [ -n "${HOSTFILE:-}" ]; then
    # Several machines: the DeepSpeed launcher on machine 0 starts every machine of the hostfile over passwordless
    # ssh (pdsh), with this repository and its .venv at the same path on each, and output_dir on a shared filesystem.
    "$PY" -m deepspeed.launcher.runner --hostfile "$HOSTFILE" ${MASTER_ADDR:+--master_addr "$MASTER_ADDR"} \
        ${MASTER_PORT:+--master_port "$MASTER_PORT"} --module reward_model.train \
        --config "configs/$DATASET/reward_model.yaml" --deepspeed "$DS_CONFIG" "${EXTRA[@]}" "$@"
elif [ "$NUM_GPUS" -gt 1 ]; then
    # DS_ACCELERATOR=cpu runs the same ZeRO path on CPU processes (how CI tests it).
    "$PY" -m deepspeed.launcher.runner --num_gpus "$NUM_GPUS" --module reward_model.train \
        --config "configs/$DATASET/reward_model.yaml" --deepspeed "$DS_CONFIG" "${EXTRA[@]}" "$@"
else
    "$PY" -m reward_model.train --config "configs/$DATASET/reward_model.yaml" "${EXTRA[@]}" "$@"
fi
