"""The small pytest-like test runner, run inside the sandbox as the program (standard library only).

The sandbox's program process calls `run_tests_main` after it has dropped its privileges; it imports
``test_solution.py`` (which imports ``solution.py``) from the run's directory, runs every test and writes one
JSON event per line to the report fd (``start``, ``collected``, ``begin``/``result`` per test, ``done``), a
private pipe: nothing the program prints can forge a verdict.

Supported: ``test*`` functions, ``Test*`` classes (``setup_method``/``teardown_method``),
``@pytest.mark.parametrize`` (pytest.param too), fixtures defined in the module (generators included) and the
fixtures ``tmp_path``, ``tmpdir``, ``capsys``, ``capfd`` and ``monkeypatch`` (the last needs pytest installed);
a module without tests is a plain assert script and counts as one test, ``<module>``.
"""

from __future__ import annotations

import collections
import errno
import io
import json
import os
import pathlib
import signal
import sys
import tempfile
import time
import traceback as tb_mod
from typing import Any, Sequence

SOLUTION_FILE = "solution.py"
TEST_FILE = "test_solution.py"
RESOURCE_ERRNOS = (errno.ENOMEM, errno.EFBIG, errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOSPC)


def report(fd: int, event: dict[str, Any]) -> None:
    """One JSON line on the report pipe (the harness reads events from it, never from stdout)."""
    data = (json.dumps(event, default=str) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


class _TestTimeout(BaseException):
    """Raised by SIGALRM when a test exceeds its time limit (BaseException: `except Exception` cannot eat it)."""


def run_tests_main(args: dict[str, Any], report_fd: int, own_files: Sequence[str]) -> None:
    """Run the test file of ``args["workdir"]`` (already first on ``sys.path``); never returns (``os._exit``)."""
    workdir = args["workdir"]
    per_test = args.get("per_test_timeout_s")
    own = {os.path.realpath(f) for f in (*own_files, __file__)}
    solution_path = os.path.realpath(os.path.join(workdir, SOLUTION_FILE))

    def emit(event: dict[str, Any]) -> None:
        report(report_fd, event)

    def alarm(signum, frame):
        raise _TestTimeout(f"test exceeded its {per_test} s time limit")

    if per_test:
        signal.signal(signal.SIGALRM, alarm)

    def describe(exc: BaseException) -> dict[str, Any]:
        frames = [f for f in tb_mod.extract_tb(exc.__traceback__) if os.path.realpath(f.filename) not in own]
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
        elif isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS):
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
        path = pathlib.Path(tempfile.mkdtemp(dir=os.getcwd(), prefix="tmp_path-"))
        return path if name == "tmp_path" else str(path)
    if name in ("capsys", "capfd"):
        cap = _Capsys()
        teardowns.append(cap.stop)
        return cap
    if name == "monkeypatch":
        try:  # optional: only tests that ask for monkeypatch need pytest in the sandbox's interpreter
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


