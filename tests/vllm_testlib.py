"""The one vLLM engine the real-engine tests share (SmolLM2-135M-Instruct, fp32), started once per test session
through `text2grad.core.vllm_engine.shared_engine`: on a CPU it merges adapters into whole weights (lora_mode
"auto"); the tests of LoRA requests switch it to lora_mode "adapter" (one file, so the engine restarts rarely)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_optimization.ppo_config import PPOConfig
from text2grad.core.assets import smollm2_path
from text2grad.core.vllm_engine import VLLMEngine, close_shared_engine, shared_engine, vllm_available


def engine_options() -> dict:
    """The engine settings a default PPOConfig asks for; a command given them as ``vllm_kwargs`` (with dtype fp32 on
    SmolLM2) gets the shared engine instead of refusing a second one."""
    defaults = PPOConfig()
    return dict(gpu_memory_utilization=defaults.vllm_gpu_memory_utilization, cpu_kv_cache_gb=defaults.vllm_cpu_kv_cache_gb)


def engine_for_tests(lora_mode: str = "auto") -> VLLMEngine:
    """The shared engine, with the settings a default PPOConfig asks for (so PPO runs in the tests reuse it); skips
    the calling test when vllm is not importable. A running engine that serves adapters the other way (``lora_mode``)
    is closed and replaced."""
    if not vllm_available():
        pytest.skip("vllm is not importable in this environment (install the 'vllm' extra: see env.sh)")
    settings = dict(dtype="fp32", max_lora_rank=16, lora_mode=lora_mode, **engine_options())
    try:
        return shared_engine(smollm2_path(), **settings)
    except ValueError as exc:
        if "lora_mode" not in str(exc).split(". Give")[0]:
            raise
    close_shared_engine()
    return shared_engine(smollm2_path(), **settings)


def make_smollm2_lora_adapter(out: Path, seed: int, rank: int = 8) -> Path:
    """A SmolLM2 LoRA adapter (q/v projections) with non-zero weights, so it changes what the model writes, saved to
    ``out`` as training saves it (adapter and tokenizer)."""
    path = smollm2_path()
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    with torch.no_grad():  # B of the size a short training gives (peft's random B is about 4x larger: gibberish)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(path)).save_pretrained(str(out))
    return out
