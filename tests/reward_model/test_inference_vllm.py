"""The reward model's ``backend="vllm"`` on the real engine: a LoRA reward model on SmolLM2-135M-Instruct asked for
critiques of a batch of pairs through vLLM writes exactly what the transformers backend writes (same token ids in,
greedy, the same cut at the end of the JSON), and the adapter is really applied.

Slow: it uses the engine shared by the whole pytest run (`tests/vllm_testlib.py`; alone, this file starts it).
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tests.vllm_testlib import engine_for_tests
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_optimization.ppo_config import PPOConfig
from reward_model.inference import GenerativeRewardModel
from text2grad.core.assets import smollm2_path
from text2grad.core.generation import encode_prompt_ids

pytestmark = pytest.mark.slow

PROMPTS = ["Summarize: the cat sat on the mat all day.", "Summarize: Oslo is the capital of Norway.",
           "Summarize: the shop opens at nine.", "Summarize: water boils at 100 degrees."]
RESPONSES = ["A cat sat on a mat.", "Oslo is Norway's capital.", "The shop opens at ten.", "Water boils at 90 degrees."]


@pytest.fixture(scope="module")
def lora_reward_model(tmp_path_factory):
    """A SmolLM2 LoRA adapter with non-zero weights (so it changes what the model writes), saved like training does."""
    path = smollm2_path()
    out = tmp_path_factory.mktemp("rm_adapter")
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():  # B of the size a short training gives (peft's random B is 4x larger: gibberish)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(path)).save_pretrained(str(out))
    return out


def test_vllm_critiques_equal_transformers_critiques(lora_reward_model):
    engine = engine_for_tests()
    defaults = PPOConfig()
    options = dict(max_new_tokens=40, dtype="fp32", tokenizer_name_or_path=str(smollm2_path()))
    # one row per batch and the adapter kept separate: the transformers reference computes exactly what vLLM
    # computes (no padding, no merged weights), so greedy decoding cannot tip over a near-tie differently
    hf = GenerativeRewardModel.from_pretrained(str(lora_reward_model), batch_size=1, merge_adapter=False, **options)
    vl = GenerativeRewardModel.from_pretrained(
        str(lora_reward_model), backend="vllm", **options,
        vllm_kwargs=dict(gpu_memory_utilization=defaults.vllm_gpu_memory_utilization,
                         cpu_kv_cache_gb=defaults.vllm_cpu_kv_cache_gb),
    )
    assert vl.engine.engine is engine  # the pytest run's shared engine, with the reward model as a LoRA request
    inputs = hf._inputs(PROMPTS, RESPONSES)
    hf_out = hf._generate(inputs, RESPONSES)
    vl_out = vl._generate(vl._inputs(PROMPTS, RESPONSES), RESPONSES)
    assert [(o.text, o.finished) for o in vl_out] == [(o.text, o.finished) for o in hf_out]
    feedback = vl.feedback(PROMPTS, RESPONSES)
    assert len(feedback) == 4 and vl.stats.requests == 4

    # the adapter is applied: the base weights write something else for the same ids
    ids = [encode_prompt_ids(hf.tokenizer, [i.text], add_special_tokens=i.add_special_tokens)[0] for i in inputs]
    base = engine.generate(hf.tokenizer, ids, max_new_tokens=40)
    assert any(b.text != o.text for b, o in zip(base, vl_out)), [b.text for b in base]
