"""KodCode DPO pairs: candidates run against the unit tests in the sandbox; passing is chosen, failing rejected."""

from __future__ import annotations

import json

from policy_optimization.code_pairs import main

TESTS = "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n\ndef test_negative():\n    assert add(-1, -1) == -2\n"
RIGHT = "def add(a, b):\n    return a + b\n"
HALF_WRONG = "def add(a, b):\n    return abs(a) + abs(b)\n"  # passes test_small only
ALL_WRONG = "def add(a, b):\n    return a - b\n"


def test_pairs_from_unit_tests(tmp_path, capsys):
    records = [
        {"id": "q1", "question": "Write add(a, b).", "test": TESTS, "solution": RIGHT,
         "samples": [f"Here you go:\n```python\n{ALL_WRONG}```", HALF_WRONG, RIGHT]},  # RIGHT again: deduplicated
        {"id": "q2", "question": "Write add again.", "test": TESTS, "solution": RIGHT, "samples": []},
        {"id": "q3", "question": "And again.", "test": TESTS, "solution": ALL_WRONG, "samples": [HALF_WRONG]},
    ]
    src, out = tmp_path / "candidates.jsonl", tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    argv = ["--dataset_path", str(src), "--output", str(out), "--candidate_fields", '["solution", "samples"]',
            "--max_pairs_per_question", "2", "--progress_bar", "false"]
    assert main(argv) == 0

    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    # q1: one passing program, so one pair; the rejected one is the program that passed fewest tests
    assert [(p["id"], p["question"]) for p in pairs] == [("q1-0", "Write add(a, b).")]
    assert pairs[0]["chosen"] == RIGHT and pairs[0]["rejected"] == ALL_WRONG  # the fence was stripped
    assert pairs[0]["chosen_verdict"] == "passed" and pairs[0]["rejected_verdict"] == "failed"
    assert pairs[0]["rejected_tests_passed"] == "0/2"
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert report == {"records": 3, "programs": 6, "programs_passed": 2, "questions_without_candidates": 0,
                      "questions_all_passed": 1, "questions_all_failed": 1, "questions_paired": 1, "pairs": 1}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report


def test_missing_candidates_is_a_clear_error(tmp_path, capsys):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"question": "q", "test": TESTS, "solution": RIGHT}) + "\n")
    assert main(["--dataset_path", str(src), "--output", str(tmp_path / "p.jsonl"), "--candidate_fields", '["samples"]']) == 2
    assert "no record has a candidate program in the fields ['samples']" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()
    src.write_text(json.dumps({"question": "q", "solution": RIGHT}) + "\n")
    assert main(["--dataset_path", str(src), "--output", str(tmp_path / "p.jsonl")]) == 2
    assert "test" in capsys.readouterr().err  # names the missing field
