"""The generation-backend setting of the commands that generate text outside PPO, defined once.

The evaluation suites and prepare-data's KodCode completions declare ``generation_backend`` and ``vllm_kwargs``
with these types and help texts; `text2grad.core.generation_backend` implements them. This module imports nothing
heavy (no torch), so a config can import it cheaply.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["GenerationBackend", "GENERATION_BACKENDS", "GENERATION_BACKEND_HELP", "VLLM_KWARGS_HELP"]

GenerationBackend = Literal["hf", "vllm"]
GENERATION_BACKENDS: tuple[str, ...] = get_args(GenerationBackend)
GENERATION_BACKEND_HELP = (
    "What generates the text. hf: transformers' generate (a LoRA adapter merged into the weights). vllm: a vLLM "
    "engine (extra 'vllm'; one per process) fed the same prompt token ids, the adapter served as a LoRA request; "
    "greedy outputs equal hf's up to floating-point near-ties, and sampling follows the engine's seed, not seed."
)
VLLM_KWARGS_HELP = (
    "vllm backend only: more engine settings, e.g. {\"gpu_memory_utilization\": 0.5, \"cpu_kv_cache_gb\": 2, "
    "\"max_model_len\": 4096} (text2grad.core.vllm_engine.VLLMEngine's arguments, then vllm.LLM's)."
)
