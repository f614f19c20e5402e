"""Tiny PPO set-ups for the trainer tests: a 2-layer Llama, a value model, prompts and a critic."""

from __future__ import annotations

import pytest
from accelerate.state import AcceleratorState, GradientState
from tests.policy_optimization.po_testlib import PROMPTS, TINY_PPO

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.models import ValueModel
from policy_optimization.trainer import NLGradientPPOTrainer
from text2grad.core.modeling import build_tiny_llama


@pytest.fixture
def make_trainer(bpe_tokenizer, tmp_path):
    """factory(source, *, tokenizer=None, dataset=None, score_fn=None, ref=None, output_dir=None, **config)."""
    def factory(source, *, tokenizer=None, dataset=None, score_fn=None, ref=None, output_dir=None, **overrides):
        tok = tokenizer or bpe_tokenizer
        cfg = PPOConfig(**{**TINY_PPO, "output_dir": str(output_dir or tmp_path / "run"), **overrides})
        policy = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0)
        value = ValueModel.from_causal_lm(build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=1))
        data = dataset if dataset is not None else [{"prompt": p} for p in PROMPTS]
        return NLGradientPPOTrainer(cfg, tok, policy, ref, value, source, data, score_fn=score_fn)

    return factory


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """accelerate keeps process-wide state (e.g. mixed precision set by a TRL Trainer); start each test clean."""
    yield

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
