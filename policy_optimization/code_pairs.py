"""``text2grad code-pairs`` / ``python -m policy_optimization.code_pairs``: DPO pairs for code from unit tests.

KodCode has no human preferences, so the DPO baseline's pairs are built by execution (the paper's Appendix N):
every candidate program for a question runs against the question's unit tests in the sandbox
(`text2grad.core.sandbox.run_tests`); a program that passes every test is *chosen*, one that fails is *rejected*.

    python -m policy_optimization.code_pairs --dataset_path runs/kodcode/candidates.jsonl \\
        --candidate_fields '["solution", "policy_samples", "gpt4o_solution"]' --output runs/kodcode/pairs.jsonl

Candidates come from the record fields named in ``candidate_fields`` (a string or a list of strings each:
the dataset's reference solution, samples of the policy, another model's answers). Model output may be wrapped
in a Markdown fence; the code inside is what runs and what goes into the pair. Per question, up to
``max_pairs_per_question`` pairs are written, each chosen program used once, rejected programs ordered from the
fewest passed tests up (the clearest contrast first). Questions without both a passing and a failing candidate
yield no pair and are counted in the report. The output's ``question`` / ``chosen`` / ``rejected`` fields are
what ``configs/kodcode/dpo.yaml`` reads.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from policy_optimization.code_pairs_config import CodePairsConfig
from text2grad.core.cli import EXIT_OK, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.critics import extract_code
from text2grad.core.data import DataError, load_records, record_id, write_jsonl
from text2grad.core.sandbox import run_tests

__all__ = ["build_pairs", "main"]


def _candidates(record: dict[str, Any], fields: Sequence[str]) -> list[str]:
    """Distinct non-empty programs from ``fields`` (code extracted from Markdown fences), in field order."""
    out: list[str] = []
    for name in fields:
        value = record.get(name)
        for text in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(text, str) and text.strip():
                code = extract_code(text)
                if code.strip() and code not in out:
                    out.append(code)
    return out


def build_pairs(records: Sequence[dict[str, Any]], cfg: CodePairsConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every candidate's tests and pair passing with failing programs. Returns (pairs, report)."""
    jobs = [(i, code) for i, rec in enumerate(records) for code in _candidates(rec, cfg.candidate_fields)]

    def run(job: tuple[int, str]):
        i, code = job
        return run_tests(code, str(records[i][cfg.tests_field]), timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb,
                         per_test_timeout_s=cfg.timeout_s * 0.8)

    verdicts: dict[int, list[tuple[str, Any]]] = {i: [] for i in range(len(records))}
    with ThreadPoolExecutor(cfg.workers) as pool, tqdm(total=len(jobs), desc="unit tests", unit="program",
                                                       disable=not cfg.progress_bar) as bar:
        for (i, code), result in zip(jobs, pool.map(run, jobs)):
            verdicts[i].append((code, result))
            bar.update(1)

    pairs: list[dict[str, Any]] = []
    counts = {"records": len(records), "programs": len(jobs), "programs_passed": 0, "questions_without_candidates": 0,
              "questions_all_passed": 0, "questions_all_failed": 0, "questions_paired": 0}
    for i, runs in verdicts.items():
        passed = [(code, r) for code, r in runs if r.passed]
        failed = sorted(((code, r) for code, r in runs if not r.passed), key=lambda cr: cr[1].num_passed)
        counts["programs_passed"] += len(passed)
        if not runs:
            counts["questions_without_candidates"] += 1
        elif not failed:
            counts["questions_all_passed"] += 1
        elif not passed:
            counts["questions_all_failed"] += 1
        else:
            counts["questions_paired"] += 1
            rid = record_id(records[i], i)
            for k, ((good, good_run), (bad, bad_run)) in enumerate(zip(passed, failed)):
                if k == cfg.max_pairs_per_question:
                    break
                pairs.append({
                    "id": f"{rid}-{k}", "question": records[i][cfg.question_field], "chosen": good, "rejected": bad,
                    "chosen_verdict": good_run.verdict, "rejected_verdict": bad_run.verdict,
                    "rejected_tests_passed": f"{bad_run.num_passed}/{len(bad_run.tests)}",
                })
    counts["pairs"] = len(pairs)
    return pairs, counts


def run_code_pairs(cfg: CodePairsConfig) -> int:
    if not cfg.dataset_path or not cfg.output:
        raise ConfigError("set --dataset_path (records with question, tests and candidates) and --output (the pairs JSONL)")
    output, report_path = Path(cfg.output), Path(cfg.output).with_suffix(".report.json")
    for flag, path in (("--output", output), ("the report", report_path)):
        if path.is_dir():
            raise ConfigError(f"{flag} {path} is a directory; name a file")
        if path.resolve() == Path(cfg.dataset_path).resolve():
            raise ConfigError(f"{flag} {path} is the input file; the input is never written, choose another --output")
    records = load_records(cfg.dataset_path, split=cfg.dataset_split, field_map=cfg.field_map,
                           required=(cfg.question_field, cfg.tests_field), limit=cfg.max_samples)
    if not any(_candidates(r, cfg.candidate_fields) for r in records):
        raise DataError(f"no record has a candidate program in the fields {cfg.candidate_fields}; "
                        "set --candidate_fields to the fields that hold them")
    pairs, report = build_pairs(records, cfg)
    write_jsonl(cfg.output, pairs)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    if not pairs:
        print("warning: no question had both a passing and a failing candidate, so no pair was written; "
              "add candidates that fail (e.g. samples of the policy at temperature 1)", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(CodePairsConfig, run_code_pairs, argv)


if __name__ == "__main__":
    sys.exit(main())
