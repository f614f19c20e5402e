"""vLLM serving adapters as LoRA requests (``lora_mode="adapter"``, the default on a GPU), on the real engine and
SmolLM2-135M-Instruct: a reward model's critiques equal the transformers backend's, and PPO's LoRA policy, saved
and served as a new LoRA request every iteration, stays on-policy.

Slow. The other vLLM tests run the engine that merges adapters (the CPU default); these switch the shared engine
to LoRA requests once (`tests.vllm_testlib.engine_for_tests`), all in this one file so the engine restarts rarely.
"""

from __future__ import annotations

import pytest
import torch
from tests.policy_optimization.po_testlib import first_and_last_words
from tests.vllm_testlib import engine_for_tests, engine_options, make_smollm2_lora_adapter
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.trainer import NLGradientPPOTrainer
from reward_model.inference import GenerativeRewardModel
from text2grad.core.assets import smollm2_path
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.generation import apply_chat_template, encode_prompt_ids

pytestmark = pytest.mark.slow
# The shared engine restarts to serve LoRA requests: tests/conftest.py runs this module after the other engine tests.
VLLM_ENGINE_LORA_MODE = "adapter"

PROMPTS = ["Summarize: the cat sat on the mat all day.", "Summarize: Oslo is the capital of Norway.",
           "Summarize: the shop opens at nine."]
RESPONSES = ["A cat sat on a mat.", "Oslo is Norway's capital.", "The shop opens at ten."]


def test_critiques_through_lora_requests_equal_transformers_critiques(tmp_path):
    engine = engine_for_tests(lora_mode="adapter")
    assert engine.serves_lora_requests
    adapter = make_smollm2_lora_adapter(tmp_path / "rm", seed=0)
    options = dict(max_new_tokens=40, dtype="fp32", tokenizer_name_or_path=str(smollm2_path()))
    # one row per batch and the adapter kept separate: the transformers reference computes what vLLM's LoRA
    # kernels compute (no padding, no merged weights), so greedy decoding cannot tip over a near-tie differently
    hf = GenerativeRewardModel.from_pretrained(str(adapter), batch_size=1, merge_adapter=False, **options)
    vl = GenerativeRewardModel.from_pretrained(str(adapter), backend="vllm", **options,
                                               vllm_kwargs=dict(engine_options(), lora_mode="adapter"))
    assert vl.engine.engine is engine and not hasattr(vl.engine.weights, "folder")  # a LoRA request, not weights
    swaps = engine.weight_swaps
    hf_out = hf._generate(hf._inputs(PROMPTS, RESPONSES), RESPONSES)
    vl_out = vl._generate(vl._inputs(PROMPTS, RESPONSES), RESPONSES)
    assert [(o.text, o.finished) for o in vl_out] == [(o.text, o.finished) for o in hf_out]
    assert engine.weight_swaps == swaps  # served on the base weights: nothing loaded in place
    ids = [encode_prompt_ids(hf.tokenizer, [i.text], add_special_tokens=i.add_special_tokens)[0]
           for i in hf._inputs(PROMPTS, RESPONSES)]
    base = engine.generate(hf.tokenizer, ids, max_new_tokens=40)
    assert any(b.text != o.text for b, o in zip(base, vl_out))  # the adapter was applied


def test_ppo_lora_policy_served_as_lora_requests_stays_on_policy(tmp_path):
    engine = engine_for_tests(lora_mode="adapter")
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    policy = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    cfg = PPOConfig(
        model_name_or_path=str(path), generation_backend="vllm", vllm_lora_mode="adapter", dtype="fp32",
        use_lora=True, lora_r=8, lora_alpha=16, num_iterations=3, batch_size=4, num_mini_batches=1,
        num_ppo_epochs=2, response_length=12, temperature=1.0, learning_rate=5e-3, kl_coef=0.0, adaptive_kl=False,
        seed=0, save_steps=0, progress_bar=False, log_samples=0, max_feedback_error_rate=1.0,
        output_dir=str(tmp_path / "ppo"),
    )
    items = [{"prompt": apply_chat_template(tokenizer, q)} for q in ("Name a fruit.", "Describe a cat.",
                                                                     "Say hello to a friend.", "Give me a number.")]
    trainer = NLGradientPPOTrainer(cfg, tokenizer, policy, None, None, CallableFeedbackSource(first_and_last_words),
                                   items, base_model_path=str(path))
    assert trainer.vllm_rollouts.engine is engine and trainer.vllm_rollouts.refreshes_adapter_only
    refreshed = [trainer.step() for _ in range(2)]
    assert max(m["vllm/logprob_abs_diff"] for m in refreshed) < 1e-3, refreshed
    trainer.vllm_rollouts.refresh = lambda policy: None  # keep serving the adapter of before the last update
    stale = trainer.step()
    assert stale["vllm/logprob_abs_diff"] > 5 * max(m["vllm/logprob_abs_diff"] for m in refreshed), (stale, refreshed)
    trainer.vllm_rollouts.close()
