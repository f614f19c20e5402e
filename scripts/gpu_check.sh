#!/usr/bin/env bash
# A GPU node's check after install (about five minutes on one GPU): versions and the GPU, the default quickstart on
# CUDA timed per stage, the gpu-marked tests, one PPO iteration of Text2Grad and of scalar PPO on a 2.2 B-parameter
# Llama (bf16) with the overhead on the same responses, and vLLM vs transformers where vLLM imports.
#
#   bash scripts/gpu_check.sh                                   # writes runs/gpu_check/gpu_check.{json,log}
#   bash scripts/gpu_check.sh --output_dir runs/gpu_check-h100 --steps '["ppo_1b", "gpu_tests"]' --timeout_scale 2
#
# Exits 2 on a machine without CUDA, 1 when a step failed or ran past its time limit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false
exec "$PY" -m text2grad.apps.gpu_check "$@"
