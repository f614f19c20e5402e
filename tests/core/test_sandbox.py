"""The sandbox against hostile programs: each must get the right verdict and leave no process behind."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import pytest

from text2grad.core import sandbox
from text2grad.core.sandbox import plan_mounts, run_python, run_tests


def _survivors(result) -> list[int]:
    """Processes still alive that belong to the run: its uid, or its run id in their environment."""
    marker = f"TEXT2GRAD_SANDBOX_RUN={result.run_id}".encode()
    alive = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if result.sandbox_uid is not None and os.stat(f"/proc/{pid}").st_uid == result.sandbox_uid:
                alive.append(pid)
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    alive.append(pid)
        except OSError:
            continue
    return [p for p in alive if not _zombie(p)]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def _clean(result) -> None:
    assert result.leftover_processes == 0
    assert _survivors(result) == []


@pytest.fixture
def degraded(monkeypatch):
    """Namespaces and the uid switch turned off, as on a platform without them."""
    monkeypatch.setenv("TEXT2GRAD_SANDBOX_DISABLE", "namespaces,setuid")
    sandbox.isolation(refresh=True)
    yield
    monkeypatch.delenv("TEXT2GRAD_SANDBOX_DISABLE")
    sandbox.isolation(refresh=True)


# --- ordinary programs ---------------------------------------------------------------------------------------


def test_passing_program_output_stdin_and_files():
    code = "import sys, helper\nprint(helper.greet(sys.stdin.read().strip()))\nprint('warn', file=sys.stderr)\n"
    r = run_python(code, stdin="world\n", files={"helper.py": "def greet(x):\n    return 'hello ' + x\n"}, timeout_s=10)
    assert r.verdict == "passed" and r.returncode == 0
    assert r.stdout == "hello world\n" and "warn" in r.stderr
    assert r.traceback is None and not r.truncated
    _clean(r)


def test_exception_is_failed_with_traceback():
    r = run_python("def f(x):\n    return 1 / x\n\nf(0)\n", timeout_s=10)
    assert r.verdict == "failed" and r.returncode == 1
    assert r.traceback.startswith("Traceback") and r.traceback.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "line 2, in f" in r.traceback


def test_syntax_error_is_failed():
    r = run_python("def f(:\n    pass\n", timeout_s=10)
    assert r.verdict == "failed" and "SyntaxError" in r.traceback


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-do-not-leak")
    r = run_python("import os, json\nprint(json.dumps(dict(os.environ)))\nprint(os.getcwd())\n", timeout_s=10)
    env = json.loads(r.stdout.splitlines()[0])
    assert "OPENAI_API_KEY" not in env and "sk-do-not-leak" not in r.stdout
    assert env["HOME"] == r.stdout.splitlines()[1] == env["TMPDIR"]
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONIOENCODING", "OMP_NUM_THREADS",
                        "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TEXT2GRAD_SANDBOX_RUN", "LC_CTYPE"}


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="relative path"):
        run_python("pass", files={"../escape.py": "x = 1"})


# --- hostile programs ----------------------------------------------------------------------------------------


def test_infinite_loop_times_out():
    t0 = time.monotonic()
    r = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert r.verdict == "timeout" and r.returncode is None
    assert 0.9 < r.duration_s < 3.0 and time.monotonic() - t0 < 8.0
    _clean(r)


def test_sleeping_program_times_out_and_its_children_die():
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '60'])\ntime.sleep(60)\n"
    r = run_python(code, timeout_s=1.0)
    assert r.verdict == "timeout"
    _clean(r)


def test_fork_bomb_hits_the_process_limit():
    if not sandbox.isolation().drop_uid and not sandbox.isolation().namespaces:
        pytest.fail("refusing to run a fork bomb without a uid switch or PID namespace")
    r = run_python("import os\nwhile True:\n    os.fork()\n", timeout_s=2.0, max_processes=32)
    assert r.verdict == "resource_limit"
    assert "Resource temporarily unavailable" in r.stderr
    _clean(r)


def test_memory_bomb_hits_the_memory_limit():
    r = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))\n", timeout_s=5.0, memory_mb=256)
    assert r.verdict == "resource_limit" and "MemoryError" in r.traceback
    _clean(r)


def test_huge_output_is_truncated():
    r = run_python("import sys\nsys.stdout.write('x' * 20_000_000)\n", timeout_s=10.0, max_output_bytes=10_000)
    assert r.verdict == "passed" and r.truncated
    assert r.stdout.startswith("x" * 10_000) and "truncated 19990000 of 20000000 bytes" in r.stdout
    assert len(r.stdout) < 10_200


def test_endless_output_times_out_with_bounded_capture():
    r = run_python("while True:\n    print('spam' * 1000)\n", timeout_s=1.0, max_output_bytes=5_000)
    assert r.verdict == "timeout" and r.truncated and len(r.stdout) < 5_200
    _clean(r)


def test_file_size_limit():
    r = run_python("open('big.bin', 'wb').write(b'0' * (3 * 2**20))\n", timeout_s=10.0, max_file_mb=1)
    assert r.verdict == "resource_limit" and "File too large" in r.traceback


@pytest.fixture(params=["all-layers", "no-namespaces"])
def layers(request, monkeypatch):
    """Run a test with every layer, then again without namespaces (the uid switch alone must protect files)."""
    if request.param == "no-namespaces":
        monkeypatch.setenv("TEXT2GRAD_SANDBOX_DISABLE", "namespaces")
    sandbox.isolation(refresh=True)
    yield request.param
    monkeypatch.delenv("TEXT2GRAD_SANDBOX_DISABLE", raising=False)
    sandbox.isolation(refresh=True)


def test_writing_outside_its_directory_fails(tmp_path, layers):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    victim.chmod(0o644)  # readable by anyone, writable only by its owner
    etc_target = f"/etc/text2grad-sandbox-{os.getpid()}"
    new_in_tmp = f"/tmp/text2grad-sandbox-escape-{os.getpid()}"
    code = f"""
import os
errors = []
for path, mode in (({str(victim)!r}, "w"), ({etc_target!r}, "w"), ({new_in_tmp!r}, "w")):
    try:
        with open(path, mode) as fh:
            fh.write("pwned")
    except OSError as exc:
        errors.append(type(exc).__name__)
open("inside.txt", "w").write("fine")
print(len(errors), open("inside.txt").read())
"""
    r = run_python(code, timeout_s=10)
    assert r.verdict == "passed"
    assert r.stdout.split()[1] == "fine"
    if r.sandbox_uid is None:
        # no uid switch (here: the interpreter lives under /root and there is no mount namespace to expose it),
        # so the program writes whatever the caller can: the documented degraded mode, warned about
        wrote_etc = os.path.exists(etc_target)
        if wrote_etc:
            os.remove(etc_target)
        assert "unprivileged-uid" not in r.layers and any("run as root" in n for n in sandbox.isolation().notes)
        assert victim.read_text() == "pwned" and wrote_etc
        return
    assert victim.read_text() == "original"
    assert not os.path.exists(etc_target)
    if sandbox.isolation().namespaces:  # /tmp is a private tmpfs: the write "succeeds" into a throwaway mount
        assert "namespaces" in r.layers and not os.path.exists(new_in_tmp)
    elif os.path.exists(new_in_tmp):  # a shared /tmp is writable by anyone: the documented gap without namespaces
        os.remove(new_in_tmp)
    assert int(r.stdout.split()[0]) >= 2


def test_kill_parent_and_caller_does_not_hurt_the_harness():
    code = f"""
import os, signal
for pid in (os.getppid(), {os.getpid()}):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as exc:
        print(type(exc).__name__)
os.killpg(0, signal.SIGKILL)
"""
    r = run_python(code, timeout_s=5)
    assert r.verdict == "crashed" and r.returncode == -9  # it killed its own process group, itself included
    assert r.stdout.count("Error") == 2  # both kills refused (EPERM, or ESRCH across the PID namespace)
    _clean(r)


def test_segfault_is_crashed():
    r = run_python("import ctypes\nctypes.string_at(0)\n", timeout_s=5)
    assert r.verdict == "crashed" and r.returncode == -11


def test_sys_exit_and_os_exit_status():
    assert run_python("import sys; sys.exit(3)", timeout_s=5).verdict == "failed"
    assert run_python("import os; os._exit(4)", timeout_s=5).returncode == 4


def test_detached_daemon_is_killed():
    code = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(120)
    os._exit(0)
print("parent done")
"""
    r = run_python(code, timeout_s=5)
    assert r.verdict == "passed"
    _clean(r)


class _Listener:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                continue

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def test_socket_cannot_reach_the_network():
    listener = _Listener()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {listener.port}), timeout=2)\nprint('connected')\n"
    try:
        isolated = run_python(code, timeout_s=5)
        open_net = run_python(code, timeout_s=5, network=True)
        time.sleep(0.3)
    finally:
        listener.close()
    if sandbox.isolation().namespaces:
        assert isolated.network_isolated
        assert isolated.verdict == "failed" and "connected" not in isolated.stdout
        assert "Network is unreachable" in isolated.traceback
        assert open_net.verdict == "passed" and not open_net.network_isolated
        assert listener.accepted == 1  # only the run with network=True got through
    else:
        assert not isolated.network_isolated and isolated.verdict == "passed"
    _clean(isolated)
    _clean(open_net)


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
    _clean(r)


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
    _clean(r)


def test_os_exit_inside_a_test_is_crashed():
    tests = "import os\nfrom solution import add\n\ndef test_ok():\n    assert add(1, 1) == 2\n\ndef test_exit():\n    os._exit(0)\n\ndef test_after():\n    pass\n"
    r = run_tests("def add(a, b):\n    return a + b\n", tests, timeout_s=10)
    assert r.verdict == "crashed" and r.returncode == 0
    assert [(t.name, t.passed, t.error_type) for t in r.tests] == [
        ("test_ok", True, None), ("test_exit", False, "ProcessExit"), ("test_after", False, "NotRun")]
    _clean(r)


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
    _clean(whole)


def test_memory_bomb_inside_a_test_is_resource_limit():
    tests = "def test_bomb():\n    x = bytearray(8 * 2**30)\n\ndef test_fine():\n    assert True\n"
    r = run_tests("", tests, timeout_s=10, memory_mb=256)
    assert r.verdict == "resource_limit" and r.tests[0].error_type == "MemoryError" and r.tests[1].passed


def test_fork_bomb_inside_a_test_leaves_nothing():
    tests = "import os, time\n\ndef test_bomb():\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            time.sleep(0.01)\n"
    r = run_tests("", tests, timeout_s=1.5, max_processes=16)
    assert r.verdict == "timeout"
    _clean(r)


# --- degraded platforms ----------------------------------------------------------------------------------------


def test_without_namespaces_and_setuid_warns_and_still_cleans_up(degraded, caplog):
    with caplog.at_level(logging.WARNING, logger="text2grad.core.sandbox"):
        iso = sandbox.isolation(refresh=True)
    assert not iso.namespaces and not iso.drop_uid
    assert any("network" in rec.getMessage() for rec in caplog.records)
    code = "import os, time, subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)\nprint('started')\n"
    r = run_python(code, timeout_s=5)
    assert r.verdict == "passed" and not r.network_isolated and r.sandbox_uid is None
    assert "namespaces" not in r.layers and "unprivileged-uid" not in r.layers
    _clean(r)
    loop = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert loop.verdict == "timeout"
    _clean(loop)
    # the program's parent is the bootstrap process, not us: killing it ends the run, the harness lives on
    parent = run_python("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(30)\n", timeout_s=5)
    assert parent.verdict == "crashed" and parent.duration_s < 4.5
    _clean(parent)


# --- pure helpers --------------------------------------------------------------------------------------------


def test_plan_mounts_hides_dirs_and_binds_back_kept_paths():
    plan = plan_mounts(
        hide=["/tmp", "/root", "/var/tmp", "/work"],
        keep=["/tmp/t2g-sandbox-1", "/root/.pyenv/versions/3.11", "/root/.pyenv", "/work"],
    )
    assert plan == [("/root", ["/root/.pyenv"]), ("/tmp", ["/tmp/t2g-sandbox-1"]), ("/var/tmp", [])]
    assert plan_mounts(["/tmp"], ["/"]) == []
