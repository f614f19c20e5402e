"""A CLI run really killed halfway (SIGKILL, SIGINT) and rerun yields every record exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.annotation.annotation_test_utils import SECRET_KEY, qa_records, write_jsonl
from tests.fake_openai import FakeOpenAIServer, quoting_handler

REPO = Path(__file__).resolve().parents[2]
N = 60


def _slow(delay_s: float):
    def handler(body, n):
        reply = quoting_handler(body, n)
        reply.delay_s = delay_s
        return reply

    return handler


def _start(server: FakeOpenAIServer, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "OPENAI_API_KEY": SECRET_KEY, "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_BASE_URL", None)
    cmd = [sys.executable, "-m", "text2grad.annotate", "--dataset_path", str(tmp_path / "in.jsonl"),
           "--output", str(tmp_path / "out.jsonl"), "--base_url", server.base_url, "--concurrency", "4",
           "--progress_bar", "false"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be killed: {proc.communicate()}")
        time.sleep(0.005)
    proc.kill()
    raise AssertionError(f"{path} never reached {n} lines")


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def _rerun_to_completion(tmp_path: Path) -> tuple[int, dict]:
    with FakeOpenAIServer(quoting_handler) as server:
        proc = _start(server, tmp_path)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert SECRET_KEY not in out + err
        return len(server.requests), json.loads((tmp_path / "out.jsonl.report.json").read_text())


@pytest.mark.multiprocess
def test_sigkill_mid_run_then_rerun_gives_every_record_exactly_once(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", qa_records(N))
    out = tmp_path / "out.jsonl"
    with FakeOpenAIServer(_slow(0.1)) as server:
        proc = _start(server, tmp_path)
        _wait_for_lines(out, 10, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    data = out.read_text()
    complete_lines = data.count("\n")
    assert 10 <= complete_lines < N  # really killed halfway
    done_before = set(_ids_complete(data))
    assert len(done_before) == complete_lines  # no duplicates even in the killed run

    requests, report = _rerun_to_completion(tmp_path)
    ids = _ids(out)  # every line parses
    assert sorted(ids) == sorted(f"r{i}" for i in range(N)) and len(ids) == N
    assert requests == N - len(done_before)  # done records were not asked again
    assert report["skipped_done"] == len(done_before) and report["complete"]


def _ids_complete(data: str) -> list[str]:
    """Ids of the complete lines (a torn last line without newline is ignored)."""
    lines = data.split("\n")[:-1]
    return [json.loads(line)["id"] for line in lines]


@pytest.mark.multiprocess
def test_sigint_stops_cleanly_with_a_report_and_rerun_completes(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", qa_records(N))
    out = tmp_path / "out.jsonl"
    with FakeOpenAIServer(_slow(0.1)) as server:
        proc = _start(server, tmp_path)
        _wait_for_lines(out, 5, proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout
    report = json.loads((tmp_path / "out.jsonl.report.json").read_text())
    assert report["interrupted"] and not report["complete"] and 5 <= report["done"] < N
    assert report["not_finished"] == N - report["done"] - report["failed"]
    assert out.read_text().endswith("\n") and len(_ids(out)) == report["done"]  # no torn line on a clean stop

    requests, report2 = _rerun_to_completion(tmp_path)
    ids = _ids(out)
    assert sorted(ids) == sorted(f"r{i}" for i in range(N)) and len(ids) == N
    assert requests == N - report["done"] and report2["done"] == N - report["done"]
