"""The model and LoRA fields every trainer's config shares (`ModelConfig`).

PPO, GRPO, SFT/DPO and both reward models start from a base model and train either a LoRA adapter or every
weight; their configs inherit these fields, so the flags, their help text and their checks are written once. A
trainer whose defaults differ (the reward models' base model and Llama projection names, PPO's LoRA dropout of 0)
redeclares just that field with its own default and help.
"""

from __future__ import annotations

from dataclasses import dataclass

from text2grad.core.config import config_field

__all__ = ["DTYPE_NAMES", "ModelConfig", "dtype_problem"]

# The weights dtypes a config accepts, each with torch's name for it ("auto" or None: transformers chooses). Kept
# here, free of torch, so that every config checks its dtype before anything heavy loads.
DTYPE_NAMES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}


def dtype_problem(name: str | None) -> str | None:
    """What is wrong with the dtype name ``name`` (None if nothing: one of `DTYPE_NAMES`, "auto" or None)."""
    if name in (None, "auto") or name in DTYPE_NAMES:
        return None
    return f"unknown dtype {name!r}; use one of {sorted(DTYPE_NAMES)} or 'auto'"


@dataclass
class ModelConfig:
    """Base model, tokenizer, weights dtype and LoRA settings of a trainer."""

    # ---- models ------------------------------------------------------------------------------------
    model_name_or_path: str = config_field("", "Base model: hub id or local directory.")
    tokenizer_name_or_path: str | None = config_field(None, "Tokenizer (default: model_name_or_path).")
    dtype: str = config_field("auto", "Weights dtype: auto, bf16, fp16 or fp32 (or bfloat16, float16, float32).")
    # ---- LoRA --------------------------------------------------------------------------------------
    use_lora: bool = config_field(True, "Train a LoRA adapter (peft) instead of all weights.")
    lora_r: int = config_field(16, "LoRA rank.")
    lora_alpha: int = config_field(32, "LoRA alpha (scaling = alpha / r).")
    lora_dropout: float = config_field(0.05, "LoRA dropout.")
    lora_target_modules: list[str] = config_field(
        ["all-linear"], "Modules LoRA adapts (comma-separated on the command line); ['all-linear'] = every linear layer."
    )

