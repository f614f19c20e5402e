"""The value head on the policy's own (LoRA) backbone: config resolution, what it computes, where its gradients go,
and a PPO run that trains and saves it."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tests.policy_optimization.po_testlib import PROMPTS, TINY_PPO, first_and_last_words

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.models import PolicyAndValue, ValueHead, ValueModel
from policy_optimization.trainer import NLGradientPPOTrainer
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.modeling import build_tiny_llama


def test_auto_is_shared_for_lora_and_separate_otherwise():
    assert PPOConfig(use_lora=True).value_design == "shared_backbone"
    assert PPOConfig(use_lora=False).value_design == "separate"
    assert PPOConfig(use_lora=True, value_model_name_or_path="some/value").value_design == "separate"
    assert PPOConfig(use_lora=True, value_model="separate").value_design == "separate"
    assert PPOConfig(use_lora=False, value_model="shared_backbone").value_design == "shared_backbone"
    with pytest.raises(ValueError, match="set value_model to separate"):
        PPOConfig(value_model="shared_backbone", value_model_name_or_path="some/value")
    with pytest.raises(ValueError, match="value_model must be one of"):
        PPOConfig(value_model="shared")


def _lora_policy(tokenizer):
    policy = build_tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    return get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))


def test_shared_head_reads_the_policys_last_hidden_state_and_trains_the_adapter(bpe_tokenizer):
    policy = _lora_policy(bpe_tokenizer)
    head = ValueHead(32)
    with torch.no_grad():
        head.head.weight.normal_()
        head.head.bias.fill_(0.5)
    module = PolicyAndValue(policy, head)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18]])
    attn = torch.ones_like(ids)
    pos = torch.arange(7).expand(2, 7)
    T = 3
    logits, values = module(ids, attn, pos, T)
    full = policy(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=True)
    assert torch.allclose(logits, full.logits[:, -T - 1 : -1], atol=1e-6)
    last_hidden = full.hidden_states[-1][:, -T - 1 : -1]  # after the final norm
    assert torch.allclose(values, last_hidden @ head.head.weight[0] + 0.5, atol=1e-5)

    values.pow(2).mean().backward()  # a value loss alone
    lora_grads = [p.grad for n, p in policy.named_parameters() if "lora_" in n and p.grad is not None]
    assert lora_grads and any(float(g.abs().sum()) > 0 for g in lora_grads)  # it reaches the shared adapter
    assert float(head.head.weight.grad.abs().sum()) > 0
    assert all(p.grad is None for n, p in policy.named_parameters() if "lora_" not in n)  # base weights stay frozen


def test_ppo_with_the_shared_backbone_trains_and_saves_only_a_head(bpe_tokenizer, tmp_path):
    cfg = PPOConfig(**{**TINY_PPO, "output_dir": str(tmp_path / "run")})
    assert cfg.value_design == "shared_backbone"
    policy = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    data = [{"prompt": p} for p in PROMPTS]
    trainer = NLGradientPPOTrainer(cfg, bpe_tokenizer, policy, None, None, CallableFeedbackSource(first_and_last_words), data)
    assert trainer.value_design == "shared_backbone" and isinstance(trainer.value_model, ValueHead)
    # no second backbone: everything trainable is the LoRA adapter plus hidden_size + 1 head parameters
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    lora = sum(p.numel() for n, p in trainer.policy.named_parameters() if "lora_" in n)
    assert trainable == lora + 32 + 1
    lora_before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if "lora_B" in n}
    metrics = trainer.train()
    assert metrics["iteration"] == 2
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    assert float(trainer.value_model.head.weight.abs().sum()) > 0  # left its zero start
    assert any(not torch.equal(lora_before[n], p) for n, p in trainer.policy.named_parameters() if n in lora_before)
    saved = ValueHead.from_pretrained(tmp_path / "run" / "value_model")
    assert torch.equal(saved.head.weight, trainer.value_model.head.weight.detach().cpu())
    assert not (tmp_path / "run" / "value_model" / "config.json").exists()  # a head, not a second model


def test_shared_backbone_refuses_a_separate_value_model_and_separate_needs_one(bpe_tokenizer, tmp_path):
    policy = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    value = ValueModel.from_causal_lm(build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=1))
    source, data = CallableFeedbackSource(first_and_last_words), [{"prompt": p} for p in PROMPTS]
    shared = PPOConfig(**{**TINY_PPO, "output_dir": str(tmp_path / "a"), "value_model": "shared_backbone"})
    with pytest.raises(ValueError, match="pass value_model=None"):
        NLGradientPPOTrainer(shared, bpe_tokenizer, policy, None, value, source, data)
    separate = PPOConfig(**{**TINY_PPO, "output_dir": str(tmp_path / "b"), "value_model": "separate"})
    with pytest.raises(ValueError, match="separate needs a ValueModel"):
        NLGradientPPOTrainer(separate, bpe_tokenizer, policy, None, None, source, data)
