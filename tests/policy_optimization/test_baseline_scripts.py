"""The paper's baselines through the per-dataset script in tiny mode: scalar RM -> scalar-RM PPO, and GRPO."""

from __future__ import annotations

import json

import pytest

from tests.policy_optimization.test_training_scripts import read_metrics, run_script


@pytest.mark.slow
def test_scalar_rm_ppo_and_grpo_phases_run_in_tiny_mode(tmp_path):
    proc = run_script("train_slf5k.sh", tmp_path, PHASES="scalar_rm ppo_scalar grpo")
    tiny = tmp_path / "tiny"
    for phase in ("scalar_rm", "ppo_scalar", "grpo"):
        assert f"phase: {phase}" in proc.stdout
    # the scalar reward model, trained on SLF5K's comparison pairs, evaluated on held-out pairs
    report = json.loads((tiny / "scalar_rm" / "eval_pairwise.json").read_text())
    assert report["pairs"] >= 1 and 0.0 <= report["accuracy"] <= 1.0
    # scalar PPO: no critic, no span alignment; the whole reward is the scalar model's score
    metrics = read_metrics(tiny / "ppo_scalar")
    assert [m["iteration"] for m in metrics] == [1, 2]
    assert all(m["spans/quotes"] == 0 and m["tokens/labelled_share"] == 0 for m in metrics)
    assert all(m["reward/score_mean"] != 0 for m in metrics)  # a real (non-zero) model score reached PPO
    samples = [json.loads(line) for line in (tiny / "ppo_scalar" / "samples.jsonl").read_text().splitlines()]
    assert samples and samples[0]["feedback_prompt"] == samples[0]["prompt"]  # scored with the prompt it was trained on
    # GRPO with the same critic as the tiny PPO (reference summaries)
    rows = [json.loads(line) for line in (tiny / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "text2grad/nonzero_reward_share" in r] == [1, 2]
    assert (tiny / "grpo" / "adapter_config.json").is_file()
