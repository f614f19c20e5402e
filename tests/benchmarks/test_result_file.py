"""The helpers every benchmark shares: memory readings and the fresh-process runner of one setting."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.result_file import peak_rss_mb, rss_mb, worker_result  # noqa: E402


def test_memory_readings_see_a_new_allocation():
    # In a fresh process: in this long-lived one, memory freed by earlier tests stays resident and a new block reuses it.
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from benchmarks.result_file import peak_rss_mb, rss_mb; "
        "before = rss_mb(); block = bytearray(64 * 2**20); block[::4096] = b'x' * len(block[::4096]); "
        "print('RESULT ' + json.dumps({'before': before, 'after': rss_mb(), 'peak': peak_rss_mb()}))"
    )
    reading = worker_result([sys.executable, "-c", probe, str(Path(__file__).resolve().parents[2])], env=dict(os.environ),
                            label="memory probe", timeout_s=120, too_slow="the probe only allocates 64 MiB")
    assert reading["after"] >= reading["before"] + 32  # 64 MiB touched, page by page
    assert reading["peak"] >= reading["after"] - 1


def test_worker_result_reads_the_last_result_line_and_names_a_failing_setting(capsys):
    ok = [sys.executable, "-c", "print('progress'); print('RESULT {\"x\": 1}'); print('RESULT {\"x\": 2}')"]
    assert worker_result(ok, env={}, label="setting a", timeout_s=60, too_slow="shrink it") == {"x": 2}
    with pytest.raises(SystemExit, match="setting b failed \\(exit 3\\)"):
        worker_result([sys.executable, "-c", "import sys; sys.exit(3)"], env={}, label="setting b", timeout_s=60,
                      too_slow="shrink it")
    with pytest.raises(SystemExit, match="setting c ran past its time limit \\(1 s\\): shrink it"):
        worker_result([sys.executable, "-c", "import time; time.sleep(30)"], env={}, label="setting c", timeout_s=1,
                      too_slow="shrink it")
