"""Side-by-side jobs and thread counts of the quickstart (text2grad/apps/quickstart/parallel.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from text2grad.apps.quickstart.parallel import iterations_done, run_side_by_side, torch_threads, usable_cores
from text2grad.apps.quickstart.presets import resolve
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig


def report_job(tag: str) -> dict:
    """A job for a worker process: prints to stdout and stderr, returns what it saw."""
    print(f"stdout of {tag}")
    os.write(2, f"stderr of {tag} (file descriptor 2)\n".encode())
    return {"tag": tag, "threads": torch.get_num_threads(), "pid": os.getpid(), "marker": os.environ.get("QS_MARKER")}


def failing_job(tag: str) -> None:
    raise ValueError(f"{tag} could not go on")


def mark_environment() -> None:
    os.environ["QS_MARKER"] = "setup ran"


def test_torch_threads_sets_and_restores_the_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(0):  # 0: unchanged
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("restored even on an error")
    assert torch.get_num_threads() == before


def test_iterations_done_reads_the_last_logged_iteration(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert iterations_done(metrics) == 0  # no file yet
    metrics.write_text(json.dumps({"iteration": 1, "loss": 0.5}) + "\n" + json.dumps({"iteration": 2}) + '\n{"iterat')
    assert iterations_done(metrics) == 2  # the half-written third line is skipped


def test_jobs_run_in_their_own_processes_on_one_thread_with_their_output_in_their_logs(tmp_path, capsys):
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    results = run_side_by_side([("job a", report_job, ("a",)), ("job b", report_job, ("b",))], logs,
                               progress=lambda: (0, 2), setup=mark_environment, threads=1)
    assert [r["tag"] for r in results] == ["a", "b"]  # job order
    assert all(r["threads"] == 1 and r["pid"] != os.getpid() and r["marker"] == "setup ran" for r in results)
    for tag, log in zip("ab", logs):
        text = log.read_text()
        assert f"stdout of {tag}" in text and f"stderr of {tag} (file descriptor 2)" in text
    printed = capsys.readouterr().out
    assert f"job a: output in {logs[0]}" in printed and "stdout of a" not in printed


def test_a_failed_job_is_named_with_its_log(tmp_path):
    logs = [tmp_path / "ok.log", tmp_path / "bad.log"]
    with pytest.raises(RuntimeError, match=r"job bad failed: bad could not go on \(its output: .*bad\.log\)"):
        run_side_by_side([("job ok", report_job, ("ok",)), ("job bad", failing_job, ("bad",))], logs)
    assert "stdout of ok" in logs[0].read_text()  # the other job still finished


def test_tiny_presets_decode_on_one_thread_side_by_side_and_smollm2_does_not():
    for preset in ("ci", "default", "large"):
        cfg = resolve(QuickstartConfig(preset=preset))
        assert (cfg.decode_threads, cfg.parallel_modes) == (1, True)
    cfg = resolve(QuickstartConfig(preset="default", decode_threads=0, parallel_modes=False))
    assert (cfg.decode_threads, cfg.parallel_modes) == (0, False)  # a user's setting beats the preset
    with pytest.raises(ValueError, match="decode_threads must be >= 0"):
        resolve(QuickstartConfig(preset="ci", decode_threads=-1))


def test_smollm2_preset_runs_its_modes_one_after_the_other(monkeypatch, tmp_path):
    # the preset resolves the installed SmolLM2 path; only the knobs matter here
    monkeypatch.setattr("text2grad.apps.quickstart.presets.smollm2_path", lambda: tmp_path)
    cfg = resolve(QuickstartConfig(preset="smollm2"))
    assert (cfg.decode_threads, cfg.parallel_modes) == (0, False)


def test_usable_cores_follows_the_affinity_mask():
    # a process pinned to one core (as under `taskset -c 0`) runs one job at a time, whatever the machine has
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from text2grad.apps.quickstart.parallel import usable_cores; print(usable_cores())")
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
    assert usable_cores() == len(os.sched_getaffinity(0))
