#!/usr/bin/env bash
# Phase 2 on SLF5K: train the generative reward model (critique + span JSON) on the phase-1 annotations.
#   bash scripts/train_rm_slf5k.sh                               # one device: python -m reward_model.train
#   NUM_GPUS=8 bash scripts/train_rm_slf5k.sh                    # DeepSpeed ZeRO-3 on 8 GPUs
#   NUM_GPUS=8 DS_CONFIG=configs/deepspeed/zero2.json bash scripts/train_rm_slf5k.sh   # ZeRO-2
#   bash scripts/train_rm_slf5k.sh --dataset_path my.jsonl --learning_rate 2e-5          # flags override the YAML
#   TEXT2GRAD_TINY=1 bash scripts/train_rm_slf5k.sh              # offline smoke run: generated tiny model + data
# Settings: configs/slf5k/reward_model.yaml. Output: runs/slf5k/reward_model (adapter, tokenizer, config).
# The body is shared: scripts/_train_rm.sh.
exec bash "$(dirname "${BASH_SOURCE[0]}")/_train_rm.sh" slf5k "$@"
