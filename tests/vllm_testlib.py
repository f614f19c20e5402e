"""The one vLLM engine the real-engine tests share (SmolLM2-135M-Instruct, fp32, LoRA slots), started once per
test session through `text2grad.core.vllm_engine.shared_engine`."""

from __future__ import annotations

import pytest

from policy_optimization.ppo_config import PPOConfig
from text2grad.core.assets import smollm2_path
from text2grad.core.vllm_engine import VLLMEngine, shared_engine, vllm_available


def engine_options() -> dict:
    """The engine settings a default PPOConfig asks for; a command given them as ``vllm_kwargs`` (with dtype fp32 on
    SmolLM2) gets the shared engine instead of refusing a second one."""
    defaults = PPOConfig()
    return dict(gpu_memory_utilization=defaults.vllm_gpu_memory_utilization, cpu_kv_cache_gb=defaults.vllm_cpu_kv_cache_gb)


def engine_for_tests() -> VLLMEngine:
    """The shared engine, with the settings a default PPOConfig asks for (so PPO runs in the tests reuse it); skips
    the calling test when vllm is not importable."""
    if not vllm_available():
        pytest.skip("vllm is not importable in this environment (install the 'vllm' extra: see env.sh)")
    return shared_engine(smollm2_path(), dtype="fp32", max_lora_rank=16, **engine_options())
