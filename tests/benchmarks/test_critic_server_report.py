"""The critic-server benchmark's notes (benchmarks/critic_server.py `report`): every number and verdict comes from the
measured figures; the committed figures give the committed notes, pasted into the benchmark notes unchanged."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import critic_server as bench  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "critic_server"


def test_the_committed_notes_are_the_report_of_the_committed_figures():
    figures = json.loads((RESULTS / "critic_server.json").read_text())
    report = bench.report(figures)
    assert report == (RESULTS / "critic_server.md").read_text()
    assert report in (ROOT / "benchmarks" / "README.md").read_text()


def test_the_verdict_follows_the_figures():
    figures = json.loads((RESULTS / "critic_server.json").read_text())
    base = figures["ppo_iteration"]["in-process hf"]["total"]
    for served, verdict in ((base * 1.5, "slower than"), (base * 0.5, "faster than"), (base * 1.01, "within 5 % of")):
        changed = copy.deepcopy(figures)
        changed["ppo_iteration"]["server"]["total"] = served
        assert f"a PPO iteration is {verdict} the in-process" in bench.report(changed)
