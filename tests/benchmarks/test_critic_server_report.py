"""The critic-server benchmark's notes (benchmarks/critic_server.py `report`): every number and verdict comes from
the measured figures; the committed figures give the committed notes."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import critic_server as bench  # noqa: E402
from benchmarks.results_tables import critic_server_row  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "critic_server"


def figures() -> dict:
    return json.loads((RESULTS / "critic_server.json").read_text())


def test_the_committed_notes_are_the_report_of_the_committed_figures():
    report = bench.report(figures())
    assert report == (RESULTS / "critic_server.md").read_text()
    assert report in (ROOT / "benchmarks" / "README.md").read_text()  # pasted into the benchmark notes unchanged


def test_the_verdict_and_ratios_follow_the_figures():
    base = figures()
    hf = base["ppo_iteration"]["in-process hf"]["total"]
    slow, fast, even = (copy.deepcopy(base) for _ in range(3))
    slow["ppo_iteration"]["server"]["total"] = hf * 1.5
    fast["ppo_iteration"]["server"]["total"] = hf * 0.5
    even["ppo_iteration"]["server"]["total"] = hf * 1.01
    assert "is slower than the in-process transformers critic" in bench.report(slow) and "1.50x)" in bench.report(slow)
    assert "is faster than" in bench.report(fast) and "0.50x)" in bench.report(fast)
    assert "is within 5 % of" in bench.report(even)
    slow["ppo_iteration"]["in-process vllm"] = dict(slow["ppo_iteration"]["in-process hf"], total=hf * 0.75)
    assert f"({hf * 0.75:.1f} s) the served critic's iteration took 2.00x as long" in bench.report(slow)
    del slow["ppo_iteration"]["in-process vllm"]
    assert "same vLLM engine" not in bench.report(slow)


def test_the_machine_is_called_shared_or_idle_from_its_load():
    busy, quiet = copy.deepcopy(figures()), copy.deepcopy(figures())
    busy["load_before"], busy["load_after"] = [4.2, 3.0, 2.0], [5.1, 4.0, 3.0]
    quiet["load_before"], quiet["load_after"] = [0.2, 0.1, 0.1], [1.3, 0.5, 0.2]
    assert "The machine was shared with other work (1-minute load average 4.2 at the start, 5.1 at the end)" in bench.report(busy)
    assert "The machine was idle (1-minute load average 0.2 at the start, 1.3 at the end)" in bench.report(quiet)


def test_the_index_headline_follows_the_figures():

    quiet = copy.deepcopy(figures())
    quiet["load_before"] = [0.4, 0.3, 0.2]
    quiet["ppo_iteration"]["in-process hf"]["total"], quiet["ppo_iteration"]["server"]["total"] = 20.0, 30.0
    quiet["server_startup_seconds"] = 61.4
    row, headline = critic_server_row(quiet)
    assert headline.startswith("PPO iteration 30.0 s with the critic behind vLLM's server vs 20.0 s in-process "
                               "(transformers), 1.50x; server start-up 61 s;")
    assert headline.endswith("idle (load 0.4)") and "; idle (load 0.4 -> " in row[2]
    busy = copy.deepcopy(figures())
    busy["load_before"] = [5.0, 4.0, 3.0]
    assert critic_server_row(busy)[1].endswith("shared with other jobs (load 5.0)")
