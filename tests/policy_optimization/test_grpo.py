"""Text2Grad-GRPO: TRL's GRPOTrainer with (B, T) advantages = group advantage + span rewards."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from tests.policy_optimization.po_testlib import PROMPTS
from trl import GRPOConfig

from text2grad.core.critics import CallableFeedbackSource
from policy_optimization.grpo import Text2GradGRPOTrainer, token_advantages
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import build_tiny_llama


def test_token_advantages_adds_span_rewards_to_the_group_advantage():
    seq = torch.tensor([0.5, -1.0])
    spans = torch.tensor([[0.0, 1.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    out = token_advantages(seq, spans, mask, span_coef=2.0)
    assert torch.equal(out, torch.tensor([[0.5, 2.5, 2.5, 0.5], [-3.0, -1.0, 0.0, 0.0]]))


def first_word(prompt: str, response: str) -> Feedback:
    words = response.split()
    return Feedback(critique="first word", good_spans=(words[0],) if words else ())


@pytest.mark.slow
def test_grpo_trains_with_token_level_advantages(bpe_tokenizer, tmp_path):
    seen: list[dict] = []

    class Recording(Text2GradGRPOTrainer):
        def _compute_loss(self, model, inputs):
            seen.append({k: inputs[k].detach().clone() for k in ("advantages", "completion_mask", "completion_ids")})
            return super()._compute_loss(model, inputs)

    model = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), use_cpu=True, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
        beta=0.0, temperature=1.0, seed=0,
    )
    trainer = Recording(
        model=model, args=args, train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=bpe_tokenizer, critic=CallableFeedbackSource(first_word), span_coef=0.5,
    )
    trainer.train()
    assert len(seen) == 2
    for batch in seen:
        adv, mask = batch["advantages"], batch["completion_mask"].float()
        assert adv.shape == batch["completion_ids"].shape  # (B, T), not (B,)
        assert float((adv * (1 - mask)).abs().sum()) == 0
        # Every completion gets the same sequence score (1.0: one good quote), so the group advantage is 0 and
        # the token advantages are exactly the span rewards: 0.5 on the first word's tokens, 0 elsewhere.
        for b in range(adv.shape[0]):
            values = {round(float(v), 5) for v, m in zip(adv[b], mask[b]) if m > 0}
            assert 0.5 in values and values <= {0.0, 0.5}, values
    labelled = [float(v) for batch in seen for v, m in zip(batch["advantages"].flatten(), batch["completion_mask"].flatten()) if m]
    assert 0.0 in labelled  # not every token is in a span: the advantage varies along the completion
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    logged = [h for h in trainer.state.log_history if "text2grad/nonzero_reward_share" in h]
    assert logged and all(0 < h["text2grad/nonzero_reward_share"] < 1 for h in logged)
