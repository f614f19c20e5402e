"""PPO with ``generation_backend: vllm`` on the real SmolLM2-135M-Instruct and the real vLLM engine: LoRA policy
iterations whose rollouts vLLM samples from the refreshed policy (on a CPU its adapter merged into whole weights), the log-prob check that shows the engine holds
the current policy (and that it would not without the refresh), and a full fine-tuning iteration whose weights are
reloaded into the engine.

Slow: the engine is the one shared by the whole pytest run (`tests/core/test_vllm_engine.py` starts it with the same
settings; alone, this file starts it, ~30-80 s on 2 CPU cores).
"""

from __future__ import annotations

import json

import pytest
import torch
from tests.policy_optimization.po_testlib import first_and_last_words
from tests.vllm_testlib import engine_for_tests
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.trainer import NLGradientPPOTrainer
from text2grad.core.assets import smollm2_path
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.generation import apply_chat_template

pytestmark = pytest.mark.slow

QUESTIONS = ["Name a fruit.", "Say hello to a friend.", "Describe a cat.", "Give me a number."]


def _trainer(tmp_path, **overrides) -> NLGradientPPOTrainer:
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    policy = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    settings = dict(
        model_name_or_path=str(path), generation_backend="vllm", dtype="fp32", use_lora=True, lora_r=8,
        lora_alpha=16, num_iterations=3, batch_size=4, num_mini_batches=1, num_ppo_epochs=2, response_length=12,
        temperature=1.0, learning_rate=5e-3, kl_coef=0.0, adaptive_kl=False, seed=0, save_steps=0,
        progress_bar=False, log_samples=0, max_feedback_error_rate=1.0, output_dir=str(tmp_path / "ppo"),
    )
    cfg = PPOConfig(**{**settings, **overrides})
    items = [{"prompt": apply_chat_template(tokenizer, q)} for q in QUESTIONS]
    critic = CallableFeedbackSource(first_and_last_words)
    return NLGradientPPOTrainer(cfg, tokenizer, policy, None, None, critic, items, base_model_path=str(path))


def test_lora_rollouts_stay_on_policy_and_drift_without_the_refresh(tmp_path):
    engine_for_tests()  # skips when vllm is not importable; shares the engine with the other vLLM tests
    trainer = _trainer(tmp_path)
    refreshed = [trainer.step() for _ in range(2)]
    for metrics in refreshed:
        assert metrics["vllm/logprob_abs_diff"] < 1e-3, metrics["vllm/logprob_abs_diff"]
        assert metrics["time/vllm_refresh"] >= 0 and torch.isfinite(torch.tensor(metrics["loss/policy"]))
    # The update moved the policy: LoRA B started at zero.
    assert any(float(p.abs().sum()) > 0 for n, p in trainer.policy.named_parameters() if "lora_B" in n)

    # Keep serving the adapter the engine had before the last update: its samples now come from an old policy
    # and the training model's log-probs of them differ far more.
    trainer.vllm_rollouts.refresh = lambda policy: None
    stale = trainer.step()
    assert stale["vllm/logprob_abs_diff"] > 5 * max(m["vllm/logprob_abs_diff"] for m in refreshed), (stale, refreshed)
    lines = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [round(m["vllm/logprob_abs_diff"], 6) for m in lines] == [
        round(m["vllm/logprob_abs_diff"], 6) for m in (*refreshed, stale)
    ]


def test_full_finetuning_reloads_the_updated_weights_into_the_engine(tmp_path):
    engine_for_tests()
    trainer = _trainer(tmp_path, use_lora=False, num_iterations=2, learning_rate=1e-4, value_model="shared_backbone")
    gaps = [trainer.step()["vllm/logprob_abs_diff"] for _ in range(2)]
    assert max(gaps) < 1e-3, gaps
