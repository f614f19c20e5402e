"""The unit-test critic: a response's code run against the record's unit tests in the sandbox, and the
outcome written as a critique that quotes the offending (or the verified) lines of the response.

`CodeTestCritic` is both a `text2grad.core.critics.FeedbackSource` (registry name ``code_tests``, used by
PPO) and an annotation record critic (``--critic code_tests``): the same critic shapes rewards in both
phases. The code is cut out of the response with `text2grad.core.critics.extract_code`, the function the
code evaluation uses too.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import dataclasses
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from annotation.critics import CriticResult
from text2grad.core import sandbox
from text2grad.core.critics import extract_code, with_solution_import
from text2grad.core.feedback import Feedback

__all__ = ["CodeTestCritic"]

_SOLUTION_LINE = re.compile(r'File "[^"]*solution\.py", line (\d+)')


@dataclass
class _Def:
    name: str
    node: ast.AST
    source: str  # exact text of the definition (a substring of the code)
    calls: set[str]
    returns: list[int]  # line numbers of its return statements (not those of nested functions)
    loops: list[int]  # line numbers of its loop headers


def _own_nodes(node: ast.AST):
    """The nodes of a function body, not descending into nested function or class definitions."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(child))


def _referenced_names(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
        elif isinstance(child, ast.alias):
            names.add(child.asname or child.name)
            names.add(child.name)
    return names


class _CodeMap:
    """Functions and classes of the solution, and which of them a piece of test code reaches."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.lines = code.splitlines()
        self.defs: dict[str, _Def] = {}
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            return
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                source = ast.get_source_segment(code, node) or ""
                own = list(_own_nodes(node))
                calls = _referenced_names(node) if isinstance(node, ast.ClassDef) else {
                    n for c in own for n in _referenced_names(c)
                }
                returns = [c.lineno for c in own if isinstance(c, ast.Return)]
                loops = [c.lineno for c in own if isinstance(c, (ast.For, ast.While, ast.AsyncFor))]
                self.defs.setdefault(node.name, _Def(node.name, node, source, calls, returns, loops))

    def quote_line(self, lineno: int) -> str | None:
        """The stripped text of a 1-based line, or None if out of range or blank."""
        if 1 <= lineno <= len(self.lines):
            text = self.lines[lineno - 1].strip()
            return text or None
        return None

    def innermost(self, lineno: int) -> str | None:
        """The smallest definition containing line ``lineno`` (a method rather than its class)."""
        holders = [d for d in self.defs.values() if _contains_line(d.node, lineno)]
        if not holders:
            return None
        return min(holders, key=lambda d: getattr(d.node, "end_lineno", 0) - getattr(d.node, "lineno", 0)).name

    def reached(self, names: set[str]) -> list[str]:
        """Solution definitions named in ``names``, plus everything they call (transitively), in code order."""
        seen: set[str] = set()
        stack = [n for n in names if n in self.defs]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            stack.extend(n for n in self.defs[name].calls if n in self.defs and n not in seen)
        return sorted(seen, key=lambda n: getattr(self.defs[n].node, "lineno", 0))

    def direct(self, names: set[str]) -> list[str]:
        return sorted((n for n in names if n in self.defs), key=lambda n: getattr(self.defs[n].node, "lineno", 0))


def _test_functions(tests: str) -> dict[str, set[str]]:
    """Names each test function (``test_*``, also as methods ``Class::test_*``) references.

    Names referenced at module level of the test file (fixtures, helpers) are added to every test.
    """
    try:
        tree = ast.parse(tests)
    except (SyntaxError, ValueError):
        return {}
    module_names: set[str] = set()
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            out[node.name] = _referenced_names(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    out[f"{node.name}::{item.name}"] = _referenced_names(item) | {node.name}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module_names |= _referenced_names(node)
    for names in out.values():
        names |= module_names
    return out


def _names_for(test_name: str, test_refs: dict[str, set[str]]) -> set[str]:
    """The names referenced by the sandbox's test ``test_name`` (``test_x``, ``test_x[1]``, ``Cls::test_y``)."""
    return test_refs.get(test_name.split("[")[0], set())


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


class CodeTestCritic:
    """Feedback from unit tests run in the sandbox (`text2grad.core.sandbox.run_tests`).

    What it says about a response:

    - all tests pass: the critique names the tests, and each solution function the tests reach (by name, and
      transitively through calls, found statically with ``ast``) is a good span;
    - a test fails: the critique gives the test, the exception and its message; the poor span is the deepest
      solution line in the failure's traceback, or, when the assertion failed inside the test itself, the
      return statements of the solution functions that test calls. Functions reached only by passing tests
      stay good spans;
    - timeout or memory limit: the loop headers (or, failing that, the definitions) of the functions the
      tests reach are poor spans;
    - the code does not even load (syntax or import error): the offending line is the poor span.

    Spans are lines (stripped of indentation) or whole definitions copied from the code, so they are exact
    quotes of the response. A response with a fenced code block is judged on its first Python block.

    As a `FeedbackSource` (policy phase), ``tests`` maps each prompt to its test code (a dict or a
    function), or `bind_records` reads it from each record's ``tests_field``. At most ``max_workers`` sandboxes run at once (default: the number of CPUs), whatever the
    annotation run's concurrency, because the time limits are wall-clock and an overloaded machine would
    turn slow-but-correct code into timeouts.
    """

    source = "code_tests"

    def __init__(
        self,
        tests: Mapping[str, str] | Callable[[str], str | None] | None = None,
        *,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        max_workers: int | None = None,
        max_failures_in_critique: int = 3,
        tests_field: str = "test",
    ) -> None:
        self.tests = tests
        self.tests_field = tests_field
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_workers = max(1, max_workers or os.cpu_count() or 2)
        self.max_failures_in_critique = max_failures_in_critique
        self._slots = threading.BoundedSemaphore(self.max_workers)

    # -- FeedbackSource ------------------------------------------------------------------------------

    def bind_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Take each record's ``tests_field`` as the unit tests for its ``prompt`` (unless ``tests`` was given)."""
        if self.tests is not None:
            return
        table: dict[str, str] = {}
        for i, rec in enumerate(records):
            if rec.get(self.tests_field) is None:
                raise ValueError(
                    f"record {i} has no {self.tests_field!r} field for the unit-test critic; it has {sorted(rec)}. "
                    "Set the critic kwarg tests_field (critic_kwargs, in annotation and PPO alike) "
                    "or map a field with field_map."
                )
            table[str(rec["prompt"])] = str(rec[self.tests_field])
        self.tests = table

    def _tests_for(self, prompt: str) -> str | None:
        if self.tests is None:
            return None
        if callable(self.tests):
            return self.tests(prompt)
        return self.tests.get(prompt)

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")

        def one(pair: tuple[str, str]) -> Feedback:
            prompt, response = pair
            tests = self._tests_for(prompt)
            if not tests:
                return Feedback.failed("no unit tests are known for this prompt")
            try:
                return self.critique(response, tests)[0]
            except Exception as exc:  # a FeedbackSource never raises
                return Feedback.failed(f"code critic error: {type(exc).__name__}: {exc}")

        with concurrent.futures.ThreadPoolExecutor(self.max_workers) as pool:
            return list(pool.map(one, zip(prompts, responses)))

    # -- RecordCritic --------------------------------------------------------------------------------

    async def annotate(self, record: Mapping[str, Any]) -> CriticResult:
        tests = str(record.get("tests") or "")
        if not tests.strip():
            return CriticResult(Feedback.failed("record has no unit tests (empty 'tests' field)"))
        feedback, info = await asyncio.to_thread(self._limited_critique, str(record["response"]), tests)
        return CriticResult(feedback, 0, info)

    def _limited_critique(self, response: str, tests: str) -> tuple[Feedback, dict[str, Any]]:
        with self._slots:
            return self.critique(response, tests)

    # -- the critique itself -------------------------------------------------------------------------

    def critique(self, response: str, tests: str) -> tuple[Feedback, dict[str, Any]]:
        """Run ``tests`` against the code in ``response``; returns the feedback and a summary of the run. The tests
        run as KodCode's harness runs them (`with_solution_import`: the solution's names are in scope)."""
        code = extract_code(response)
        tests = with_solution_import(tests)
        # A per-test alarm below the run's limit makes a hanging test report where it was stuck.
        result = sandbox.run_tests(
            code, tests, timeout_s=self.timeout_s, memory_mb=self.memory_mb, per_test_timeout_s=self.timeout_s * 0.8
        )
        cmap = _CodeMap(code)
        test_refs = _test_functions(tests)
        ran = [t for t in result.tests if t.error_type != "NotRun"]
        passed = [t for t in ran if t.passed]
        failed = [t for t in ran if not t.passed]
        info: dict[str, Any] = {
            "verdict": result.verdict,
            "passed": [t.name for t in passed],
            "failed": [t.name for t in failed],
            "not_run": [t.name for t in result.tests if t.error_type == "NotRun"],
            "duration_s": round(float(result.duration_s or 0.0), 3),
        }
        all_refs = set().union(*test_refs.values()) if test_refs else _referenced_names_safe(tests)
        unloadable = next((t for t in failed if t.name in ("<collection>", "<runner>")), None)
        if result.verdict == "passed":
            feedback = self._passed(cmap, code, passed, cmap.reached(all_refs))
        elif unloadable is not None or (result.verdict == "crashed" and not passed):
            feedback = self._unloadable(code, cmap, result, unloadable or (failed[0] if failed else None))
        elif result.verdict in ("timeout", "resource_limit"):
            feedback = self._out_of_limits(cmap, result.verdict, passed, failed, cmap.reached(all_refs))
        else:
            feedback = self._failed(cmap, ran, passed, failed, test_refs, all_refs)
        return dataclasses.replace(feedback, raw=_raw(result)), info

    def _passed(self, cmap: _CodeMap, code: str, passed: list[Any], reached: list[str]) -> Feedback:
        n = len(passed)
        names = ", ".join(_test_label(t.name) for t in passed)
        critique = f"All {n} unit test{'s' if n != 1 else ''} pass ({_short(names, 200)})."
        if reached:
            verb = "behaves" if len(reached) == 1 else "behave"
            critique += " They exercise " + ", ".join(f"`{d}`" for d in reached) + f", which {verb} as required."
        good = [cmap.defs[d].source for d in reached] or [code.strip()]
        return Feedback(critique=critique, good_spans=tuple(_unique(good)))

    def _out_of_limits(self, cmap: _CodeMap, verdict: str, passed: list[Any], failed: list[Any], reached: list[str]) -> Feedback:
        if verdict == "timeout":
            what = f"do not finish within {self.timeout_s:g} s: the code is too slow or never terminates"
        else:
            what = f"exceed the resource limits ({self.memory_mb} MB of memory): the code allocates too much"
        stuck = [t.solution_lines[-1] for t in failed if t.verdict == verdict and t.solution_lines]
        stuck = [n for n in stuck if cmap.quote_line(n)]
        # Where it was stuck, then the loops of the function that holds that line (or of every function the
        # tests reach), then, with no loop in sight, the definitions themselves.
        holders = _unique([cmap.innermost(n) or "" for n in stuck])
        targets = holders or reached or list(cmap.defs)
        lines = stuck + [n for d in targets for n in cmap.defs[d].loops]
        if not lines:
            lines = [getattr(cmap.defs[d].node, "lineno", 0) for d in targets]
        poor = _unique([cmap.quote_line(n) or "" for n in lines])
        critique = f"The tests {what}."
        if stuck:
            critique += f" When the limit hit, it was running `{_short(cmap.quote_line(stuck[0]) or '', 80)}`."
        elif poor:
            critique += " Suspect: " + "; ".join(f"`{_short(p, 80)}`" for p in poor[:3]) + "."
        if passed:
            critique += f" {len(passed)} test(s) passed before that."
        return Feedback(critique=critique, poor_spans=tuple(poor))

    def _failed(
        self, cmap: _CodeMap, ran: list[Any], passed: list[Any], failed: list[Any],
        test_refs: dict[str, set[str]], all_refs: set[str],
    ) -> Feedback:
        poor: list[str] = []
        implicated: set[str] = set()
        sentences = [f"{len(failed)} of {len(ran)} unit tests fail."]
        for i, t in enumerate(failed):
            lines = [n for n in t.solution_lines if cmap.quote_line(n)]
            error = t.error_type or "an error"
            message = _short(t.message or "", 160)
            if lines:
                # The exception was raised inside the solution: the innermost solution line is the culprit.
                line = cmap.quote_line(lines[-1]) or ""
                implicated |= {d for d, dd in cmap.defs.items() if _contains_line(dd.node, lines[-1])}
                poor.append(line)
                sentence = f"`{_test_label(t.name)}` raises {error}" + (f" ({message})" if message else "")
                sentence += f" at `{_short(line, 80)}`."
            else:
                # The test's own assertion failed: the solution returned a wrong value. Blame the return
                # statements of the solution functions the test calls directly.
                called = cmap.direct(_names_for(t.name, test_refs)) or cmap.direct(all_refs)
                implicated |= set(called)
                culprits = [cmap.quote_line(n) for d in called for n in cmap.defs[d].returns]
                if not any(culprits):
                    culprits = [cmap.quote_line(getattr(cmap.defs[d].node, "lineno", 0)) for d in called]
                poor.extend(c for c in culprits if c)
                sentence = f"`{_test_label(t.name)}` fails with {error}" + (f": {message}" if message else "")
                if called:
                    sentence += "; the wrong result comes from " + ", ".join(f"`{d}`" for d in called)
                sentence += "."
            if i < self.max_failures_in_critique:
                sentences.append(sentence)
        if len(failed) > self.max_failures_in_critique:
            sentences.append(f"{len(failed) - self.max_failures_in_critique} more failing test(s) are not described.")
        good_defs: list[str] = []
        if passed:
            passing_refs = set().union(*(_names_for(t.name, test_refs) for t in passed))
            good_defs = [
                d for d in cmap.reached(passing_refs) if d not in implicated and not _encloses_any(cmap, d, implicated)
            ]
            sentences.append(
                f"{len(passed)} test(s) pass"
                + (", and " + ", ".join(f"`{d}`" for d in good_defs)
                   + (" behaves" if len(good_defs) == 1 else " behave") + " as required." if good_defs else ".")
            )
        good = [cmap.defs[d].source for d in good_defs]
        return Feedback(critique=" ".join(sentences), good_spans=tuple(_unique(good)), poor_spans=tuple(_unique(poor)))

    def _unloadable(self, code: str, cmap: _CodeMap, result: Any, failure: Any | None) -> Feedback:
        lineno: int | None = None
        error = ""
        if failure is not None:
            lines = [n for n in failure.solution_lines if cmap.quote_line(n)]
            if lines:
                lineno = lines[-1]
            if failure.error_type and failure.error_type != "ProcessExit":
                error = f"{failure.error_type}: {_short(failure.message or '', 120)}"
        if lineno is None:
            try:
                compile(code, "solution.py", "exec")
            except SyntaxError as exc:
                lineno, error = exc.lineno, error or f"SyntaxError: {exc.msg}"
        stderr = str(getattr(result, "stderr", "") or "")
        if lineno is None:
            found = [int(n) for n in _SOLUTION_LINE.findall(stderr) if cmap.quote_line(int(n))]
            lineno = found[-1] if found else None
        if not error:
            last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
            error = _short(last[-1], 160) if last else f"the test run {result.verdict}"
        line = cmap.quote_line(lineno) if lineno else None
        critique = f"The tests cannot run: the solution fails to load or run ({error})"
        critique += f" at `{_short(line, 80)}`." if line else "."
        return Feedback(critique=critique, poor_spans=(line,) if line else ())


def _test_label(name: str) -> str:
    return name.split("::")[-1]


def _referenced_names_safe(code: str) -> set[str]:
    try:
        return _referenced_names(ast.parse(code))
    except (SyntaxError, ValueError):
        return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code))


def _contains_line(node: ast.AST, lineno: int) -> bool:
    start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    return start is not None and end is not None and start <= lineno <= end


def _encloses_any(cmap: _CodeMap, name: str, others: set[str]) -> bool:
    """True if definition ``name`` (e.g. a class) contains one of ``others`` (e.g. a faulty method)."""
    node = cmap.defs[name].node
    return any(_contains_line(node, getattr(cmap.defs[o].node, "lineno", -1)) for o in others if o in cmap.defs)


def _raw(result: Any) -> str:
    """A short text record of the run (for the annotation's raw field)."""
    parts = [f"verdict: {result.verdict}"]
    for t in list(getattr(result, "tests", []) or [])[:20]:
        status = "passed" if t.passed else f"failed ({t.error_type}: {_short(t.message or '', 100)})"
        parts.append(f"{t.name}: {status}")
    return "\n".join(parts)
