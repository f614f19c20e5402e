#!/usr/bin/env bash
# The embedded default: every Text2Grad phase, offline, on a generated toy task (no GPU, no API key, no download).
#
#   bash scripts/quickstart.sh                         # default preset (~3-4 min on 2 idle CPU cores, ~1.1 GB RAM)
#   bash scripts/quickstart.sh --preset ci             # smoke run
#   TEXT2GRAD_TINY=1 bash scripts/quickstart.sh        # same as --preset ci (what CI runs)
#   bash scripts/quickstart.sh --preset large --output_dir runs/quickstart-large
#   bash scripts/quickstart.sh --preset smollm2       # every phase on the pretrained SmolLM2-135M-Instruct, LoRA (~24 min on 2 CPU cores)
#
# Extra flags go to `python -m text2grad.apps.quickstart` (see its --help), e.g. --sft_model, --reward_model,
# --ppo_iterations 60, --kl_coef 0.1, --ppo_args '["--num_ppo_epochs", "4"]'.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/env.sh" >&2  # install/activate .venv (fast when up to date)
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false

EXTRA=()
if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    EXTRA+=(--preset ci --output_dir "${TINY_DIR:-$(mktemp -d)}/quickstart")
fi
exec "$PY" -m text2grad.apps.quickstart --config configs/quickstart/quickstart.yaml "${EXTRA[@]}" "$@"
