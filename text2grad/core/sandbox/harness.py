"""The harness: prepare one run (directory, files, uid, limits, environment), launch it, decide its verdict.

Two launchers, same layers, same spec (see bootstrap.py):

* the pre-started worker (worker.py), when ``Isolation.worker``: the program is forked from an interpreter
  that has already started, inside the namespaces;
* a fresh ``unshare ... python -I -S -B bootstrap.py --once SPEC`` per run (the fallback): used when pidfds
  are missing, when neither a PID namespace nor the uid switch can account for a run's processes (the run id
  in each process's environment then does, which needs a fresh exec), when ``TEXT2GRAD_SANDBOX_DISABLE``
  contains ``worker``, or for one run after the worker failed to start it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Literal

from .bootstrap import HIDDEN_DIRS
from .probe import Isolation, blocked_dirs, interpreter_paths, site_sys_path
from .processes import Capture, feed_stdin, kill_run, own_task_count
from .results import SandboxResult, TestRunResult, parse_events, script_verdict, tests_verdict
from .runner import SOLUTION_FILE, TEST_FILE
from .worker import BOOTSTRAP_FILE, REPORT_LIMIT, RawRun, WorkerUnavailable, run_in_worker

logger = logging.getLogger("text2grad.core.sandbox")

SCRIPT_FILE = "main.py"
_UID_BASE = 0x70000000
_UID_SPAN = 1 << 24
_warned_fallback = threading.Event()


def run(
    iso: Isolation,
    *,
    kind: Literal["script", "tests"],
    code: str,
    tests: str | None = None,
    files: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout_s: float = 10.0,
    per_test_timeout_s: float | None = None,
    memory_mb: int = 1024,
    max_output_bytes: int = 64_000,
    max_processes: int = 64,
    max_file_mb: int = 16,
    network: bool = False,
) -> SandboxResult | TestRunResult:
    """Start one sandboxed run and wait for it; a `SandboxResult` ("script") or a `TestRunResult` ("tests")."""
    if not isinstance(code, str):
        raise ValueError(f"code/solution must be a str, got {type(code).__name__}")
    run_id = secrets.token_hex(8)
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if iso.drop_uid else None
    workdir = tempfile.mkdtemp(prefix="t2g-sandbox-")
    layers = ["tempdir", "scrubbed-env", "session", "rlimits", "cleanup"]
    try:
        main_file = SCRIPT_FILE if kind == "script" else SOLUTION_FILE
        _write_files(workdir, dict(files or {}))
        _write_files(workdir, {main_file: code} | ({TEST_FILE: tests} if tests is not None else {}))
        if uid is not None:
            for root, dirs, names in os.walk(workdir):
                for name in [root, *(os.path.join(root, n) for n in dirs + names)]:
                    os.chown(name, uid, uid)
            layers.append("unprivileged-uid")
        prefix = list(iso.unshare_prefix)
        if prefix and network:
            prefix.remove("--net")
        network_isolated = bool(prefix) and not network
        if prefix:
            layers.append("namespaces" if network_isolated else "namespaces(no-net)")
        spec = _spec(kind, workdir, main_file, uid, run_id, iso, timeout_s, per_test_timeout_s, memory_mb,
                     max_processes, max_file_mb)
        raw, launcher = None, "worker"
        if iso.worker:
            try:
                raw = run_in_worker(tuple(prefix), spec, stdin=stdin, timeout_s=timeout_s,
                                    max_output_bytes=max_output_bytes, run_id=run_id, uid=uid)
            except WorkerUnavailable as exc:
                if not _warned_fallback.is_set():
                    _warned_fallback.set()
                    logger.warning("sandbox: %s; starting a fresh interpreter for the run instead", exc)
        if raw is None:
            raw, launcher = _run_fresh(prefix, spec, stdin, timeout_s, max_output_bytes, run_id, uid), "fresh"
        for ev in raw.events:
            if ev.get("event") == "warning":
                logger.warning("sandbox: %s", ev.get("message"))
        common = dict(network_isolated=network_isolated, layers=tuple(layers), sandbox_uid=uid, run_id=run_id,
                      leftover_processes=raw.leftover_processes, truncated=raw.truncated, launcher=launcher)
        if kind == "script":
            verdict, tb = script_verdict(raw.timed_out, raw.exited, raw.returncode, raw.stderr)
            return SandboxResult(verdict, raw.returncode, raw.stdout, raw.stderr, raw.duration_s, tb, **common)
        verdict, outcomes = tests_verdict(raw.timed_out, raw.returncode, raw.events)
        return TestRunResult(verdict, outcomes, raw.stdout, raw.stderr, raw.duration_s, raw.returncode, **common)
    finally:
        _rmtree(workdir)


def _spec(kind: str, workdir: str, main_file: str, uid: int | None, run_id: str, iso: Isolation, timeout_s: float,
          per_test_timeout_s: float | None, memory_mb: int, max_processes: int, max_file_mb: int) -> dict[str, Any]:
    """Everything the bootstrap needs for one run (JSON)."""
    nproc = max_processes if uid is not None or os.geteuid() == 0 else own_task_count(os.getuid()) + max_processes
    cpu = int(math.ceil(timeout_s)) + 1
    hide = [d for d in HIDDEN_DIRS if os.path.isdir(d)]
    expose = blocked_dirs(interpreter_paths()) if uid is not None else []  # folders the uid could not enter
    return {
        "kind": kind,
        "cwd": workdir,
        "script": os.path.join(workdir, main_file) if kind == "script" else None,
        "runner": {"workdir": workdir, "per_test_timeout_s": per_test_timeout_s},
        "uid": uid,
        "rlimits": {
            "RLIMIT_CPU": [cpu, cpu + 1],
            "RLIMIT_AS": [memory_mb << 20] * 2,
            "RLIMIT_NPROC": [nproc] * 2,
            "RLIMIT_FSIZE": [max_file_mb << 20] * 2,
            "RLIMIT_NOFILE": [256, 256],
            "RLIMIT_CORE": [0, 0],
        },
        "mount": iso.namespaces,
        "hide": hide,
        "expose": expose,
        "keep": [workdir, *interpreter_paths()],
        "tmpfs_mb": max(64, 4 * max_file_mb),
        "sys_path": site_sys_path(),
        "env": {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TEXT2GRAD_SANDBOX_RUN": run_id,
        },
    }


def _run_fresh(prefix: list[str], spec: dict[str, Any], stdin: str | None, timeout_s: float, max_output_bytes: int,
               run_id: str, uid: int | None) -> RawRun:
    """One run in a fresh ``python bootstrap.py --once`` (under ``unshare`` when namespaces are on); its
    environment carries the run id, so cleanup finds every process of the run even without uid or PID
    namespace, unless one execs with a clean environment after leaving the session (documented)."""
    report_r, report_w = os.pipe()
    spec = {**spec, "report_fd": report_w}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-I", "-S", "-B", BOOTSTRAP_FILE, "--once", json.dumps(spec)],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=spec["cwd"],
            env=spec["env"],
            start_new_session=True,
            pass_fds=(report_w,),
        )
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)
    try:
        out, err = Capture(proc.stdout, max_output_bytes), Capture(proc.stderr, max_output_bytes)
        report = Capture(report_r, REPORT_LIMIT)
        if stdin is not None:
            threading.Thread(target=feed_stdin, args=(proc.stdin, stdin.encode("utf-8")), daemon=True).start()
        # A blocking wait in a thread wakes up at exit (Popen.wait(timeout) polls with sleeps of up to 50 ms).
        # WNOWAIT leaves the exited leader a zombie until cleanup is over, so its pid, which is the process group
        # id, cannot be reused by an unrelated group that killpg would then hit.
        waiter = threading.Thread(target=_wait_no_reap, args=(proc.pid,), daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        timed_out = waiter.is_alive()
        if timed_out:
            kill_run(proc.pid, run_id, uid)
            waiter.join()
        duration = time.monotonic() - start
        leftover = kill_run(proc.pid, run_id, uid)
        proc.wait()
        for cap in (out, err, report):
            cap.thread.join(timeout=5.0)
    finally:
        if proc.poll() is None:
            kill_run(proc.pid, run_id, uid)
            proc.wait()
    stdout, cut_out = out.text()
    stderr, cut_err = err.text()
    events = parse_events(bytes(report.head))
    exit_event = next((e for e in events if e.get("event") == "exit"), None)
    returncode = exit_event["returncode"] if exit_event else (None if timed_out else proc.returncode)
    return RawRun(timed_out, returncode, exit_event is not None, stdout, stderr, cut_out or cut_err, events,
                  duration, leftover)


def _wait_no_reap(pid: int) -> None:
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return
        except InterruptedError:
            continue
        except ChildProcessError:
            return


def _write_files(workdir: str, files: dict[str, str]) -> None:
    for name, content in files.items():
        if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
            raise ValueError(f"files: {name!r} must be a relative path inside the sandbox directory (no '..')")
        if not isinstance(content, str):
            raise ValueError(f"files[{name!r}] must be a str, got {type(content).__name__}")
        path = os.path.join(workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(content)


def _rmtree(path: str) -> None:
    def onerror(func, p, exc_info):  # the program may have chmod-ed things to 000
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)
