"""The sandbox's test runner: per-test outcomes, fixtures, parametrize, exits and limits inside tests."""

from __future__ import annotations

import json

from tests.core.sandbox.sandbox_testlib import assert_clean
from text2grad.core.sandbox import plan_mounts, run_tests


# --- the test runner -----------------------------------------------------------------------------------------


SOLUTION = """def add(a, b):
    return helper(a) + b


def helper(a):
    if a == 3:
        raise ValueError("three")
    return a
"""


def test_runner_reports_each_test():
    tests = """import pytest
from solution import add

def test_ok():
    assert add(1, 2) == 3

def test_wrong():
    assert add(1, 1) == 3

def test_raises_in_solution():
    add(3, 1)

@pytest.mark.parametrize("a,b,c", [(1, 1, 2), pytest.param(2, 2, 5)])
def test_param(a, b, c):
    assert add(a, b) == c

@pytest.mark.parametrize("x", [0, 1])
def test_single(x):
    assert add(x, 0) == x

class TestGroup:
    def setup_method(self, method):
        self.base = 10

    def test_method(self):
        assert add(self.base, 1) == 11

@pytest.fixture
def numbers():
    yield [1, 2]

def test_fixture(numbers, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("X", "1")
    print("out")
    (tmp_path / "f").write_text("z")
    assert capsys.readouterr().out == "out\\n" and add(*numbers) == 3
"""
    r = run_tests(SOLUTION, tests, timeout_s=20)
    by = {t.name: t for t in r.tests}
    assert list(by) == ["test_ok", "test_wrong", "test_raises_in_solution", "test_param[0]", "test_param[1]",
                        "test_single[0]", "test_single[1]", "TestGroup::test_method", "test_fixture"]
    assert r.verdict == "failed" and r.num_passed == 6
    assert by["test_wrong"].error_type == "AssertionError" and by["test_wrong"].message == "assert add(1, 1) == 3"
    raised = by["test_raises_in_solution"]
    assert raised.error_type == "ValueError" and raised.message == "three"
    assert raised.solution_lines == [2, 7]  # add() calls helper() at line 2, which raises at line 7
    assert "sandbox.py" not in raised.traceback and "solution.py\", line 7" in raised.traceback
    assert not by["test_param[1]"].passed and by["test_param[0]"].passed
    assert by["test_fixture"].passed, by["test_fixture"].traceback
    assert_clean(r)


def test_all_passing_and_plain_assert_scripts():
    r = run_tests("def add(a, b):\n    return a + b\n", "from solution import add\n\ndef test_a():\n    assert add(2, 2) == 4\n")
    assert r.verdict == "passed" and [t.name for t in r.tests] == ["test_a"]
    humaneval_style = "def check(candidate):\n    assert candidate(1, 2) == 3\n\nfrom solution import *\ncheck(add)\n"
    ok = run_tests("def add(a, b):\n    return a + b\n", humaneval_style)
    bad = run_tests("def add(a, b):\n    return a - b\n", humaneval_style)
    assert ok.verdict == "passed" and [t.name for t in ok.tests] == ["<module>"]
    assert bad.verdict == "failed" and bad.tests[0].name == "<collection>" and bad.tests[0].error_type == "AssertionError"
    assert bad.tests[0].solution_lines == []  # the wrong answer was returned, not raised inside solution.py


def test_broken_solution_fails_collection_with_its_line():
    r = run_tests("def add(a, b)\n    return a + b\n", "from solution import add\n\ndef test_a():\n    assert add(1, 1) == 2\n")
    assert r.verdict == "failed"
    assert r.tests[0].name == "<collection>" and r.tests[0].error_type == "SyntaxError" and r.tests[0].solution_lines == [1]


def test_sys_exit_inside_a_test_fails_only_that_test():
    tests = "import sys\nfrom solution import add\n\ndef test_exit():\n    sys.exit(0)\n\ndef test_after():\n    assert add(1, 1) == 2\n"
    r = run_tests("def add(a, b):\n    return a + b\n", tests, timeout_s=10)
    assert r.verdict == "failed"
    assert [(t.name, t.passed, t.error_type) for t in r.tests] == [("test_exit", False, "SystemExit"), ("test_after", True, None)]
    assert_clean(r)


def test_os_exit_inside_a_test_is_crashed():
    tests = "import os\nfrom solution import add\n\ndef test_ok():\n    assert add(1, 1) == 2\n\ndef test_exit():\n    os._exit(0)\n\ndef test_after():\n    pass\n"
    r = run_tests("def add(a, b):\n    return a + b\n", tests, timeout_s=10)
    assert r.verdict == "crashed" and r.returncode == 0
    assert [(t.name, t.passed, t.error_type) for t in r.tests] == [
        ("test_ok", True, None), ("test_exit", False, "ProcessExit"), ("test_after", False, "NotRun")]
    assert_clean(r)


def test_solution_exiting_at_import_is_not_a_pass():
    r = run_tests("import os\nos._exit(0)\n", "from solution import *\n\ndef test_a():\n    assert True\n", timeout_s=10)
    assert r.verdict == "crashed" and not r.passed


def test_stdout_cannot_forge_results():
    forged = "\n".join(json.dumps(e) for e in (
        {"event": "result", "name": "test_a", "passed": True, "verdict": "passed"}, {"event": "done"}))
    solution = f"import sys\nprint({forged!r})\nprint({forged!r}, file=sys.stderr)\ndef add(a, b):\n    return 0\n"
    r = run_tests(solution, "from solution import add\n\ndef test_a():\n    assert add(1, 1) == 2\n", timeout_s=10)
    assert r.verdict == "failed" and not r.tests[0].passed and '"passed": true' in r.stdout


def test_per_test_timeout_and_whole_run_timeout():
    tests = "from solution import add\n\ndef test_spin():\n    while True:\n        pass\n\ndef test_next():\n    assert add(1, 2) == 3\n"
    r = run_tests("def add(a, b):\n    return a + b\n", tests, timeout_s=10, per_test_timeout_s=0.5)
    assert r.verdict == "timeout"
    assert [(t.name, t.verdict) for t in r.tests] == [("test_spin", "timeout"), ("test_next", "passed")]
    whole = run_tests("def add(a, b):\n    return a + b\n", tests, timeout_s=1.0)
    assert whole.verdict == "timeout" and whole.tests[0].error_type == "Timeout" and whole.tests[1].error_type == "NotRun"
    assert_clean(whole)


def test_memory_bomb_inside_a_test_is_resource_limit():
    tests = "def test_bomb():\n    x = bytearray(8 * 2**30)\n\ndef test_fine():\n    assert True\n"
    r = run_tests("", tests, timeout_s=10, memory_mb=256)
    assert r.verdict == "resource_limit" and r.tests[0].error_type == "MemoryError" and r.tests[1].passed


def test_fork_bomb_inside_a_test_leaves_nothing():
    tests = "import os, time\n\ndef test_bomb():\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            time.sleep(0.01)\n"
    r = run_tests("", tests, timeout_s=1.5, max_processes=16)
    assert r.verdict == "timeout"
    assert_clean(r)


# --- pure helpers --------------------------------------------------------------------------------------------


def test_plan_mounts_hides_dirs_and_binds_back_kept_paths():
    plan = plan_mounts(
        hide=["/tmp", "/root", "/var/tmp", "/work"],
        keep=["/tmp/t2g-sandbox-1", "/root/.pyenv/versions/3.11", "/root/.pyenv", "/work"],
    )
    assert plan == [("/root", ["/root/.pyenv"]), ("/tmp", ["/tmp/t2g-sandbox-1"]), ("/var/tmp", [])]
    assert plan_mounts(["/tmp"], ["/"]) == []


def test_plan_mounts_exposes_a_private_folder_even_inside_a_kept_one():
    """A venv behind a symlink whose real folder is private (700) inside the kept script folder: the private folder
    gets its own tmpfs showing only the venv; a folder that is itself kept is left as it is."""
    plan = plan_mounts(hide=["/tmp"], keep=["/tmp/proj", "/tmp/proj/disk/private/venv", "/tmp/proj/disk/private/venv/lib"],
                       expose=["/tmp/proj/disk/private", "/tmp/proj"])
    assert plan == [("/tmp", ["/tmp/proj"]), ("/tmp/proj/disk/private", ["/tmp/proj/disk/private/venv"])]
