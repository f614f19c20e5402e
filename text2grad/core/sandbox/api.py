"""The public entry points: `run_python`, `run_tests`, and `isolation` (what this machine supports)."""

from __future__ import annotations

import logging
import threading

from .harness import run
from .probe import Isolation, probe_platform
from .results import SandboxResult, TestRunResult

logger = logging.getLogger("text2grad.core.sandbox")

_isolation_lock = threading.Lock()
_isolation_cache: Isolation | None = None
# Checked under the uid switch once per probe: the site import path can be listed and a new interpreter starts.
_UID_PROBE = (
    "import os, subprocess, sys\n"
    "for path in sys.path:\n"
    "    if os.path.isdir(path):\n"
    "        os.listdir(path)\n"
    "subprocess.run([sys.executable, '-I', '-c', 'import json, ctypes'], check=True)\n"
)


def isolation(refresh: bool = False) -> Isolation:
    """Probe (once, cached) which layers this machine supports; ``refresh=True`` probes again."""
    global _isolation_cache
    with _isolation_lock:
        if _isolation_cache is None or refresh:
            iso = probe_platform()
            if iso.drop_uid:  # a file of the interpreter may still be unreadable for others; find out now, not per run
                check = run(iso, kind="script", code=_UID_PROBE, timeout_s=30.0)
                if check.verdict != "passed":
                    note = f"an unprivileged uid cannot run Python here ({check.stderr.strip()[-300:]}); programs run as root"
                    iso = Isolation(iso.unshare_prefix, False, iso.notes + (note,),
                                    iso.worker and bool(iso.unshare_prefix))
            _isolation_cache = iso
            for note in iso.notes:
                logger.warning("sandbox: %s", note)
        return _isolation_cache




def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_output_bytes: int = 64_000,
    max_processes: int = 64,
    max_file_mb: int = 16,
    network: bool = False,
    stdin: str | None = None,
    files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` (``__name__ == "__main__"``) in the sandbox.

    ``files`` are extra files written next to it (relative paths). ``network=True`` keeps the network
    namespace off (the other layers stay). The verdict is "passed" iff the program exits with status 0.
    """
    _check_limits(timeout_s, memory_mb, max_output_bytes, max_processes, max_file_mb)
    return run(
        isolation(),
        kind="script",
        code=code,
        files=files,
        stdin=stdin,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_processes=max_processes,
        max_file_mb=max_file_mb,
        network=network,
    )


def run_tests(
    solution: str,
    tests: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    per_test_timeout_s: float | None = None,
    max_output_bytes: int = 64_000,
    max_processes: int = 64,
    max_file_mb: int = 16,
    network: bool = False,
    files: dict[str, str] | None = None,
) -> TestRunResult:
    """Run the tests in ``tests`` against ``solution`` (saved as solution.py) in the sandbox.

    ``tests`` is a pytest-style module (``from solution import f`` and ``def test_x(): assert ...``; classes
    ``Test*``; ``@pytest.mark.parametrize``; the fixtures ``tmp_path``, ``capsys``, ``monkeypatch`` and
    fixtures defined in the module) or a plain script of asserts (then the script itself is one test named
    ``<module>``). pytest itself is not needed (only if the tests import it). ``timeout_s`` bounds the whole
    run, ``per_test_timeout_s`` each test (SIGALRM inside the runner).
    """
    _check_limits(timeout_s, memory_mb, max_output_bytes, max_processes, max_file_mb)
    if per_test_timeout_s is not None and per_test_timeout_s <= 0:
        raise ValueError(f"per_test_timeout_s must be > 0 or None, got {per_test_timeout_s}")
    return run(
        isolation(),
        kind="tests",
        code=solution,
        tests=tests,
        files=files,
        timeout_s=timeout_s,
        per_test_timeout_s=per_test_timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_processes=max_processes,
        max_file_mb=max_file_mb,
        network=network,
    )


def _check_limits(timeout_s: float, memory_mb: int, max_output_bytes: int, max_processes: int, max_file_mb: int) -> None:
    for name, value, low in (
        ("timeout_s", timeout_s, 0.0),
        ("memory_mb", memory_mb, 32),
        ("max_output_bytes", max_output_bytes, 0),
        ("max_processes", max_processes, 1),
        ("max_file_mb", max_file_mb, 1),
    ):
        if not isinstance(value, (int, float)) or value < low or (name == "timeout_s" and value == 0):
            raise ValueError(f"{name} must be a number >= {low} (timeout_s > 0), got {value!r}")


