"""KodCode-Light-RL-10K (``KodCode/KodCode-Light-RL-10K``): one ``train`` split of questions with a verified
reference ``solution``, pytest-style unit tests ``test`` (``test_code`` in some KodCode-V1 revisions, read as
``test``; they import the solution, ``from solution import f``, or rely on the harness's ``from solution import *``)
and ``test_info``, the required function(s) as ``{function_name, function_declaration, parameter_list, docstring}``.

The questions are shared out by ``question_id`` (seeded, disjoint): reward-model questions, RL questions and a
held-out evaluation set (``fractions``, default rm 0.5 / rl 0.45 / eval 0.05).

The policy ``prompt`` is the question followed by the required signature(s) from ``test_info``: the tests import
the function by name, so a correct program with another name would fail.

Reward-model data, as in the paper: for each reward-model question, the reference solution and the completions
of a weaker model (``completions_model``, sampled here with transformers or vLLM, ``generation_backend``:
`text2grad.core.generation_backend`; or a ``completions`` JSONL) are each run against the unit tests in the sandbox (`text2grad.core.sandbox.run_tests`), as KodCode's own
harness runs them: ``from solution import *`` above the test code (`text2grad.core.critics.with_solution_import`;
some rows' tests call the solution without importing it); the output files keep each row's tests as released. Each becomes an
annotation record whose ``execution`` (verdict, passed/failed tests, the first failure's test, exception and
message) and ``execution_result`` (the same as one paragraph, for the LLM critic's prompt) are stored with it,
next to the ``tests``. The report counts passing and failing programs.

- annotation_input.jsonl: ``<question_id>:reference`` and ``<question_id>:completion-<k>`` records;
- preference_pairs.jsonl: per reward-model question, a passing program (chosen) and a failing one (rejected);
- sft.jsonl: reward-model questions with the reference solution as a fenced completion;
- rl_prompts.jsonl: RL questions with ``prompt``, ``test`` (for the unit-test critic), ``test_info``, ``solution``;
- eval.jsonl: held-out questions; ``question`` holds the policy prompt (with the signature), ``question_text`` the
  original question, plus ``solution`` and ``test`` (what ``text2grad eval-code --benchmark kodcode`` reads).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from text2grad.apps.prepare_data.common import split_by_key
from text2grad.apps.prepare_data.prepare_data_config import PrepareDataConfig
from text2grad.apps.prepare_data.sources import SchemaError, check_columns, load_split
from text2grad.core import sandbox
from text2grad.core.critics import extract_code, with_solution_import
from text2grad.core.data import iter_jsonl
from text2grad.core.generation import apply_chat_template
from text2grad.core.generation_backend import load_text_generator

__all__ = ["prepare", "policy_prompt", "signature_lines", "execution_summary", "generate_completions"]

logger = logging.getLogger("text2grad.apps.prepare_data")

COLUMNS = ("question_id", "question", "solution", "test", "test_info")
# Column names of other KodCode releases, read as ours: KodCode-V1 revisions call the tests `test_code`.
COLUMN_ALIASES = {"test_code": "test"}


def signature_lines(test_info: Any) -> list[str]:
    """``def f(a, b):``-style lines from a row's ``test_info`` (a list of dicts; empty when absent)."""
    out = []
    for info in test_info or []:
        if not isinstance(info, Mapping):
            continue
        declaration = str(info.get("function_declaration") or "").strip()
        name = str(info.get("function_name") or "").strip()
        if not declaration and name:
            params = str(info.get("parameter_list") or "").strip()
            params = params if params.startswith("(") else f"({params})"
            declaration = f"def {name}{params}:"
        if declaration:
            out.append(declaration)
    return out


def policy_prompt(question: str, test_info: Any) -> str:
    lines = signature_lines(test_info)
    if not lines:
        return question
    required = "\n".join(lines)
    return (f"{question}\n\nYour solution is tested by importing it by name, so it must define:\n"
            f"```python\n{required}\n```")


def _fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def execution_summary(result: Any) -> tuple[dict[str, Any], str]:
    """(``execution`` record, ``execution_result`` paragraph) of a `TestRunResult`."""
    ran = [t for t in result.tests if t.error_type != "NotRun"]
    failed = [t for t in ran if not t.passed]
    first = failed[0] if failed else None
    execution = {
        "verdict": result.verdict,
        "passed": result.verdict == "passed",
        "tests_passed": [t.name for t in ran if t.passed],
        "tests_failed": [t.name for t in failed],
        "tests_not_run": [t.name for t in result.tests if t.error_type == "NotRun"],
        "failure": None if first is None else {"test": first.name, "error_type": first.error_type,
                                               "message": (first.message or "")[:500]},
    }
    if result.verdict == "passed":
        text = f"PASSED: all {len(ran)} unit test(s) pass."
    else:
        text = f"FAILED ({result.verdict}): {len(failed)} of {len(result.tests)} unit test(s) fail or did not run."
        if first is not None:
            text += f" First failure: {first.name}: {first.error_type or 'error'}"
            text += f": {' '.join((first.message or '').split())[:300]}" if first.message else ""
        elif result.stderr:
            text += " " + " ".join(result.stderr.strip().splitlines()[-1:])[:300]
    return execution, text


def _read_completions(path: str) -> dict[str, list[str]]:
    if not Path(path).is_file():
        raise SchemaError(f"kodcode: completions file {path} does not exist")
    out: dict[str, list[str]] = {}
    for n, rec in enumerate(iter_jsonl(path), 1):
        if "question_id" not in rec or not ("completion" in rec or "completions" in rec):
            raise SchemaError(f"kodcode: {path}:{n} lacks 'question_id' and 'completion' (or 'completions'); "
                              f"it has {sorted(rec)}")
        values = rec.get("completions", rec.get("completion"))
        values = values if isinstance(values, list) else [values]
        out.setdefault(str(rec["question_id"]), []).extend(str(v) for v in values if isinstance(v, str))
    return out


def generate_completions(cfg: PrepareDataConfig, prompts: Mapping[str, str]) -> dict[str, list[str]]:
    """``completions_per_question`` samples of ``completions_model`` for each prompt (keyed like ``prompts``)."""
    try:
        generator = load_text_generator(cfg.generation_backend, cfg.completions_model, cfg.completions_adapter,
                                        dtype=cfg.dtype, vllm_kwargs=cfg.vllm_kwargs)
    except ImportError as exc:
        raise SchemaError(str(exc)) from None
    tokenizer = generator.tokenizer
    keys = [k for k in prompts for _ in range(cfg.completions_per_question)]
    texts = [apply_chat_template(tokenizer, prompts[k]) if cfg.use_chat_template else prompts[k] for k in keys]
    generations = generator.generate(
        texts, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, do_sample=cfg.temperature > 0,
        temperature=max(cfg.temperature, 1e-5), seed=cfg.seed,
        add_special_tokens=not cfg.use_chat_template or not getattr(tokenizer, "chat_template", None),
    )
    out: dict[str, list[str]] = {}
    for key, gen in zip(keys, generations):
        out.setdefault(key, []).append(gen.text)
    return out


def _run_all(programs: Sequence[tuple[str, str]], cfg: PrepareDataConfig) -> list[Any]:
    """Run each (response, tests) in the sandbox; the code is the response's first Python block."""
    def one(item: tuple[str, str]) -> Any:
        response, tests = item
        return sandbox.run_tests(extract_code(response), with_solution_import(tests), timeout_s=cfg.test_timeout_s,
                                 memory_mb=cfg.test_memory_mb, per_test_timeout_s=cfg.test_timeout_s * 0.8)

    with ThreadPoolExecutor(cfg.workers) as pool:
        return list(pool.map(one, programs))


def prepare(cfg: PrepareDataConfig) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    if cfg.completions and cfg.completions_model:
        raise SchemaError("kodcode: pass either completions (a JSONL) or completions_model, not both")
    if not cfg.completions and not cfg.completions_model:
        raise SchemaError(
            "kodcode: the reward model needs failing programs next to the references: pass completions_model "
            "(a hub id or path; its samples are scored by the unit tests) or completions (a JSONL of question_id + "
            "completion)"
        )
    fractions = cfg.resolved_fractions()
    unknown = set(fractions) - {"rm", "rl", "eval"}
    if unknown:
        raise SchemaError(f"kodcode: fractions may name rm, rl and eval, not {sorted(unknown)}")
    data = load_split("kodcode", cfg.dataset_path, "train", "train", cfg.max_samples)
    renamed = {old: new for old, new in COLUMN_ALIASES.items() if new not in data.columns and old in data.columns}
    for row in data.rows:
        for old, new in renamed.items():
            row[new] = row.pop(old)
    data.columns = [renamed.get(c, c) for c in data.columns]
    check_columns(data, COLUMNS)
    given = _read_completions(cfg.completions) if cfg.completions else None  # read before any slow work

    rows, skipped = [], {}
    seen: set[str] = set()
    for row in data.rows:
        qid = str(row["question_id"])
        if qid in seen or not all(isinstance(row[c], str) and row[c].strip() for c in ("question", "solution", "test")):
            reason = "repeated question_id" if qid in seen else "empty question, solution or test"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        seen.add(qid)
        rows.append({"question_id": qid, "question": row["question"], "solution": row["solution"], "test": row["test"],
                     "test_info": row["test_info"], "prompt": policy_prompt(row["question"], row["test_info"])})
    part_of = split_by_key([r["question_id"] for r in rows], fractions, cfg.seed)
    parts: dict[str, list[dict[str, Any]]] = {name: [] for name in ("rm", "rl", "eval")}
    for r in rows:
        parts[part_of[r["question_id"]]].append(r)

    rm = parts["rm"]
    if given is not None:
        completions = {r["question_id"]: given.get(r["question_id"], []) for r in rm}
        outside = sum(len(v) for k, v in given.items() if part_of.get(k) != "rm")
    else:
        completions = generate_completions(cfg, {r["question_id"]: r["prompt"] for r in rm})
        outside = 0
    candidates: list[tuple[dict[str, Any], str, str, str]] = []  # (row, id, kind, response)
    for r in rm:
        candidates.append((r, f"{r['question_id']}:reference", "reference", _fenced(r["solution"])))
        for k, text in enumerate(completions.get(r["question_id"], [])):
            candidates.append((r, f"{r['question_id']}:completion-{k}", "completion", text))
    results = _run_all([(resp, r["test"]) for r, _, _, resp in candidates], cfg)

    annotation: list[dict[str, Any]] = []
    by_question: dict[str, list[dict[str, Any]]] = {}
    for (r, rid, kind, response), result in zip(candidates, results):
        execution, text = execution_summary(result)
        rec = {"id": rid, "question_id": r["question_id"], "prompt": r["prompt"], "response": response,
               "kind": kind, "tests": r["test"], "execution": execution, "execution_result": text}
        annotation.append(rec)
        by_question.setdefault(r["question_id"], []).append(rec)
    pairs = []
    for r in rm:
        recs = by_question.get(r["question_id"], [])
        good = [x for x in recs if x["execution"]["passed"]]
        bad = sorted((x for x in recs if not x["execution"]["passed"]), key=lambda x: len(x["execution"]["tests_passed"]))
        if good and bad:
            pairs.append({"id": r["question_id"], "question_id": r["question_id"], "prompt": r["prompt"],
                          "chosen": good[0]["response"], "rejected": bad[0]["response"],
                          "chosen_id": good[0]["id"], "rejected_id": bad[0]["id"]})
    sft = [{"id": r["question_id"], "question_id": r["question_id"], "prompt": r["prompt"],
            "completion": _fenced(r["solution"])} for r in rm]
    rl = [{"id": r["question_id"], **r} for r in parts["rl"]]
    eval_rows = [{"id": r["question_id"], "question_id": r["question_id"], "question": r["prompt"],
                  "question_text": r["question"], "prompt": r["prompt"], "solution": r["solution"], "test": r["test"],
                  "test_info": r["test_info"]} for r in parts["eval"]]

    def count(kind: str, passed: bool) -> int:
        return sum(1 for a in annotation if a["kind"] == kind and a["execution"]["passed"] == passed)

    report = {
        "splits": {"train": {"rows": len(data.rows), "from": data.origin}},
        "columns_renamed": renamed,
        "fractions": fractions,
        "seed": cfg.seed,
        "parts": {name: {"questions": len(rows_)} for name, rows_ in parts.items()},
        "completions_from": cfg.completions or f"model {cfg.completions_model}",
        "programs": {
            "reference": {"passing": count("reference", True), "failing": count("reference", False)},
            "completion": {"passing": count("completion", True), "failing": count("completion", False)},
        },
        "passing": sum(a["execution"]["passed"] for a in annotation),
        "failing": sum(not a["execution"]["passed"] for a in annotation),
        "verdicts": _tally(a["execution"]["verdict"] for a in annotation),
        "rm_questions_without_completions": sum(1 for r in rm if not completions.get(r["question_id"])),
        "completions_outside_rm_part": outside,
        "preference_pairs": len(pairs),
        "skipped": skipped,
    }
    if report["programs"]["reference"]["failing"]:
        logger.warning("%d reference solution(s) fail their own tests in this sandbox (see prepare_report.json)",
                       report["programs"]["reference"]["failing"])
    return {"annotation_input.jsonl": annotation, "sft.jsonl": sft, "rl_prompts.jsonl": rl,
            "eval.jsonl": eval_rows, "preference_pairs.jsonl": pairs}, report


def _tally(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))

