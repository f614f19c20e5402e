"""The vLLM benchmark's notes (benchmarks/vllm_generation.py `report`): every number and verdict comes from the
measured figures; the committed figures give the committed notes."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import vllm_generation as bench  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "vllm_generation"


def test_the_committed_notes_are_the_report_of_the_committed_figures():
    figures = json.loads((RESULTS / "vllm_generation.json").read_text())
    report = bench.report(figures)
    assert report == (RESULTS / "vllm_generation.md").read_text()
    assert report in (ROOT / "benchmarks" / "README.md").read_text()  # pasted into the benchmark notes unchanged


def test_the_sentences_follow_the_figures():
    figures = json.loads((RESULTS / "vllm_generation.json").read_text())
    ppo = figures["ppo_iteration"]
    slow = copy.deepcopy(figures)
    slow["ppo_iteration"]["vllm-merged"].update(total=ppo["hf"]["total"] / 1.2)
    fast = copy.deepcopy(figures)
    fast["ppo_iteration"]["vllm-merged"].update(total=ppo["hf"]["total"] / 1.6, forward=1.0, update=2.0)
    assert "(1.20x)" in bench.report(slow) and "does not meet the 1.5x goal" in bench.report(slow)
    text = bench.report(fast)
    assert "(1.60x)" in text and "the merged engine meets the 1.5x goal" in text
    bound = ppo["hf"]["total"] / 3.0
    assert "forward passes and PPO update (3.0 s)" in text and f"would be {bound:.2f}x faster" in text
