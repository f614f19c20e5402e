"""What a sandboxed run returns, and how the harness turns exit statuses and runner events into verdicts."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field
from typing import Any, Literal

from .runner import RESOURCE_ERRNOS

Verdict = Literal["passed", "failed", "timeout", "crashed", "resource_limit"]

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")  # "ValueError: ...", "KeyboardInterrupt"


@dataclass(kw_only=True)
class _RunRecord:
    """How a sandboxed run was isolated and cleaned up, reported the same way for a program (`SandboxResult`)
    and a test file (`TestRunResult`); keyword-only, after each result's own fields (see `SandboxResult` for
    their meaning)."""

    layers: tuple[str, ...] = ()
    sandbox_uid: int | None = None
    run_id: str = ""
    leftover_processes: int = 0
    truncated: bool = False
    launcher: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"  # type: ignore[attr-defined]


@dataclass
class SandboxResult(_RunRecord):
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
        launcher: "worker" (forked by the pre-started worker) or "fresh" (a new interpreter for this run).
    """

    verdict: Verdict
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    traceback: str | None
    network_isolated: bool


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
class TestRunResult(_RunRecord):
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

    @property
    def num_passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def first_failure(self) -> TestOutcome | None:
        return next((t for t in self.tests if not t.passed), None)




def parse_events(blob: bytes) -> list[dict[str, Any]]:
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
    if line.startswith("MemoryError") or line.split(":")[0] == "BlockingIOError":  # the latter: EAGAIN, a refused fork
        return True
    return any(f"[Errno {code}]" in line for code in RESOURCE_ERRNOS) and "Error" in line.split(":")[0]


def script_verdict(timed_out: bool, exited: bool, returncode: int | None, stderr: str) -> tuple[Verdict, str | None]:
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
    last = tb.splitlines()[-1] if tb else ""
    if _is_resource_error_line(last):
        return "resource_limit", tb
    if not _EXCEPTION_LINE.match(last) and any(_is_resource_error_line(line) for line in stderr.splitlines()):
        # the last traceback was torn by other processes of the run writing at once (a fork bomb's refused forks)
        return "resource_limit", tb
    return "failed", tb


def tests_verdict(timed_out: bool, returncode: int | None, events: list[dict[str, Any]]) -> tuple[Verdict, list[TestOutcome]]:
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
