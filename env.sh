#!/usr/bin/env bash
# Creates .venv and installs text2grad with its dependencies. Idempotent: a second run only checks.
#
#   bash env.sh                  # CPU machine: torch 2.13.0 CPU wheel first, so no CUDA wheels are pulled
#   TORCH_SPEC="torch==2.13.0" TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash env.sh   # a CUDA torch
#   TEXT2GRAD_EXTRAS=test,offline-eval,vllm bash env.sh   # choose extras (default: test,offline-eval)
#   VENV=/path/to/venv bash env.sh                        # another venv location
#
# Source it (`source env.sh`) to also activate the venv in your shell.
_t2g_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-$_t2g_root/.venv}"

# The install runs in a subshell with strict error handling, so `source env.sh` never changes your shell's options.
(
set -euo pipefail
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${TEXT2GRAD_EXTRAS:-test,offline-eval}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[env.sh] creating virtual environment in $VENV"
    "$PYTHON" -m venv "$VENV"
fi
_py="$VENV/bin/python"
# pip, minus the noise some machines' pip configs add about missing local index folders
_pip() { "$_py" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }

# The stamp records what was installed; if pyproject.toml, the torch spec and the extras are unchanged, skip.
_stamp="$VENV/.text2grad-installed"
_want="$(cat "$_t2g_root/pyproject.toml" | sha256sum | cut -c1-16) $TORCH_SPEC $EXTRAS ${TORCH_INDEX_URL:-}"
if [ -f "$_stamp" ] && [ "$(cat "$_stamp")" = "$_want" ] && "$_py" -c "import text2grad" 2>/dev/null; then
    echo "[env.sh] $VENV is up to date"
else
    _pip install --quiet --upgrade pip
    if ! "$_py" -c "import torch" 2>/dev/null; then
        echo "[env.sh] installing $TORCH_SPEC"
        if [ -n "${TORCH_INDEX_URL:-}" ]; then
            _pip install --quiet "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"
        else
            _pip install --quiet "$TORCH_SPEC"
        fi
    fi
    echo "[env.sh] installing text2grad[$EXTRAS] (editable)"
    _pip install --quiet -e "$_t2g_root[$EXTRAS]"
    echo "$_want" > "$_stamp"
fi
) || { echo "[env.sh] setting up $VENV failed" >&2; return 1 2>/dev/null || exit 1; }

# Offline by default: the hub is not reachable on CI machines; real users unset these to download models.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
export PATH="$VENV/bin:$PATH"
