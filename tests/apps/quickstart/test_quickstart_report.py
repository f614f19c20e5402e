"""Report helpers: log-prob bookkeeping, rollout curves from samples.jsonl, the PNG, the results table, and
the benchmark's iterations-to-target rule."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from text2grad.apps.quickstart.pipeline import QuickstartConfig, resolve, results_table
from text2grad.apps.quickstart.report import logprob_shift, plot_curves, rollout_curves, token_logprobs
from text2grad.apps.quickstart.task import FactCritic, TaskConfig, generate_task

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from quickstart_modes import first_reaching  # noqa: E402


def test_token_logprobs_match_a_manual_softmax(bpe_tokenizer, tiny_llama):
    prompt = bpe_tokenizer("The author wrote")["input_ids"]
    response = bpe_tokenizer(" a novel", add_special_tokens=False)["input_ids"]
    got = token_logprobs(tiny_llama.eval(), prompt, response)
    with torch.no_grad():
        logits = tiny_llama(input_ids=torch.tensor([prompt + response])).logits[0]
    want = [float(torch.log_softmax(logits[len(prompt) - 1 + i], -1)[t]) for i, t in enumerate(response)]
    assert len(got) == len(response) and got == pytest.approx(want, abs=1e-5)


def test_logprob_shift_groups_tokens_by_label():
    items = [
        {"labels": [1, -1, 0], "logp": {"sft": [-1.0, -1.0, -1.0], "t2g": [-0.5, -3.0, -1.0]}},
        {"labels": [-1], "logp": {"sft": [-2.0], "t2g": [-3.0]}},
    ]
    out = logprob_shift(items, "t2g")
    assert out["good"] == pytest.approx(0.5) and out["poor"] == pytest.approx(-1.5) and out["neutral"] == 0.0
    assert math.isnan(logprob_shift([{"labels": [0], "logp": {"sft": [0.0], "t2g": [0.0]}}], "t2g")["good"])


def test_rollout_curves_score_every_logged_rollout(tmp_path):
    rec = generate_task(TaskConfig(seed=1, n_train=1, n_rl=2, n_eval=1))["rl"]
    critic = FactCritic(records=rec)
    rows = [
        {"iteration": 1, "prompt": rec[0]["prompt"], "response": rec[0]["reference"],
         "feedback": {"critique": "", "good_spans": ["a", "b"], "poor_spans": [], "error": None}},
        {"iteration": 1, "prompt": rec[1]["prompt"], "response": " nothing",
         "feedback": {"critique": "", "good_spans": [], "poor_spans": [], "error": "invalid JSON"}},
        {"iteration": 2, "prompt": rec[1]["prompt"], "response": rec[1]["reference"],
         "feedback": {"critique": "", "good_spans": ["a"], "poor_spans": ["b", "c", "d"], "error": None}},
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = rollout_curves(path, critic)
    assert [p["iteration"] for p in curve] == [1, 2]
    assert curve[0]["rm_score"] == pytest.approx(0.5)  # (1 + 0) / 2: the failed feedback scores 0
    assert curve[1]["rm_score"] == pytest.approx(-0.5)
    assert curve[0]["true_fact_score"] == pytest.approx(0.5)  # reference 1.0 and " nothing" 0.0
    assert curve[1]["true_fact_score"] == pytest.approx(1.0)
    assert math.isnan(rollout_curves(path)[0]["true_fact_score"])  # no critic: unknown, not zero
    assert rollout_curves(tmp_path / "missing.jsonl", critic) == []


def test_plot_curves_writes_a_png(tmp_path):
    curves = {m: [{"iteration": 0, "fact_score": 0.1, "rougeL": 0.3}, {"iteration": 5, "fact_score": s, "rougeL": 0.4}]
              for m, s in (("nl_gradient", 0.4), ("scalar", 0.2))}
    rollouts = {m: [{"iteration": i, "rm_score": 0.1 * i, "true_fact_score": 0.05 * i} for i in range(1, 6)] for m in curves}
    metrics = {m: [{"iteration": i, "objective/kl": 0.2 * i} for i in range(1, 6)] for m in curves}
    png = plot_curves(tmp_path / "c.png", curves, rollouts, metrics)
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


def test_results_table_and_presets():
    table = results_table({"sft": {"fact_score": 0.25, "bleu": 10.0}, "nl_gradient": {"fact_score": 0.5, "bleu": 12.5}})
    assert "| SFT policy | 0.250 | 10.000 |" in table and "| Text2Grad (NL-gradient PPO) | 0.500 | 12.500 |" in table
    cfg = resolve(QuickstartConfig(preset="ci", sft_steps=3))
    assert cfg.sft_steps == 3 and cfg.hidden_size == 32 and cfg.ppo_seed == cfg.seed
    assert cfg.policy_sft_steps == 1  # PPO starts halfway through SFT unless told otherwise
    with pytest.raises(ValueError, match="policy_sft_steps must be between 1 and sft_steps"):
        resolve(QuickstartConfig(preset="ci", sft_steps=4, policy_sft_steps=5))
    with pytest.raises(ValueError, match="modes"):
        resolve(QuickstartConfig(modes=["ppo"]))


def test_first_reaching_is_the_first_positive_iteration_at_or_above_target():
    pts = [(0, 0.5), (5, 0.2), (10, 0.41), (15, 0.6)]
    assert first_reaching(pts, 0.4) == 10
    assert first_reaching(pts, 0.7) is None
    assert first_reaching(pts, 0.1) == 5  # iteration 0 (the SFT policy) never counts
