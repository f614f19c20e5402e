"""The configuration of `python -m reward_model.merge` / `text2grad merge-rm` (`MergeConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from text2grad.core.config import config_field

__all__ = ["MergeConfig"]


@dataclass
class MergeConfig:
    """Merge a LoRA adapter into its base model (base + adapter -> one model directory with tokenizer)."""

    adapter: str = config_field("", "Adapter directory (a training output_dir or a checkpoint-N).")
    output_dir: str = config_field("", "Where the merged model, tokenizer and config are written.")
    base_model: str | None = config_field(
        None,
        "Base model hub id or path; defaults to base_model_name_or_path in adapter_config.json.",
    )
    dtype: str = config_field("auto", "dtype of the saved weights: auto, bf16, fp16, fp32.")
    max_shard_size: str = config_field("5GB", "Largest safetensors shard.")
