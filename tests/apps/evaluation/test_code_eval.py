"""Code evaluation: pass@k, HumanEval / MBPP / KodCode loaders, program assembly, end-to-end scoring in the sandbox,
the CLI (EvalPlus formats: test_code_evalplus.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from text2grad.apps.tiny import make_tiny_world
from text2grad.core.config import ConfigError
from text2grad.core.data import DataError
from text2grad.apps.evaluation import code as ce
from text2grad.apps.evaluation.code import (
    CodeProblem,
    Sample,
    build_program,
    load_problems,
    load_samples,
    mean_pass_at_k,
    pass_at_k,
    reference_samples,
    score_samples,
    summarize,
)

# HumanEval problems whose tests need more than the entry point (helpers from the prompt, float checks, ...)
HUMANEVAL_SUBSET = ["HumanEval/0", "HumanEval/2", "HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/50",
                    "HumanEval/53", "HumanEval/96", "HumanEval/129", "HumanEval/163"]


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _score(problems, samples, ks=(1,), workers=2):
    results = score_samples(problems, samples, workers=workers, timeout_s=20, per_test_timeout_s=10)
    return summarize(problems, results, list(ks)), results


# --- pass@k ----------------------------------------------------------------------------------------------------


def test_pass_at_k_hand_computed():
    assert pass_at_k(1, 1, 1) == 1.0
    assert pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 3) == pytest.approx(1 - 35 / 120)  # 1 - C(7,3)/C(10,3)
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k failures: every k-subset holds a pass
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)


def test_pass_at_k_matches_binomials():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(TypeError):
        pass_at_k(3.0, 1, 1)
    assert mean_pass_at_k([(2, 1), (2, 2), (2, 0)], 1) == pytest.approx(0.5)


# --- program assembly ------------------------------------------------------------------------------------------


def test_build_program_completion_and_whole_function():
    prompt = 'from typing import List\n\n\ndef inc(xs: List[int]) -> List[int]:\n    """Add one to each."""\n'
    problem = CodeProblem("t", prompt, "", "", "inc", code_prefix=prompt)
    body = build_program(problem, Sample("t", completion="    return [x + 1 for x in xs]\n"))
    assert body == prompt + "    return [x + 1 for x in xs]\n"
    chat = "Sure!\n```python\ndef inc(xs):\n    return [x + 1 for x in xs]\n```"
    whole = build_program(problem, Sample("t", completion=chat))
    assert whole.startswith("from typing import List") and whole.endswith("def inc(xs):\n    return [x + 1 for x in xs]\n")
    namespace: dict = {}
    exec(compile(whole, "p", "exec"), namespace)  # the stub is replaced by the answer
    assert namespace["inc"]([1]) == [2]
    bare = CodeProblem("t", "def inc(xs):\n", "", "", "inc", code_prefix="def inc(xs):\n")
    namespace = {}
    exec(compile(build_program(bare, Sample("t", completion=chat)), "p", "exec"), namespace)
    assert namespace["inc"]([2]) == [3]
    assert build_program(problem, Sample("t", solution="x = 1")) == "x = 1"


# --- HumanEval ------------------------------------------------------------------------------------------------


def test_humaneval_canonical_subset_scores_100_and_wrong_scores_0():
    problems = load_problems("humaneval", task_ids=HUMANEVAL_SUBSET)
    assert [p.task_id for p in problems] == HUMANEVAL_SUBSET
    (scores, rows), results = _score(problems, {s.task_id: [s] for s in reference_samples(problems)})
    assert scores["pass@1"] == 1.0, [r for r in rows if r["correct"] == 0]
    wrong = {p.task_id: [Sample(p.task_id, completion="    return None\n")] for p in problems}
    (scores, rows), results = _score(problems, wrong)
    assert scores["pass@1"] == 0.0
    assert all(r.verdict == "failed" for r in results)


@pytest.mark.slow
def test_humaneval_all_164_canonical_100_and_wrong_0():
    problems = load_problems("humaneval")
    assert len(problems) == 164
    (scores, rows), _ = _score(problems, {s.task_id: [s] for s in reference_samples(problems)})
    assert scores["pass@1"] == 1.0, [r for r in rows if r["correct"] == 0]
    wrong = {p.task_id: [Sample(p.task_id, completion="    raise NotImplementedError\n")] for p in problems}
    (scores, rows), results = _score(problems, wrong)
    assert scores["pass@1"] == 0.0
    assert {r.error_type for r in results} == {"NotImplementedError"}


def test_empty_and_unparseable_completions_are_failures(tmp_path):
    problems = load_problems("humaneval", task_ids=["HumanEval/53"])  # add(x, y)
    samples = {"HumanEval/53": [
        Sample("HumanEval/53", completion=""),
        Sample("HumanEval/53", completion="    return x +\n"),
        Sample("HumanEval/53", completion="    return x + y\n"),
    ]}
    (scores, rows), results = _score(problems, samples, ks=(1, 2, 3))
    assert [r.verdict for r in results] == ["failed", "failed", "passed"]
    assert [r.error_type for r in results[:2]] == ["EmptyCompletion", "SyntaxError"]
    assert scores["pass@1"] == pytest.approx(1 / 3)
    assert scores["pass@2"] == pytest.approx(1 - 1 / 3)  # 1 - C(2,2)/C(3,2)
    assert scores["pass@3"] == 1.0
    assert rows[0]["correct"] == 1 and "EmptyCompletion" in rows[0]["first_error"]


# --- MBPP, KodCode loaders ---------------------------------------------------------------------------


MBPP_RECORDS = [
    {"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given character from the string.",
     "code": "def remove_Occ(s,ch):\n    s = s.replace(ch, '', 1)\n    idx = s.rfind(ch)\n    return s[:idx] + s[idx+1:] if idx >= 0 else s",
     "test_list": ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"'],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 12, "text": "Write a function to sort a matrix by the sum of its rows.",
     "code": "def sort_matrix(M):\n    return sorted(M, key=sum)",
     "test_list": ["assert sort_matrix([[1, 2], [0, 0]]) == [[0, 0], [1, 2]]"],
     "test_setup_code": "import math", "challenge_test_list": []},
]


def test_mbpp_original_and_sanitized_formats(tmp_path):
    original = load_problems("mbpp", str(_write_jsonl(tmp_path / "mbpp.jsonl", MBPP_RECORDS)))
    assert [p.task_id for p in original] == ["11", "12"] and original[0].entry_point == "remove_Occ"
    assert "Your code should pass these tests" in original[0].prompt and 'remove_Occ("hello","l")' in original[0].prompt
    sanitized = [{"task_id": r["task_id"], "prompt": r["text"], "code": r["code"], "test_imports": ["import math"],
                  "test_list": r["test_list"]} for r in MBPP_RECORDS]
    (tmp_path / "sanitized-mbpp.json").write_text(json.dumps(sanitized))
    problems = load_problems("mbpp", str(tmp_path / "sanitized-mbpp.json"))
    (scores, _), results = _score(problems, {s.task_id: [s] for s in reference_samples(problems)})
    assert scores["pass@1"] == 1.0 and results[0].tests_total == 2
    wrong = {p.task_id: [Sample(p.task_id, completion="```python\ndef remove_Occ(s, ch):\n    return s\n\ndef sort_matrix(M):\n    return M\n```")] for p in problems}
    (scores, _), results = _score(problems, wrong)
    assert scores["pass@1"] == 0.0 and results[0].tests_passed == 0


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="lacks \\['question'"):
        load_problems("kodcode", str(_write_jsonl(tmp_path / "k.jsonl", [{"id": "a", "solution": "", "test": ""}])))
    with pytest.raises(DataError, match="not in"):
        load_problems("humaneval", task_ids=["HumanEval/9999"])
    with pytest.raises(ConfigError, match="unknown benchmark"):
        load_problems("apps")


def test_samples_file_grouping_and_missing(tmp_path):
    problems = load_problems("humaneval", task_ids=["HumanEval/53"])
    path = _write_jsonl(tmp_path / "s.jsonl", [
        {"task_id": "HumanEval/53", "completion": "    return x + y\n"},
        {"task_id": "HumanEval/53", "solution": "def add(x, y):\n    return x - y\n"},
        {"task_id": "HumanEval/0", "completion": "ignored: not selected"},
    ])
    grouped = load_samples(path, problems)
    assert [(s.completion is not None, s.solution is not None) for s in grouped["HumanEval/53"]] == [(True, False), (False, True)]
    (scores, _), _ = _score(problems, grouped, ks=(1, 2))
    assert scores == {"pass@1": pytest.approx(0.5), "pass@2": 1.0}
    with pytest.raises(DataError, match="no samples"):
        load_samples(path, load_problems("humaneval", task_ids=["HumanEval/1"]))


# --- CLI end to end --------------------------------------------------------------------------------------------


# KodCode-Light-RL-10K rows (its columns; written by hand): tests import the program as `solution`
KODCODE_ROWS = [
    {"version": "v1.0", "style": "instruct", "subset": "Leetcode", "question_id": "Leetcode_1_I",
     "question": "Write a function `count_vowels(s)` that returns how many vowels (a, e, i, o, u) the string s holds.",
     "solution": "def count_vowels(s):\n    return sum(ch in 'aeiou' for ch in s.lower())\n",
     "test": "from solution import count_vowels\n\ndef test_basic():\n    assert count_vowels('hello') == 2\n\n"
             "def test_upper():\n    assert count_vowels('AEx') == 2\n",
     "test_info": [{"function_name": "count_vowels", "function_declaration": "def count_vowels(s):",
                    "parameter_list": "(s)", "docstring": None}], "gpt_difficulty": "easy"},
    {"version": "v1.0", "style": "instruct", "subset": "Apps", "question_id": "Apps_2_I",
     "question": "Write `second_largest(xs)`: the second largest distinct number of a list, or None.",
     "solution": "def second_largest(xs):\n    v = sorted(set(xs))\n    return v[-2] if len(v) > 1 else None\n",
     "test": "from solution import second_largest\n\ndef test_values():\n    assert second_largest([3, 1, 3, 2]) == 2\n"
             "    assert second_largest([5]) is None\n",
     "test_info": [{"function_name": "second_largest", "function_declaration": "def second_largest(xs):",
                    "parameter_list": "(xs)", "docstring": None}], "gpt_difficulty": "medium"},
    {"version": "v1.0", "style": "instruct", "subset": "Filter", "question_id": "Filter_3_I",
     "question": "Write `is_palindrome(s)` ignoring case and non-letters.",
     "solution": "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]\n",
     "test": "import pytest\nfrom solution import is_palindrome\n\n@pytest.mark.parametrize('s,ok', [('Aba', True), ('ab', False), ('A man, a plan', False)])\n"
             "def test_cases(s, ok):\n    assert is_palindrome(s) is ok\n",
     "test_info": [{"function_name": "is_palindrome", "function_declaration": "def is_palindrome(s):",
                    "parameter_list": "(s)", "docstring": None}], "gpt_difficulty": "easy"},
]


@pytest.fixture(scope="module")
def kodcode_eval(tmp_path_factory):
    return _write_jsonl(tmp_path_factory.mktemp("kodcode") / "eval.jsonl", KODCODE_ROWS)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_world("kodcode", tmp_path_factory.mktemp("tiny_kodcode"), n_train=4, n_eval=2, prepare=False) / "model"


def test_kodcode_references_via_cli(kodcode_eval, tmp_path, capsys):
    out = tmp_path / "ref"
    rc = ce.main(["--benchmark", "kodcode", "--dataset_path", str(kodcode_eval), "--score_references", "true",
                  "--workers", "2", "--output_dir", str(out), "--progress_bar", "false"])
    assert rc == 0
    report = json.loads((out / "kodcode.json").read_text())["results"]
    assert report["pass@1"] == 1.0 and report["problems"] == 3 and report["verdicts"] == {"passed": 3}
    assert "| pass@1" in capsys.readouterr().out
    problems_md = (out / "kodcode_problems.md").read_text()
    assert all(f"| {row['question_id']} " in problems_md for row in KODCODE_ROWS)  # ids are KodCode's question_id


def test_tiny_model_end_to_end_scores_zero_without_crashing(kodcode_eval, tiny_model, tmp_path):
    out = tmp_path / "gen"
    rc = ce.main(["--benchmark", "kodcode", "--dataset_path", str(kodcode_eval), "--model", str(tiny_model),
                  "--n", "2", "--k", "1,2", "--max_new_tokens", "24", "--batch_size", "4", "--workers", "2",
                  "--device", "cpu", "--output_dir", str(out), "--progress_bar", "false", "--timeout_s", "10"])
    assert rc == 0
    report = json.loads((out / "kodcode.json").read_text())["results"]
    assert report["samples"] == 6 and report["pass@1"] == 0.0 and report["pass@2"] == 0.0
    completions = [json.loads(line) for line in (out / "kodcode_completions.jsonl").read_text().splitlines()]
    assert len(completions) == 6
    samples = [json.loads(line) for line in (out / "kodcode_samples.jsonl").read_text().splitlines()]
    assert all(not s["passed"] and s["verdict"] in ("failed", "crashed", "timeout") for s in samples)
    ran = [s for s in samples if s["error_type"] != "EmptyCompletion"]  # garbage that reached the sandbox
    assert ran and report["syntax_errors"] + report["empty_completions"] <= 6
    # the completions file round-trips through --samples_file
    again = tmp_path / "again"
    assert ce.main(["--benchmark", "kodcode", "--dataset_path", str(kodcode_eval),
                    "--samples_file", str(out / "kodcode_completions.jsonl"), "--k", "1,2", "--workers", "2",
                    "--output_dir", str(again), "--progress_bar", "false"]) == 0
    assert json.loads((again / "kodcode.json").read_text())["results"]["pass@1"] == 0.0


def test_cli_rejects_bad_configs(tmp_path, capsys):
    for argv, message in (
        (["--benchmark", "humaneval"], "exactly one of --model"),
        (["--benchmark", "humaneval", "--model", "x", "--n", "1", "--k", "5"], "--n >= 5"),
        (["--benchmark", "apps", "--score_references", "true"], "unknown benchmark"),
    ):
        with pytest.raises(SystemExit) as exc:  # parse_config reports config errors the argparse way
            ce.main(argv + ["--output_dir", str(tmp_path)])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(ConfigError):
        ce.CodeEvalConfig(benchmark="humaneval", score_references=True, k=[1, 2])


@pytest.mark.slow
def test_eval_code_script_tiny_mode(tmp_path):
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, TEXT2GRAD_TINY="1", TINY_DIR=str(tmp_path / "tiny"), TINY_OUTPUT_DIR=str(tmp_path / "eval"))
    proc = subprocess.run(["bash", "scripts/eval_code.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the KodCode eval split is what prepare-data wrote for the tiny world (native layout), at most --limit 4
    kodcode_rows = len((tmp_path / "tiny" / "data" / "eval.jsonl").read_text().splitlines())
    for bench, problems in (("humaneval", 4), ("kodcode", min(4, kodcode_rows))):
        report = json.loads((tmp_path / "eval" / bench / f"{bench}.json").read_text())["results"]
        assert problems > 0 and report["problems"] == problems and report["pass@1"] == 0.0
