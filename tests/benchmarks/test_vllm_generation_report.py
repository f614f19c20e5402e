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


def test_the_thread_binding_sentence_follows_the_figures():
    figures = json.loads((RESULTS / "vllm_generation.json").read_text())
    figures["thread_binding"] = {"cores": 2, "batch": 64, "all_cores_seconds": 10.0, "vllm_binding_seconds": 15.0}
    assert "took 15.0 s instead of 10.0 s for the batch-64 rollouts (1.50x slower), which is why" in bench.report(figures)
    figures["thread_binding"].update(vllm_binding_seconds=8.0)
    assert "(1.25x faster): binding all of a process's cores did not pay" in bench.report(figures)


def test_the_spread_sentence_reads_each_iterations_time():
    figures = json.loads((RESULTS / "vllm_generation.json").read_text())
    figures["ppo_iteration"]["hf"]["totals"] = [30.0, 27.0]
    figures["ppo_iteration"]["vllm-merged"]["totals"] = [20.0, 18.0]
    assert "ranged from 1.35x (the fastest transformers iteration against the slowest vLLM one) to 1.67x." in (
        bench.report(figures))
