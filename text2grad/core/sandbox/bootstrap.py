"""The child side of the sandbox, run BY PATH with the standard library only.

    python -I -S -B bootstrap.py --worker CONTROL_FD     a pre-started worker (inside the namespaces, as root)
    python -I -S -B bootstrap.py --once SPEC_JSON        one run in a fresh interpreter (the fallback)

Process tree of one run started by the worker (``--once`` skips the first box: its own process is the
run's init)::

    worker (PID 1 of the worker's namespaces; single-threaded; never runs program code)
      │  setns(own PID ns) + unshare(CLONE_NEWPID), fork, send the init's pidfd to the harness
      └─ init: PID 1 of the run's own PID namespace; unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET); tmpfs
         │  /tmp etc., fresh /proc; waits for the program, reports its exit status
         └─ program: new session, rlimits, no_new_privs, fresh uid, scrubbed env, runs the code

The program is a fork of the worker's interpreter (imports done once), not a new interpreter: it resets the
interpreter state a fresh ``python -u main.py`` would have (std streams, signals, ``__main__``, ``sys.path``,
``sys.argv``, environment) before the code runs, and exits with ``os._exit`` after atexit handlers and
non-daemon threads, so nothing of the worker runs after the program.

It is imported by the harness too (as ``text2grad.core.sandbox.bootstrap``) for ``plan_mounts`` and the
constants, so importing it has no side effects.
"""

from __future__ import annotations

import _sitebuiltins
import atexit
import builtins
import ctypes
import importlib
import importlib.util
import io
import json
import os
import resource
import select
import signal
import socket
import sys
import traceback
import types
from typing import Any, Sequence

HIDDEN_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
RUNNER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
# Imported once by the worker so that programs do not pay for them: what generated code imports most.
PRELOADED_MODULES = ("typing", "re", "math", "collections", "itertools", "functools", "heapq", "bisect",
                     "string", "random", "copy", "dataclasses", "hashlib")

_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 0x4000, 1 << 18


def plan_mounts(hide: Sequence[str], keep: Sequence[str], expose: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """Which directories to cover with a fresh tmpfs and which paths under each to bind back.

    A ``hide`` directory is covered unless a kept path is the directory itself or one of its ancestors; kept
    paths inside another kept path are bound with it. An ``expose`` directory (one the program's uid cannot
    enter, on the way to a kept path) is covered even inside a kept path, unless it is kept itself: its tmpfs
    can be entered and shows only the kept paths under it, so nothing the uid could reach before is lost (a
    venv behind a symlink, in a private folder under the caller's script folder). Returns
    ``[(dir, [kept paths under it]), ...]``, outermost directories first.
    """
    every_keep = sorted({os.path.normpath(k) for k in keep}, key=len)
    keeps = _outermost(every_keep)
    exposed = {os.path.normpath(e) for e in expose}
    plan = []
    for h in sorted({os.path.normpath(h) for h in hide} | exposed, key=lambda p: (p.count("/"), p)):
        if h in every_keep:
            continue
        if h in exposed:
            plan.append((h, _outermost([k for k in every_keep if _is_under(k, h)])))
        elif not any(_is_under(h, k) for k in keeps):
            plan.append((h, [k for k in keeps if _is_under(k, h)]))
    return plan


def _outermost(paths: Sequence[str]) -> list[str]:
    """``paths`` (sorted by length) without those inside another of them."""
    return [p for i, p in enumerate(paths) if not any(_is_under(p, other) for other in paths[:i])]


def _is_under(path: str, parent: str) -> bool:
    return path != parent and path.startswith(parent.rstrip("/") + "/")


# --- small system helpers -----------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc: ctypes.CDLL, src: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _setup_mounts(spec: dict[str, Any]) -> None:
    """Private mount namespace: hide world-writable and private dirs under tmpfs, bind back what is needed."""
    libc = _libc()
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
    for hidden, kept in plan_mounts(spec["hide"], spec["keep"], spec.get("expose", ())):
        fds = [(k, os.open(k, os.O_PATH | os.O_CLOEXEC)) for k in kept if os.path.exists(k)]
        mode = "1777" if hidden in HIDDEN_DIRS else "0755"
        _mount(libc, "tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={spec['tmpfs_mb']}m,nr_inodes=16384,mode={mode}")
        for path, fd in fds:
            try:
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(path, mode=0o755, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                    open(path, "a").close()
                _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
            finally:
                os.close(fd)
    if spec.get("mount_proc"):  # this process is PID 1 of a new PID namespace: /proc must show that namespace
        _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)


# --- the pre-started worker ---------------------------------------------------------------------------------


def worker_main(control_fd: int) -> int:
    """Serve runs until the harness closes the control socket. Each request: a JSON spec and five fds
    (stdin, stdout, stderr, report, status). Requests are handled one at a time, so a run's init inherits no
    other run's fds. The worker never runs program code."""
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    runner = _load_runner()
    control = socket.socket(fileno=control_fd)
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans (without a PID namespace) come to us
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    while True:
        _reap()
        ready, _, _ = select.select([control], [], [], 1.0)
        if not ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(control, 1 << 20, 8)
        except OSError:
            return 1
        if not msg:
            return 0  # the harness went away: exiting kills every run (PID 1 of the worker's namespace)
        if len(fds) != 5:
            for fd in fds:
                os.close(fd)
            continue
        try:
            spec = json.loads(msg)
            _start_run(spec, fds, own_pid_ns, control, runner)
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the worker
            _status(fds[4], f"error: {type(exc).__name__}: {exc}")
        finally:
            for fd in fds:
                os.close(fd)


def _start_run(spec: dict[str, Any], fds: list[int], own_pid_ns: int, control: socket.socket,
               runner: types.ModuleType) -> None:
    """Fork the run's init (PID 1 of a fresh PID namespace when namespaces are on); hand its pidfd to the harness."""
    if spec.get("new_namespaces"):
        # unshare(CLONE_NEWPID) works once per PID namespace of our children: step back into our own first
        _check(_libc().setns(own_pid_ns, _CLONE_NEWPID), "setns")
        _check(_libc().unshare(_CLONE_NEWPID), "unshare")
    pid = os.fork()
    if pid == 0:
        code = 127
        try:
            control.close()
            os.close(own_pid_ns)
            os.close(fds[4])
            if spec.get("new_namespaces"):  # our own mounts (private tmpfs, /proc), SysV IPC and (empty) network
                flags = _CLONE_NEWNS | _CLONE_NEWIPC | (_CLONE_NEWNET if spec.get("new_network") else 0)
                _check(_libc().unshare(flags), "unshare")
            code = run_init(spec, (fds[0], fds[1], fds[2]), fds[3], runner)
        except BaseException as exc:  # noqa: BLE001 - never fall back into the worker's loop
            os.write(fds[2], f"text2grad.core.sandbox: the run's init failed: {type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(code)
    try:
        pidfd = os.pidfd_open(pid)  # our unreaped child (we reap only in _reap): alive or a zombie, never a reused pid
    except OSError:
        os.kill(pid, signal.SIGKILL)  # the harness cannot hold it, so it must not run
        raise
    try:
        _status(fds[4], "started", [pidfd])
    finally:
        os.close(pidfd)


def _reap() -> None:
    """Collect exited inits (and orphans adopted as PID 1 / subreaper) without blocking."""
    while True:
        try:
            pid, _status_code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _status(fd: int, text: str, fds: Sequence[int] = ()) -> None:
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            socket.send_fds(sock, [text.encode()], list(fds))
    except OSError:
        pass


# --- the run's init and the program -------------------------------------------------------------------------


def run_init(spec: dict[str, Any], stdio: tuple[int, int, int], report_fd: int, runner: types.ModuleType) -> int:
    """Init of the run (root; PID 1 when namespaces are on): mounts, fork the program, report its exit."""
    if spec.get("mount"):
        try:
            _setup_mounts(spec)
        except OSError as exc:
            runner.report(report_fd, {"event": "warning", "message": f"mount namespace setup failed, /tmp is shared: {exc}"})
    pid = os.fork()
    if pid == 0:
        try:
            _become_program(spec, stdio, report_fd, runner)
        except BaseException as exc:  # noqa: BLE001 - anything here means the program could not start
            os.write(2, f"text2grad.core.sandbox: could not start the program: {type(exc).__name__}: {exc}\n".encode())
        os._exit(127)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in range(3):  # only the program holds its pipes: they reach EOF when its processes are gone
        os.dup2(devnull, fd)
    for fd in {*stdio} - {0, 1, 2}:
        os.close(fd)
    while True:  # as PID 1 we also reap orphans; the run ends when the program itself exits
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if done == pid:
            runner.report(report_fd, {"event": "exit", "returncode": os.waitstatus_to_exitcode(status)})
            return 0


def _become_program(spec: dict[str, Any], stdio: tuple[int, int, int], report_fd: int, runner: types.ModuleType) -> None:
    os.setsid()
    os.chdir(spec["cwd"])
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    # what a fresh interpreter sets up: BrokenPipeError and EFBIG instead of death by signal, KeyboardInterrupt
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(stdio):
        if fd != target:
            os.dup2(fd, target)
    keep_report = spec["kind"] == "tests"
    if keep_report and report_fd != 3:
        os.dup2(report_fd, 3)
    os.closerange(4 if keep_report else 3, 1 << 16)
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    try:
        _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # set-uid binaries do not raise privileges
    except (OSError, AttributeError):  # not Linux: no prctl
        pass
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.environ.clear()
    os.environ.update(spec["env"])
    _fresh_interpreter_state(spec)
    if spec["kind"] == "tests":
        runner.run_tests_main(spec["runner"], report_fd=3, own_files=(os.path.abspath(__file__), RUNNER_FILE))
    else:
        _run_script(spec["script"])


def _fresh_interpreter_state(spec: dict[str, Any]) -> None:
    """What ``python -u`` gives a program: unbuffered UTF-8 std streams on fds 0-2, the site import path, the
    exit/quit/help builtins, default hooks, and ``sys.argv``."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", write_through=True)
    sys.path[:] = [spec["cwd"], *[p for p in spec["sys_path"] if p]]
    sys.argv[:] = [spec.get("script") or "-c"]
    sys.excepthook, sys.displayhook = sys.__excepthook__, sys.__displayhook__
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()


def _run_script(path: str) -> None:
    """Run ``path`` as ``__main__`` and exit the way CPython would (status, traceback, atexit, threads)."""
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(path, "rb") as fh:
            source = fh.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as exc:
        code = _exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - the program's uncaught exception, printed as CPython does
        code = 1
        _print_uncaught(exc)
        if isinstance(exc, KeyboardInterrupt):
            code = -signal.SIGINT
    code = _shutdown(code)
    if code == -signal.SIGINT:  # CPython dies by SIGINT after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_status(exc: SystemExit) -> int:
    value = exc.code
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _print_uncaught(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # our frames are not the program's
    exc.__traceback__ = tb  # CPython's hook prints the exception's own traceback, not its argument
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:  # noqa: BLE001 - a broken hook: print it plainly
        traceback.print_exception(type(exc), exc, tb)


def _shutdown(code: int) -> int:
    """Join non-daemon threads, run atexit handlers, flush; 120 if flushing fails (CPython's rule)."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            code = 120 if code == 0 else code
    return code


def _load_runner() -> types.ModuleType:
    """runner.py next to this file, under a name no program would import by accident."""
    spec = importlib.util.spec_from_file_location("text2grad_sandbox_runner", RUNNER_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--worker":
        return worker_main(int(argv[1]))
    if len(argv) == 2 and argv[0] == "--once":
        spec = json.loads(argv[1])
        return run_init(spec, (0, 1, 2), int(spec["report_fd"]), _load_runner())
    print(f"usage: {os.path.basename(__file__)} --worker CONTROL_FD | --once SPEC_JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
