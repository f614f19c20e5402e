"""Run untrusted Python (model-generated code, unit tests) in a hardened child process.

Two entry points::

    run_python(code, timeout_s=10, memory_mb=1024)      -> SandboxResult   (a script, its exit status)
    run_tests(solution, tests, timeout_s=10)            -> TestRunResult   (per-test outcomes)

Both return a verdict in {"passed", "failed", "timeout", "crashed", "resource_limit"} and never raise
for anything the program does; they raise only for bad arguments (``ValueError``).

Layers (each run; ``result.layers`` lists the ones that applied)
----------------------------------------------------------------
1. ``tempdir``: a fresh directory (``tempfile.mkdtemp``) is the working directory, ``HOME`` and ``TMPDIR``;
   it is deleted afterwards.
2. ``scrubbed-env``: the child sees only PATH, HOME, TMPDIR, LANG/LC_ALL, thread-count caps and the run id;
   API keys and every other variable of the caller are gone. Python runs with ``-E -s`` (the test runner
   with ``-I -S`` and the import path ``site`` would build), so PYTHON* variables and the user site
   directory are ignored.
3. ``session``: the child starts a new session; on timeout the whole process group is SIGKILLed.
4. ``rlimits``: RLIMIT_CPU (timeout + 1 s), RLIMIT_AS (``memory_mb``), RLIMIT_NPROC (``max_processes``; the
   kernel counts threads too), RLIMIT_FSIZE (``max_file_mb``), RLIMIT_NOFILE (256), RLIMIT_CORE (0);
   ``PR_SET_NO_NEW_PRIVS`` so set-uid binaries cannot raise privileges.
5. ``namespaces`` (``unshare --net --mount --pid --fork --mount-proc --kill-child``, when the ``unshare``
   binary exists and we are root or may create user namespaces): no network (not even loopback: connect
   fails with ENETUNREACH), a PID namespace whose init is our bootstrap (when it exits or is killed, the
   kernel kills every process left in it; ``os.kill`` of the parent cannot reach the caller), and a private
   mount namespace in which /tmp, /var/tmp, /dev/shm and /run/lock are fresh size-limited tmpfs mounts (only
   the run's own directory is bound back), so files the program writes outside its directory vanish with it.
6. ``unprivileged-uid`` (when running as root): the program runs under a uid/gid of its own, drawn at random
   from ``0x70000000 + [0, 2**24)`` and owning nothing but its directory. Root ignores RLIMIT_NPROC; a fresh
   uid makes it count only this run's processes (fork bombs hit the limit), makes the rest of the file system
   read-only to the program (it cannot touch root's files or /etc), and lets the cleanup kill every process
   of that uid. Directories the interpreter needs but that others cannot traverse (e.g. a pyenv Python under
   /root) are replaced by a tmpfs with only those paths bound back, which also hides the rest of /root.
7. ``cleanup``: after the run, every process of the run (process group, uid, run id in its environment) is
   SIGKILLed until none is left; ``result.leftover_processes`` counts survivors (0 in every test).

When a layer is not available
-----------------------------
A warning is logged once (logger ``text2grad.core.sandbox``) and the run continues with the other layers:

* no ``unshare`` binary, or it fails (a container without CAP_SYS_ADMIN and no user namespaces): no network
  isolation (``result.network_isolated`` is False: the program can open sockets), no PID namespace (cleanup
  still kills by process group, uid and run id; a process that calls setsid() and execs with a clean
  environment can escape it when we are not root), and /tmp is shared (the program can create new files in
  world-writable directories).
* not root: no uid switch. RLIMIT_NPROC counts all threads of the calling user, so it is set to their
  current count plus ``max_processes``; the program can read and write whatever the calling user can. With
  user namespaces (``unshare --user --map-root-user``) the network, PID and mount layers still apply.
* root, but the interpreter cannot be made reachable for an unprivileged uid (no mount namespace and a
  Python under a private directory): the program runs as root inside the other layers.

``TEXT2GRAD_SANDBOX_DISABLE=namespaces,setuid`` turns layers off on purpose (for platforms where they
misbehave, and for tests of the degraded paths).

What the sandbox does not promise: the test runner reports results through a private pipe, so nothing the
program prints can forge a verdict, but code running inside the same interpreter as the tests could find that
pipe on purpose; the sandbox protects the machine, not the honesty of a program written to attack its own
grader. Disk use is bounded per file (RLIMIT_FSIZE) and by time, not by a quota; the private tmpfs mounts use
RAM outside RLIMIT_AS (at most ``max(64, 4 * max_file_mb)`` MiB each).
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

__all__ = [
    "Verdict",
    "SandboxResult",
    "TestOutcome",
    "TestRunResult",
    "Isolation",
    "isolation",
    "run_python",
    "run_tests",
]

logger = logging.getLogger("text2grad.core.sandbox")

Verdict = Literal["passed", "failed", "timeout", "crashed", "resource_limit"]

SCRIPT_FILE = "main.py"
_UID_BASE = 0x70000000
_UID_SPAN = 1 << 24
_REPORT_LIMIT = 8 << 20


@dataclass
class SandboxResult:
    """What happened to one program.

    Attributes:
        verdict: "passed" (exit 0), "failed" (non-zero exit, e.g. an exception), "timeout" (wall clock or
            CPU limit), "crashed" (killed by a signal), "resource_limit" (MemoryError, file too large,
            fork refused, ...).
        returncode: the program's exit status; negative = killed by that signal; None if it never exited.
        stdout, stderr: captured output, cut at ``max_output_bytes`` with a "[... truncated ...]" marker.
        duration_s: wall-clock seconds from start to exit (or kill).
        traceback: the last Python traceback on stderr when the program failed, else None.
        network_isolated: True if the program ran in a network namespace with no interfaces up.
        layers: the isolation layers that applied (see the module docstring).
        sandbox_uid: the uid the program ran under (None if it kept ours).
        run_id: random id exported to the program as TEXT2GRAD_SANDBOX_RUN (cleanup looks for it).
        leftover_processes: processes of this run still alive after cleanup (should be 0).
        truncated: True if stdout or stderr was cut.
    """

    verdict: Verdict
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    traceback: str | None
    network_isolated: bool
    layers: tuple[str, ...] = ()
    sandbox_uid: int | None = None
    run_id: str = ""
    leftover_processes: int = 0
    truncated: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"


@dataclass
class TestOutcome:
    """One test function's result.

    Attributes:
        name: the test's name (``test_x``, ``test_x[1]`` for a parametrized case, ``TestCls::test_y``,
            ``<module>`` for a plain assert script, ``<collection>`` when the files could not be imported).
        passed: True only if the test ran to the end without an exception.
        error_type: the exception's class name ("AssertionError", "SystemExit", "Timeout", "ProcessExit"
            when the process died during the test), or None.
        message: the exception message; for a bare ``assert`` the failing source line.
        traceback: the formatted traceback without the runner's own frames.
        solution_lines: line numbers of solution.py in that traceback, outermost first, the line that
            raised last (deduplicated, keeping each line's innermost position).
        verdict: this test's verdict (same set as the run's).
        duration_s: seconds the test took.
    """

    __test__ = False  # not a pytest test class

    name: str
    passed: bool
    error_type: str | None = None
    message: str = ""
    traceback: str = ""
    solution_lines: list[int] = field(default_factory=list)
    verdict: Verdict = "failed"
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "error_type": self.error_type,
            "message": self.message,
            "traceback": self.traceback,
            "solution_lines": list(self.solution_lines),
            "verdict": self.verdict,
            "duration_s": self.duration_s,
        }


@dataclass
class TestRunResult:
    """The outcome of running a test file against a solution.

    ``verdict`` is "passed" only if at least one test ran and all passed; otherwise "timeout" (the run or a
    test ran out of time), "resource_limit", "crashed" (the process died, e.g. ``os._exit`` inside a test),
    or "failed". ``tests`` lists every test in file order, including those the run never reached (marked
    failed, error_type "NotRun").
    """

    __test__ = False

    verdict: Verdict
    tests: list[TestOutcome]
    stdout: str
    stderr: str
    duration_s: float
    returncode: int | None = None
    network_isolated: bool = False
    layers: tuple[str, ...] = ()
    sandbox_uid: int | None = None
    run_id: str = ""
    leftover_processes: int = 0
    truncated: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"

    @property
    def num_passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def first_failure(self) -> TestOutcome | None:
        return next((t for t in self.tests if not t.passed), None)


# --------------------------------------------------------------------------------------------------------------
# What this platform allows (probed once)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Isolation:
    """The isolation layers available on this machine.

    Attributes:
        unshare_prefix: the ``unshare`` command line that creates the namespaces, or () if unavailable.
        drop_uid: run programs under a fresh unprivileged uid (we are root and the interpreter is usable).
        notes: why a layer is missing (also logged once as a warning).
    """

    unshare_prefix: tuple[str, ...]
    drop_uid: bool
    notes: tuple[str, ...] = ()

    @property
    def namespaces(self) -> bool:
        return bool(self.unshare_prefix)


_isolation_lock = threading.Lock()
_isolation_cache: Isolation | None = None


def isolation(refresh: bool = False) -> Isolation:
    """Probe (once, cached) which layers this machine supports; ``refresh=True`` probes again."""
    global _isolation_cache
    with _isolation_lock:
        if _isolation_cache is None or refresh:
            _isolation_cache = _probe_isolation()
            for note in _isolation_cache.notes:
                logger.warning("sandbox: %s", note)
        return _isolation_cache


def _probe_isolation() -> Isolation:
    disabled = {s.strip() for s in os.environ.get("TEXT2GRAD_SANDBOX_DISABLE", "").split(",") if s.strip()}
    unknown = disabled - {"namespaces", "setuid"}
    if unknown:
        raise ValueError(f"TEXT2GRAD_SANDBOX_DISABLE has unknown layer(s) {sorted(unknown)}; use namespaces,setuid")
    notes: list[str] = []
    is_root = os.geteuid() == 0
    prefix: tuple[str, ...] = ()
    unshare = shutil.which("unshare") or ("/usr/bin/unshare" if os.path.exists("/usr/bin/unshare") else None)
    if "namespaces" in disabled:
        notes.append("namespaces disabled by TEXT2GRAD_SANDBOX_DISABLE: programs can use the network and shared /tmp")
    elif not sys.platform.startswith("linux") or unshare is None:
        notes.append("no `unshare` binary (util-linux): programs can use the network, no PID/mount namespace")
    else:
        base = (unshare, "--net", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child")
        candidates = [base] if is_root else [(unshare, "--user", "--map-root-user") + base[1:]]
        for cand in candidates:
            try:
                ok = subprocess.run([*cand, "true"], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                prefix = cand
                break
        if not prefix:
            notes.append(
                "`unshare` cannot create namespaces here (needs root or unprivileged user namespaces): "
                "programs can use the network, no PID/mount namespace"
            )
    drop_uid = False
    if is_root and "setuid" in disabled:
        notes.append("uid switch disabled by TEXT2GRAD_SANDBOX_DISABLE: programs run as root (no RLIMIT_NPROC)")
    elif is_root:
        blocked = _blocked_dirs(_interpreter_paths())
        if blocked and not prefix:
            notes.append(
                f"the interpreter lies under {blocked[0]}, which an unprivileged uid cannot enter, and there is "
                "no mount namespace to expose it: programs run as root (no RLIMIT_NPROC, can write root's files)"
            )
        else:
            drop_uid = True
    elif not is_root:
        notes.append("not running as root: programs keep our uid (they can write what we can write)")
    iso = Isolation(prefix, drop_uid, tuple(notes))
    if drop_uid:  # a file of the interpreter may still be unreadable for others; find out now, not per run
        probe = _run(iso, argv_kind="script", code="import json, ctypes", timeout_s=20.0)
        if probe.verdict != "passed":
            note = f"an unprivileged uid cannot start Python here ({probe.stderr.strip()[-300:]}); programs run as root"
            iso = Isolation(prefix, False, tuple(notes) + (note,))
    return iso


@functools.lru_cache(maxsize=1)
def _site_sys_path() -> list[str] | None:
    """``sys.path`` of ``python -I`` (what `site` builds), computed once; the test runner starts with -S and
    uses it. None if it cannot be computed (the runner then pays for `site` itself)."""
    try:
        out = subprocess.run([sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        paths = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else None


@functools.lru_cache(maxsize=1)
def _interpreter_paths() -> tuple[str, ...]:
    """Paths the child interpreter must reach: the interpreter, its prefixes, sys.path, and this file."""
    paths = {sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths |= {p for p in [*sys.path, *(_site_sys_path() or [])] if p and os.path.isabs(p)}
    return tuple(sorted(p for p in paths if os.path.exists(p)))


def _blocked_dirs(paths: Sequence[str]) -> list[str]:
    """Ancestors of ``paths`` that users other than the owner cannot traverse (no o+x), outermost first."""
    blocked: set[str] = set()
    for path in paths:
        parts = os.path.abspath(path).split(os.sep)[1:]
        cur = ""
        for part in parts[:-1] if not os.path.isdir(path) else parts:
            cur = f"{cur}/{part}"
            try:
                mode = os.stat(cur).st_mode
            except OSError:
                break
            if not mode & 0o001:
                blocked.add(cur)
                break
    return sorted(blocked, key=lambda p: (p.count("/"), p))


# --------------------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------------------


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
    return _run(
        isolation(),
        argv_kind="script",
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
    return _run(
        isolation(),
        argv_kind="tests",
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


# --------------------------------------------------------------------------------------------------------------
# The harness side: start, watch, kill, clean up, decide
# --------------------------------------------------------------------------------------------------------------


class _Capture:
    """Drain a pipe in a thread, keeping the first ``limit`` bytes and counting the rest."""

    def __init__(self, stream, limit: int):
        self.limit, self.head, self.total = limit, bytearray(), 0
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream) -> None:
        try:
            while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else os.read(stream, 1 << 16):
                self.total += len(chunk)
                room = self.limit - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
        except (OSError, ValueError):
            pass
        finally:
            try:
                stream.close() if hasattr(stream, "close") else os.close(stream)
            except OSError:
                pass

    def text(self) -> tuple[str, bool]:
        text = self.head.decode("utf-8", errors="replace")
        if self.total > len(self.head):
            text += f"\n[... truncated {self.total - len(self.head)} of {self.total} bytes by the text2grad sandbox ...]\n"
            return text, True
        return text, False


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


def _own_task_count(uid: int) -> int:
    """Threads of all processes of ``uid`` (what RLIMIT_NPROC counts against)."""
    count = 0
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/status", "rb") as fh:
                count += next((int(line.split()[1]) for line in fh if line.startswith(b"Threads:")), 1)
        except (OSError, ValueError):
            pass
    return count


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _run_processes(run_id: str, uid: int | None) -> list[int]:
    """Pids of processes of this run: running under its uid, or carrying its id in their environment."""
    me, marker = os.getpid(), f"TEXT2GRAD_SANDBOX_RUN={run_id}".encode()
    found = []
    for pid in _pids():
        if pid == me:
            continue
        try:
            if uid is not None and os.stat(f"/proc/{pid}").st_uid == uid:
                with open(f"/proc/{pid}/status", "rb") as fh:
                    if any(line.startswith(b"Uid:") and int(line.split()[1]) == uid for line in fh):
                        found.append(pid)
                        continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(pid)
        except (OSError, ValueError):
            continue
    return found


def _kill_run(pgid: int | None, run_id: str, uid: int | None, deadline_s: float = 5.0) -> int:
    """SIGKILL the process group and every process of the run until none is left; returns survivors."""
    end = time.monotonic() + deadline_s
    while True:
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        alive = [p for p in _run_processes(run_id, uid) if not _is_zombie(p)]
        if not alive:
            return 0
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > end:
            return len(alive)
        time.sleep(0.01)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _rmtree(path: str) -> None:
    def onerror(func, p, exc_info):  # the program may have chmod-ed things to 000
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


@functools.lru_cache(maxsize=1)
def _child_command() -> tuple[str, str]:
    """``(launcher, program)`` for ``python -c launcher program args...``: the program is the child side of this
    module (between its markers); the launcher compiles it under a recognisable file name.

    Loading only that part (standard library, nothing else) keeps the two interpreter starts per run cheap.
    """
    with open(os.path.abspath(__file__), encoding="utf-8") as fh:
        source = fh.read()
    body = source[source.index("\n# >>> child side") : source.index("\n# <<< child side")]
    program = (
        "from __future__ import annotations\nimport errno, json, os, signal, sys, time\n"
        + body
        + "\nsys.exit(_child_main(sys.argv[1:]))\n"
    )
    return f"import sys; exec(compile(sys.argv.pop(1), {_CHILD_FILENAME!r}, 'exec'))", program


def _run(
    iso: Isolation,
    *,
    argv_kind: Literal["script", "tests"],
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
) -> Any:
    """Start one sandboxed run and wait for it; returns a `SandboxResult` ("script") or `TestRunResult` ("tests")."""
    if not isinstance(code, str):
        raise ValueError(f"code/solution must be a str, got {type(code).__name__}")
    run_id = secrets.token_hex(8)
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if iso.drop_uid else None
    workdir = tempfile.mkdtemp(prefix="t2g-sandbox-")
    layers = ["tempdir", "scrubbed-env", "session", "rlimits", "cleanup"]
    proc = None
    try:
        main_file = SCRIPT_FILE if argv_kind == "script" else SOLUTION_FILE
        _write_files(workdir, dict(files or {}))
        _write_files(workdir, {main_file: code} | ({TEST_FILE: tests} if tests is not None else {}))
        if uid is not None:
            for root, dirs, names in os.walk(workdir):
                for name in [root, *(os.path.join(root, n) for n in dirs + names)]:
                    os.chown(name, uid, uid)
            layers.append("unprivileged-uid")
        python = sys.executable
        if argv_kind == "script":
            child_argv = [python, "-B", "-E", "-s", "-u", main_file]
        else:
            site_path = _site_sys_path()
            child_argv = [python, "-B", "-I", *(["-S"] if site_path is not None else []), "-u", "-c", *_child_command(),
                          "--t2g-run-tests",
                          json.dumps({"workdir": workdir, "per_test_timeout_s": per_test_timeout_s, "sys_path": site_path})]
        nproc = max_processes if uid is not None or os.geteuid() == 0 else _own_task_count(os.getuid()) + max_processes
        cpu = int(math.ceil(timeout_s)) + 1
        spec = {
            "argv": child_argv,
            "cwd": workdir,
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
            "hide": [d for d in _HIDDEN_DIRS if os.path.isdir(d)] + (_blocked_dirs(_interpreter_paths()) if uid is not None else []),
            "keep": [workdir, *_interpreter_paths()],
            "tmpfs_mb": max(64, 4 * max_file_mb),
            "pass_report": argv_kind == "tests",
        }
        prefix = list(iso.unshare_prefix)
        if prefix and network:
            prefix.remove("--net")
        network_isolated = bool(prefix) and not network
        if prefix:
            layers.append("namespaces" if network_isolated else "namespaces(no-net)")
        env = {
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
        }
        report_r, report_w = os.pipe()
        spec["report_fd"] = report_w
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [*prefix, python, "-I", "-S", "-B", "-c", *_child_command(), "--t2g-bootstrap", json.dumps(spec)],
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=env,
                start_new_session=True,
                pass_fds=(report_w,),
            )
        except BaseException:
            os.close(report_r)
            raise
        finally:
            os.close(report_w)
        out, err = _Capture(proc.stdout, max_output_bytes), _Capture(proc.stderr, max_output_bytes)
        report = _Capture(report_r, _REPORT_LIMIT)
        if stdin is not None:
            threading.Thread(target=_feed, args=(proc.stdin, stdin.encode("utf-8")), daemon=True).start()
        # A blocking wait in a thread wakes up at exit (Popen.wait(timeout) polls with sleeps of up to 50 ms).
        # WNOWAIT leaves the exited leader a zombie until cleanup is over, so its pid, which is the process group
        # id, cannot be reused by an unrelated group that killpg would then hit.
        waiter = threading.Thread(target=_wait_no_reap, args=(proc.pid,), daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        timed_out = waiter.is_alive()
        if timed_out:
            _kill_run(proc.pid, run_id, uid)
            waiter.join()
        duration = time.monotonic() - start
        leftover = _kill_run(proc.pid, run_id, uid)
        proc.wait()
        for cap in (out, err, report):
            cap.thread.join(timeout=5.0)
        stdout, t1 = out.text()
        stderr, t2 = err.text()
        events = _parse_events(bytes(report.head))
        for ev in events:
            if ev.get("event") == "warning":
                logger.warning("sandbox: %s", ev.get("message"))
        common = dict(
            network_isolated=network_isolated,
            layers=tuple(layers),
            sandbox_uid=uid,
            run_id=run_id,
            leftover_processes=leftover,
            truncated=t1 or t2,
        )
        exit_ev = next((e for e in events if e.get("event") == "exit"), None)
        returncode = exit_ev["returncode"] if exit_ev else (None if timed_out else proc.returncode)
        if argv_kind == "script":
            verdict, tb = _script_verdict(timed_out, exit_ev is not None, returncode, stderr)
            return SandboxResult(verdict, returncode, stdout, stderr, duration, tb, **common)
        verdict, outcomes = _tests_verdict(timed_out, returncode, events)
        return TestRunResult(verdict, outcomes, stdout, stderr, duration, returncode, **common)
    finally:
        if proc is not None and proc.poll() is None:
            _kill_run(proc.pid, run_id, uid)
            proc.wait()
        _rmtree(workdir)


def _wait_no_reap(pid: int) -> None:
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return
        except InterruptedError:
            continue
        except ChildProcessError:
            return


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _parse_events(blob: bytes) -> list[dict[str, Any]]:
    events = []
    for line in blob.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a torn last line from a process killed mid-write
        if isinstance(obj, dict):
            events.append(obj)
    return events


def _signal_verdict(sig: int) -> Verdict:
    if sig == signal.SIGXCPU:
        return "timeout"
    if sig == signal.SIGXFSZ:
        return "resource_limit"
    return "crashed"


def _last_traceback(stderr: str) -> str | None:
    at = stderr.rfind("Traceback (most recent call last):")
    if at < 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        # a SyntaxError in main.py prints no "Traceback" header, only File/caret/Error lines
        if lines and any(ln.lstrip().startswith('File "') for ln in lines) and "Error" in lines[-1]:
            return "\n".join(lines[-6:])
        return None
    return stderr[at:].rstrip()


def _is_resource_error_line(line: str) -> bool:
    line = line.strip()
    if line.startswith("MemoryError"):
        return True
    return any(f"[Errno {code}]" in line for code in _RESOURCE_ERRNOS) and "Error" in line.split(":")[0]


def _script_verdict(timed_out: bool, exited: bool, returncode: int | None, stderr: str) -> tuple[Verdict, str | None]:
    if timed_out:
        # a fork bomb's surviving processes keep forking until the clock runs out; the refused forks say why
        hit_limit = any(_is_resource_error_line(line) for line in stderr.splitlines())
        return ("resource_limit" if hit_limit else "timeout"), _last_traceback(stderr)
    if returncode is None or not exited:
        return "crashed", _last_traceback(stderr)
    if returncode == 0:
        return "passed", None
    if returncode < 0:
        return _signal_verdict(-returncode), _last_traceback(stderr)
    tb = _last_traceback(stderr)
    if tb and _is_resource_error_line(tb.splitlines()[-1]):
        return "resource_limit", tb
    return "failed", tb


def _tests_verdict(timed_out: bool, returncode: int | None, events: list[dict[str, Any]]) -> tuple[Verdict, list[TestOutcome]]:
    outcomes: dict[str, TestOutcome] = {}
    order: list[str] = []
    running: str | None = None
    done = False
    for ev in events:
        kind = ev.get("event")
        if kind == "collected":
            for name in ev.get("names", []):
                if name not in outcomes:
                    order.append(name)
                    outcomes[name] = TestOutcome(name, False, "NotRun", "the run ended before this test started")
        elif kind == "begin":
            running = str(ev.get("name"))
        elif kind == "result":
            try:
                out = TestOutcome(
                    name=str(ev["name"]),
                    passed=bool(ev["passed"]),
                    error_type=ev.get("error_type"),
                    message=str(ev.get("message", "")),
                    traceback=str(ev.get("traceback", "")),
                    solution_lines=[int(n) for n in ev.get("solution_lines", [])],
                    verdict=ev.get("verdict", "passed" if ev["passed"] else "failed"),
                    duration_s=float(ev.get("duration_s", 0.0)),
                )
            except (KeyError, TypeError, ValueError):
                continue
            if out.name not in outcomes:
                order.append(out.name)
            outcomes[out.name] = out
            running = None if running == out.name else running
        elif kind == "done":
            done = True
    if running is not None:
        if timed_out:
            outcomes[running] = TestOutcome(running, False, "Timeout", "the run's time limit expired during this test", verdict="timeout")
        else:
            how = f"signal {-returncode}" if returncode is not None and returncode < 0 else f"exit status {returncode}"
            verdict = _signal_verdict(-returncode) if returncode is not None and returncode < 0 else "crashed"
            outcomes[running] = TestOutcome(running, False, "ProcessExit", f"the test process ended ({how}) during this test", verdict=verdict)
        if running not in order:
            order.append(running)
    tests = [outcomes[n] for n in order]
    if timed_out:
        return "timeout", tests
    if not done:
        if returncode is not None and returncode < 0:
            return _signal_verdict(-returncode), tests
        if not tests:
            tests = [TestOutcome("<runner>", False, "ProcessExit", f"the test runner ended (exit status {returncode}) before reporting", verdict="crashed")]
        return "crashed", tests
    if tests and all(t.passed for t in tests):
        return "passed", tests
    kinds = {t.verdict for t in tests if not t.passed}
    for verdict in ("timeout", "resource_limit", "crashed"):
        if verdict in kinds:
            return verdict, tests  # type: ignore[return-value]
    return "failed", tests


# >>> child side --------------------------------------------------------------------------------------------------
# Everything from here to the end marker also runs, as a ``python -c`` program (`_child_command`), in the
# sandboxed processes:
#   python -I -S -c <launcher> <child program> --t2g-bootstrap <spec>   (root, namespace init: mounts, fork, setuid)
#   python -I -c <launcher> <child program> --t2g-run-tests <args>      (the program's uid: imports and runs tests)
# so it may use only the standard library and names defined in this section.

SOLUTION_FILE = "solution.py"
TEST_FILE = "test_solution.py"
_CHILD_FILENAME = "<text2grad-sandbox>"
_HIDDEN_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_RESOURCE_ERRNOS = (errno.ENOMEM, errno.EFBIG, errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOSPC)


def plan_mounts(hide: Sequence[str], keep: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Which directories to cover with a fresh tmpfs and which paths under each to bind back.

    A directory is hidden unless a kept path is the directory itself or one of its ancestors; kept paths
    inside another kept path are bound with it. Returns ``[(hidden_dir, [kept paths under it]), ...]``,
    outermost directories first.
    """
    keeps = sorted({os.path.normpath(k) for k in keep}, key=len)
    keeps = [k for i, k in enumerate(keeps) if not any(_is_under(k, other) for other in keeps[:i])]
    plan = []
    for h in sorted({os.path.normpath(h) for h in hide}, key=lambda p: (p.count("/"), p)):
        if any(_is_under(h, k) or h == k for k in keeps):
            continue
        plan.append((h, [k for k in keeps if _is_under(k, h)]))
    return plan


def _is_under(path: str, parent: str) -> bool:
    return path != parent and path.startswith(parent.rstrip("/") + "/")


def _child_main(argv: list[str]) -> int:
    mode, arg = argv[0], argv[1]
    if mode == "--t2g-bootstrap":
        return _bootstrap(json.loads(arg))
    if mode == "--t2g-run-tests":
        return _runner(json.loads(arg))
    print(f"text2grad.core.sandbox: unknown child mode {mode!r}", file=sys.stderr)
    return 2


def _report(fd: int, event: dict[str, Any]) -> None:
    data = (json.dumps(event, default=str) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _mount(libc, ctypes, src: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _setup_mounts(spec: dict[str, Any]) -> None:
    """Private mount namespace: hide world-writable and private dirs under tmpfs, bind back what is needed."""
    ctypes, libc = _libc()
    ms_nosuid, ms_nodev, ms_bind, ms_rec, ms_private = 2, 4, 4096, 0x4000, 1 << 18
    _mount(libc, ctypes, None, "/", None, ms_rec | ms_private, None)
    for hidden, kept in plan_mounts(spec["hide"], spec["keep"]):
        fds = [(k, os.open(k, os.O_PATH | os.O_CLOEXEC)) for k in kept if os.path.exists(k)]
        mode = "1777" if hidden in _HIDDEN_DIRS else "0755"
        _mount(libc, ctypes, "tmpfs", hidden, "tmpfs", ms_nosuid | ms_nodev, f"size={spec['tmpfs_mb']}m,nr_inodes=16384,mode={mode}")
        for path, fd in fds:
            try:
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(path, mode=0o755, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                    open(path, "a").close()
                _mount(libc, ctypes, f"/proc/self/fd/{fd}", path, None, ms_bind | ms_rec, None)
            finally:
                os.close(fd)


def _bootstrap(spec: dict[str, Any]) -> int:
    """Namespace init (root when namespaces are on): set up mounts, start the program, report its exit."""
    report_fd = int(spec["report_fd"])
    if spec.get("mount"):
        try:
            _setup_mounts(spec)
        except OSError as exc:
            _report(report_fd, {"event": "warning", "message": f"mount namespace setup failed, /tmp is shared: {exc}"})
    pid = os.fork()
    if pid == 0:
        try:
            _become_program(spec, report_fd)
        except BaseException as exc:  # noqa: BLE001 - anything here means the program could not start
            os.write(2, f"text2grad.core.sandbox: could not start the program: {type(exc).__name__}: {exc}\n".encode())
        os._exit(127)
    while True:  # as PID 1 we also reap orphans; the run ends when the program itself exits
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            _report(report_fd, {"event": "exit", "returncode": code})
            return 0


def _become_program(spec: dict[str, Any], report_fd: int) -> None:
    import resource

    os.chdir(spec["cwd"])
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if spec.get("pass_report"):
        os.dup2(report_fd, 3, inheritable=True)
        if report_fd != 3:
            os.close(report_fd)
    else:
        os.close(report_fd)
    os.closerange(4, 1024)
    try:
        ctypes, libc = _libc()
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: set-uid binaries do not raise privileges
    except OSError:
        pass
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.execve(spec["argv"][0], spec["argv"], dict(os.environ))


# --- the test runner (runs as the program, inside the sandbox) ---------------------------------------------------


class _TestTimeout(BaseException):
    """Raised by SIGALRM when a test exceeds its time limit (BaseException: `except Exception` cannot eat it)."""


def _runner(args: dict[str, Any]) -> int:
    workdir = args["workdir"]
    per_test = args.get("per_test_timeout_s")
    report_fd = 3
    if args.get("sys_path") is not None:
        # started with -S: the import path `site` would have built, without running every .pth file (saves
        # tens of ms per program); site's exit()/quit() builtins are restored because programs call them
        import _sitebuiltins
        import builtins

        sys.path[:] = [p for p in args["sys_path"] if p]
        builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
        builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    sys.path.insert(0, workdir)
    solution_path = os.path.realpath(os.path.join(workdir, SOLUTION_FILE))

    def emit(event: dict[str, Any]) -> None:
        _report(report_fd, event)

    def alarm(signum, frame):
        raise _TestTimeout(f"test exceeded its {per_test} s time limit")

    if per_test:
        signal.signal(signal.SIGALRM, alarm)

    def describe(exc: BaseException) -> dict[str, Any]:
        import traceback as tb_mod  # only failures pay for it

        frames = [f for f in tb_mod.extract_tb(exc.__traceback__) if f.filename != _CHILD_FILENAME]
        lines: list[int] = []
        for f in frames:
            if os.path.realpath(f.filename) == solution_path and f.lineno is not None:
                if f.lineno in lines:
                    lines.remove(f.lineno)
                lines.append(f.lineno)
        if isinstance(exc, SyntaxError) and exc.filename and os.path.realpath(exc.filename) == solution_path and exc.lineno:
            if exc.lineno in lines:
                lines.remove(exc.lineno)
            lines.append(exc.lineno)
        text = "".join(tb_mod.format_list(frames)) if frames else ""
        text = "Traceback (most recent call last):\n" + text + "".join(tb_mod.format_exception_only(type(exc), exc))
        message = str(exc)
        if isinstance(exc, AssertionError) and not message and frames:
            message = (frames[-1].line or "").strip()
        if isinstance(exc, _TestTimeout):
            error_type, verdict = "Timeout", "timeout"
        elif isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS):
            error_type, verdict = type(exc).__name__, "resource_limit"
        else:
            error_type, verdict = type(exc).__name__, "failed"
        return {"passed": False, "error_type": error_type, "message": message[:2000], "traceback": text[-8000:],
                "solution_lines": lines, "verdict": verdict}

    def safe_describe(exc: BaseException) -> dict[str, Any]:
        try:
            return describe(exc)
        except BaseException as inner:  # noqa: BLE001 - e.g. an exception whose __str__ raises
            return {"passed": False, "error_type": type(exc).__name__, "message": f"<unprintable: {type(inner).__name__}>",
                    "traceback": "", "solution_lines": [], "verdict": "failed"}

    def timed(call) -> None:
        if per_test:
            signal.setitimer(signal.ITIMER_REAL, per_test)
        try:
            call()
        finally:
            if per_test:
                signal.setitimer(signal.ITIMER_REAL, 0)

    def run_one(name: str, call) -> None:
        emit({"event": "begin", "name": name})
        t0 = time.monotonic()
        try:
            timed(call)
            result: dict[str, Any] = {"passed": True, "verdict": "passed"}
        except BaseException as exc:  # noqa: BLE001 - per-test isolation: SystemExit and friends fail one test
            result = safe_describe(exc)
        emit({"event": "result", "name": name, "duration_s": time.monotonic() - t0, **result})

    emit({"event": "start"})
    module_name = TEST_FILE[:-3]
    loaded: list[Any] = []
    try:
        timed(lambda: loaded.append(__import__(module_name)))  # the test file sits in workdir, first on sys.path
    except BaseException as exc:  # noqa: BLE001 - a broken solution or test file fails collection, not the runner
        emit({"event": "result", "name": "<collection>", **safe_describe(exc)})
        emit({"event": "done"})
        _flush_and_exit()
    module = loaded[0]
    cases = _collect(module, module_name)
    if not cases:  # a plain assert script: importing it without an error is the test
        emit({"event": "result", "name": "<module>", "passed": True, "verdict": "passed"})
    else:
        emit({"event": "collected", "names": [name for name, _ in cases]})
        for name, call in cases:
            run_one(name, call)
    emit({"event": "done"})
    _flush_and_exit()
    return 0


def _flush_and_exit() -> None:
    # os._exit: threads or atexit handlers left by the program must not hang or change the reported run
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(0)


def _is_function(obj) -> bool:
    return type(obj).__name__ == "function"


def _collect(module, module_name: str) -> list[tuple[str, Any]]:
    """Test cases in file order: ``test*`` functions of the module, ``Test*`` classes' ``test*`` methods."""
    cases: list[tuple[str, Any]] = []
    for name, obj in list(vars(module).items()):
        if name.startswith("test") and _is_function(obj) and obj.__module__ == module_name:
            cases.extend(_expand(name, obj, module, None))
        elif name.startswith("Test") and isinstance(obj, type) and obj.__module__ == module_name and "__init__" not in vars(obj):
            for meth_name, meth in list(vars(obj).items()):
                if meth_name.startswith("test") and _is_function(meth):
                    cases.extend(_expand(f"{name}::{meth_name}", meth, module, obj))
    return cases


def _expand(name: str, fn, module, cls) -> list[tuple[str, Any]]:
    """One case per parametrize combination; fixtures are resolved when the case runs."""
    combos: list[dict[str, Any]] = [{}]
    for mark in reversed(getattr(fn, "pytestmark", [])):
        if getattr(mark, "name", None) != "parametrize":
            continue
        argnames, argvalues = mark.args[0], mark.args[1]
        names = [a.strip() for a in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
        rows = []
        for value in argvalues:
            if hasattr(value, "values") and hasattr(value, "marks"):  # pytest.param(...)
                value = tuple(value.values)
            elif len(names) == 1:
                value = (value,)
            rows.append(dict(zip(names, value)))
        combos = [{**c, **r} for c in combos for r in rows]
    out = []
    for i, params in enumerate(combos):
        label = f"{name}[{i}]" if len(combos) > 1 or params else name
        out.append((label, lambda fn=fn, params=params: _call_test(fn, params, module, cls)))
    return out


def _required_params(fn, skip_first: bool = False) -> list[str]:
    """Names of ``fn``'s parameters without defaults (pytest asks fixtures only for those)."""
    code = fn.__code__
    positional = list(code.co_varnames[: code.co_argcount])
    positional = positional[: len(positional) - len(fn.__defaults__ or ())]
    kwonly = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    names = positional + [k for k in kwonly if k not in (fn.__kwdefaults__ or {})]
    return names[1:] if skip_first else names


def _call_test(fn, params: dict[str, Any], module, cls) -> None:
    teardowns: list[Any] = []
    try:
        target = fn
        if cls is not None:
            instance = cls()
            if hasattr(instance, "setup_method"):
                instance.setup_method(fn)
                teardowns.append(lambda: instance.teardown_method(fn) if hasattr(instance, "teardown_method") else None)
            target = fn.__get__(instance, cls)
        kwargs = {}
        for pname in _required_params(fn, skip_first=cls is not None):
            kwargs[pname] = params[pname] if pname in params else _fixture(pname, module, teardowns)
        target(**kwargs)
    finally:
        for td in reversed(teardowns):
            td()


def _fixture(name: str, module, teardowns: list[Any]) -> Any:
    """The few pytest fixtures generated tests use, plus fixtures defined in the test module."""
    if name in ("tmp_path", "tmpdir"):
        import pathlib
        import tempfile

        path = pathlib.Path(tempfile.mkdtemp(dir=os.getcwd(), prefix="tmp_path-"))
        return path if name == "tmp_path" else str(path)
    if name in ("capsys", "capfd"):
        cap = _Capsys()
        teardowns.append(cap.stop)
        return cap
    if name == "monkeypatch":
        try:
            from _pytest.monkeypatch import MonkeyPatch
        except ImportError:
            raise LookupError("fixture 'monkeypatch' needs pytest installed in the sandbox's interpreter") from None
        mp = MonkeyPatch()
        teardowns.append(mp.undo)
        return mp
    obj = getattr(module, name, None)
    if obj is not None:
        func = getattr(obj, "_get_wrapped_function", None)
        func = func() if callable(func) else getattr(getattr(obj, "__pytest_wrapped__", None), "obj", None)
        if func is not None:
            kwargs = {p: _fixture(p, module, teardowns) for p in _required_params(func)}
            value = func(**kwargs)
            if type(value).__name__ == "generator":
                gen = value
                value = next(gen)
                teardowns.append(lambda: next(gen, None))
            return value
    raise LookupError(f"fixture {name!r} is not available in the text2grad test runner")


class _Capsys:
    """A minimal capsys: swaps sys.stdout/err for StringIO; readouterr() returns and clears what was written."""

    def __init__(self):
        import collections
        import io

        self._io = io
        self._result = collections.namedtuple("CaptureResult", ["out", "err"])
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()

    def readouterr(self):
        out, err = sys.stdout.getvalue(), sys.stderr.getvalue()
        sys.stdout, sys.stderr = self._io.StringIO(), self._io.StringIO()
        return self._result(out, err)

    def stop(self) -> None:
        sys.stdout, sys.stderr = self._saved


# <<< child side ---------------------------------------------------------------------------------------------------
