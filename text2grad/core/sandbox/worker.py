"""The harness's side of the pre-started worker: start it, hand it runs, watch and kill them through pidfds.

One worker per unshare command line (the network setting changes it), started on first use, inside the
namespaces, as root, with the bootstrap's imports done (see bootstrap.py). It never runs program code: for
each run it forks the run's init into a fresh PID namespace; the init makes its own mount, IPC and (unless the
run asks for the network) network namespaces and forks the program. The harness gets the init's pidfd, polls it with the program's pipes, and SIGKILLs it
on timeout (the kernel then kills every process of the run's PID namespace). Closing the control socket (our
exit) ends the worker, and with it every run.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .processes import Sink, feed_stdin, kill_run
from .results import parse_events

BOOTSTRAP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")
REPORT_LIMIT = 8 << 20
# What the worker itself sees; each program gets its own environment from its run's spec.
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/",
              "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_DRAIN_GRACE_S = 2.0
_SEND_TIMEOUT_S = 30.0


class WorkerUnavailable(RuntimeError):
    """The worker could not start the run (nothing of the program ran): the caller may start it afresh."""


@dataclass
class RawRun:
    """What a launcher observed; `text2grad.core.sandbox.results` turns it into a verdict."""

    timed_out: bool
    returncode: int | None
    exited: bool
    stdout: str
    stderr: str
    truncated: bool
    events: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0
    leftover_processes: int = 0


class _Worker:
    def __init__(self, prefix: tuple[str, ...]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-I", "-S", "-B", BOOTSTRAP_FILE, "--worker", str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=WORKER_ENV, cwd="/",
                start_new_session=True, pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(_SEND_TIMEOUT_S)  # a wedged worker must not block every caller forever
        self.sock = ours
        self.lock = threading.Lock()

    def submit(self, spec: bytes, fds: list[int]) -> None:
        with self.lock:
            socket.send_fds(self.sock, [spec], fds)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self.sock.close()  # the worker reads EOF and exits; its PID namespace takes every run with it
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_workers: dict[tuple[str, ...], _Worker] = {}
_workers_lock = threading.Lock()


def _worker(prefix: tuple[str, ...], fresh: bool = False) -> _Worker:
    with _workers_lock:
        current = _workers.get(prefix)
        if current is not None and (fresh or not current.alive()):
            current.close()
            current = None
        if current is None:
            current = _workers[prefix] = _Worker(prefix)
        return current


def shutdown_workers() -> None:
    """Stop every worker (at exit; also usable by tests). The next run starts a new one."""
    with _workers_lock:
        for w in _workers.values():
            w.close()
        _workers.clear()


atexit.register(shutdown_workers)


def run_in_worker(prefix: tuple[str, ...], spec: dict[str, Any], *, stdin: str | None, timeout_s: float,
                  max_output_bytes: int, run_id: str, uid: int | None) -> RawRun:
    """Run one spec (see bootstrap.py) in the worker for ``prefix``; raises `WorkerUnavailable` if it could not
    start the run."""
    spec = {**spec, "new_namespaces": bool(prefix), "mount_proc": bool(prefix), "new_network": "--net" in prefix}
    payload = json.dumps(spec).encode()
    stdin_r, stdin_w = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY), None)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    rep_r, rep_w = os.pipe()
    status, status_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours = [out_r, err_r, rep_r]
    start = time.monotonic()
    try:
        try:
            _submit(prefix, payload, [stdin_r, out_w, err_w, rep_w, status_theirs.fileno()])
        finally:
            for fd in (stdin_r, out_w, err_w, rep_w):
                os.close(fd)
            status_theirs.close()
        if stdin_w is not None:
            threading.Thread(target=feed_stdin, args=(stdin_w, stdin.encode("utf-8")), daemon=True).start()
            stdin_w = None
        pidfd = _started(status, prefix, max(30.0, timeout_s))
    except BaseException:
        for fd in ours + ([stdin_w] if stdin_w is not None else []):
            os.close(fd)
        raise
    finally:
        status.close()
    try:
        return _watch(pidfd, ours, start, timeout_s, max_output_bytes, run_id, uid, namespaces=bool(prefix))
    finally:
        os.close(pidfd)


def _submit(prefix: tuple[str, ...], payload: bytes, fds: list[int]) -> None:
    for attempt in range(2):  # a worker that died (killed, or out of memory) is replaced once
        try:
            _worker(prefix, fresh=attempt > 0).submit(payload, fds)
            return
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF) or attempt:
                raise WorkerUnavailable(f"cannot reach the sandbox worker: {exc}") from exc


def _started(status: socket.socket, prefix: tuple[str, ...], wait_s: float) -> int:
    status.settimeout(wait_s)
    try:
        msg, fds, _flags, _addr = socket.recv_fds(status, 4096, 1)
    except (OSError, socket.timeout) as exc:
        _worker(prefix, fresh=True)  # wedged: replace it (its PID namespace takes any half-started run along)
        raise WorkerUnavailable(f"the sandbox worker did not answer: {exc}") from exc
    if msg != b"started" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        reason = msg.decode(errors="replace") or "the worker exited"
        raise WorkerUnavailable(f"the sandbox worker could not start the run ({reason})")
    os.set_inheritable(fds[0], False)  # received fds are inheritable; nothing we spawn may hold the run's init
    return fds[0]


def _watch(pidfd: int, pipes: list[int], start: float, timeout_s: float, max_output_bytes: int, run_id: str,
           uid: int | None, namespaces: bool) -> RawRun:
    """Drain the pipes until the init has exited and every pipe is at EOF; kill at the deadline."""
    out, err, rep = Sink(max_output_bytes), Sink(max_output_bytes), Sink(REPORT_LIMIT)
    sinks = dict(zip(pipes, (out, err, rep)))
    poller = select.poll()
    for fd in [*pipes, pidfd]:
        poller.register(fd, select.POLLIN)
    deadline = start + timeout_s
    exited_at: float | None = None
    timed_out = False
    drain_until = float("inf")
    leftover = 0
    try:
        while sinks or exited_at is None:
            now = time.monotonic()
            if exited_at is None and now >= deadline:
                timed_out = True
                _kill(pidfd, run_id, uid)
                deadline = float("inf")
                drain_until = now + _DRAIN_GRACE_S
            if now >= drain_until:  # something outside the run still holds a pipe, or the init will not die
                leftover = kill_run(None, run_id, uid, by_environ=False)
                break
            until = min(deadline, drain_until)
            wait_ms = None if until == float("inf") else max(0, int((until - now) * 1000) + 1)
            for fd, _event in poller.poll(wait_ms):
                if fd == pidfd:
                    poller.unregister(pidfd)
                    exited_at = time.monotonic()
                    if not namespaces and uid is not None:  # no PID namespace: daemons outlive the init
                        leftover = kill_run(None, run_id, uid, by_environ=False)
                    drain_until = exited_at + _DRAIN_GRACE_S
                    continue
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    sinks[fd].feed(chunk)
                else:
                    poller.unregister(fd)
                    os.close(fd)
                    del sinks[fd]
    finally:
        for fd in sinks:
            os.close(fd)
    duration = (exited_at if exited_at is not None and not timed_out else time.monotonic()) - start
    if uid is not None:  # count (and kill) what is left; with a PID namespace the kernel already did
        leftover = kill_run(None, run_id, uid, by_environ=False)
    stdout, cut_out = out.text()
    stderr, cut_err = err.text()
    events = parse_events(bytes(rep.head))
    exit_event = next((e for e in events if e.get("event") == "exit"), None)
    returncode = exit_event["returncode"] if exit_event else None
    return RawRun(timed_out, returncode, exit_event is not None, stdout, stderr, cut_out or cut_err, events,
                  duration, leftover)


def _kill(pidfd: int, run_id: str, uid: int | None) -> None:
    """SIGKILL the run's init (with a PID namespace: the whole run) and every process of its uid."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if uid is not None:
        kill_run(None, run_id, uid, by_environ=False)
