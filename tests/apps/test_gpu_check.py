"""The GPU check's CPU-side logic (`text2grad.apps.gpu_check`): steps with their own time limits, output printed and
logged as it comes, a summary rewritten after every step, the refusal without CUDA, argument errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from text2grad.apps import gpu_check
from text2grad.apps.gpu_check import STEP_NAMES, STEP_TIMEOUTS, Step, default_steps, run_steps

ROOT = Path(__file__).resolve().parents[2]


def python_step(name: str, code: str, timeout_s: float = 60.0, **kwargs) -> Step:
    return Step(name, (sys.executable, "-c", code), timeout_s, **kwargs)


def test_steps_run_in_order_with_their_own_limits_and_a_summary_after_each(tmp_path, capsys):
    out = tmp_path / "check"
    result = tmp_path / "figures.json"
    steps = [
        python_step("measures", f"import json; print('measuring'); open({str(result)!r}, 'w').write(json.dumps({{'s': 1.5}}))",
                    result=str(result)),
        # reads the summary as it stands while it runs: the first step is already in, the run not finished
        python_step("reads_summary", f"print(open({str(out / 'gpu_check.json')!r}).read().replace(chr(10), ' '))"),
        python_step("fails", "import sys; print('broken'); sys.exit(3)"),
        # a child that outlives its parent is stopped with it (the whole process group)
        python_step("hangs", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                             "'import time; time.sleep(60)']); print('started', flush=True); time.sleep(60)", timeout_s=2),
        python_step("optional", "print('never')", skip="the package is not installed"),
    ]
    t0 = time.perf_counter()
    summary = run_steps(steps, out, {"gpus": []}, cwd=tmp_path)
    assert time.perf_counter() - t0 < 30  # the hanging step was stopped at its 2 s limit
    by_name = {s["name"]: s for s in summary["steps"]}
    assert [s["name"] for s in summary["steps"]] == ["measures", "reads_summary", "fails", "hangs", "optional"]
    assert by_name["measures"]["status"] == "ok" and by_name["measures"]["result"] == {"s": 1.5}
    assert (by_name["fails"]["status"], by_name["fails"]["returncode"]) == ("failed", 3)
    assert by_name["hangs"]["status"] == "timeout" and by_name["hangs"]["seconds"] < 10
    assert by_name["optional"] == {"name": "optional", "command": f"{sys.executable} -c print('never')", "timeout_s": 60.0,
                                   "status": "skipped", "reason": "the package is not installed"}
    assert json.loads((out / "gpu_check.json").read_text()) == json.loads(json.dumps(summary)) and summary["finished"]
    log = (out / "gpu_check.log").read_text()
    mid_run = next(line for line in log.splitlines() if line.startswith("[reads_summary] "))
    seen = json.loads(mid_run[len("[reads_summary] "):])
    assert not seen["finished"] and [s["name"] for s in seen["steps"]] == ["measures"]
    for line in ("[measures] measuring", "[fails] broken", "[hangs] started", "== hangs: timeout in",
                 "== optional: skipped: the package is not installed", "not ok: fails (failed), hangs (timeout)"):
        assert line in log, line
    assert "[measures] measuring" in capsys.readouterr().out  # printed as it goes, not only logged


def test_the_default_steps_and_their_limits(tmp_path, monkeypatch):
    steps = default_steps(tmp_path, timeout_scale=2.0, python="py")
    assert tuple(s.name for s in steps) == STEP_NAMES
    assert all(s.timeout_s == 2.0 * STEP_TIMEOUTS[s.name] for s in steps)
    ppo = next(s for s in steps if s.name == "ppo_1b")
    assert ppo.argv[:4] == ("py", "benchmarks/ppo_token_level_overhead.py", "--preset", "gpu-1b")
    assert ppo.result == str(tmp_path / "ppo_1b.json")
    tests = next(s for s in steps if s.name == "gpu_tests")
    assert tests.argv[1:5] == ("-m", "pytest", "-m", "gpu")

    monkeypatch.setattr(gpu_check, "vllm_installed", lambda: False)
    vllm = next(s for s in default_steps(tmp_path) if s.name == "vllm")
    assert vllm.skip == "vllm is not installed (the 'vllm' extra of env.sh installs it)"
    monkeypatch.setattr(gpu_check, "vllm_installed", lambda: True)
    vllm = next(s for s in default_steps(tmp_path) if s.name == "vllm")
    assert vllm.skip is None and vllm.argv[1:] == ("benchmarks/vllm_generation.py", "--device", "cuda", "--iterations", "1", "--out",
                                                    str(tmp_path / "vllm.json"))


def test_without_cuda_the_script_exits_2_saying_so(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU of this machine
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--output_dir", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no CUDA GPU is visible to torch") and "README: On a GPU node" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("flags, message", [
    (["--steps", '["quickstart", "bogus"]'], "unknown step(s) ['bogus']: choose from quickstart, gpu_tests, ppo_1b, vllm"),
    (["--timeout_scale", "0"], "timeout_scale must be > 0, got 0.0"),
])
def test_bad_arguments_exit_2_before_anything_runs(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:  # the parser's own exit, as for every command
        gpu_check.main(flags)
    assert exc.value.code == 2 and message in capsys.readouterr().err
