"""The configuration of `python -m reward_model.scalar` / `text2grad train-scalar-rm` (`ScalarRMConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reward_model.train_config import LLAMA_LINEAR_MODULES
from text2grad.core.config import ConfigError, config_field
from text2grad.core.model_config import ModelConfig

__all__ = ["ScalarRMConfig"]


@dataclass
class ScalarRMConfig(ModelConfig):
    """Train a Bradley-Terry scalar reward model on preference pairs (the paper's PPO baseline)."""

    dataset_path: str = config_field("", "Preference pairs: JSONL/JSON/saved dataset/hub id with prompt, chosen, rejected.")
    dataset_split: str = config_field("train", "Split of dataset_path when it is a hub dataset.")
    eval_dataset_path: str | None = config_field(None, "Held-out pairs (same layout). Default: an eval_fraction of dataset_path.")
    eval_dataset_split: str = config_field("validation", "Split of eval_dataset_path when it is a hub dataset.")
    eval_fraction: float = config_field(0.1, "Share of dataset_path held out for pairwise accuracy when eval_dataset_path is not set.")
    field_map: dict[str, str] = config_field({}, "Rename fields, {our_name: their_name}, e.g. {\"prompt\": \"post\"}.")
    limit: int | None = config_field(None, "Use only the first N pairs of dataset_path.")
    prompt_template: str = config_field("{prompt}\n\n", "Text before the response, with {prompt} filled from each pair.")
    max_length: int = config_field(1024, "Max tokens of prompt + response + EOS; the prompt is cut from the left.")
    output_dir: str = config_field("outputs/scalar_rm", "Adapter (or weights), tokenizer, config and eval_pairwise.json.")

    lora_target_modules: list[str] = config_field(
        LLAMA_LINEAR_MODULES, "Modules that get LoRA adapters (the one-output score head is trained in full)."
    )

    learning_rate: float = config_field(1e-5, "Peak learning rate.")
    lr_scheduler_type: str = config_field("linear", "transformers scheduler name.")
    weight_decay: float = config_field(0.0, "AdamW weight decay.")
    max_grad_norm: float = config_field(1.0, "Gradient clipping norm.")
    num_train_epochs: float = config_field(1.0, "Epochs over the pairs.")
    max_steps: int = config_field(-1, "Stop after this many optimizer steps (overrides epochs if > 0).")
    per_device_train_batch_size: int = config_field(4, "Pairs per device per micro-step.")
    gradient_accumulation_steps: int = config_field(1, "Micro-steps per optimizer step.")
    center_rewards_coefficient: float | None = config_field(None, "Weight of mean((r_c + r_r)^2), keeping rewards centred.")
    gradient_checkpointing: bool = config_field(False, "Recompute activations in backward.")
    bf16: bool = config_field(False, "bfloat16 mixed precision.")
    deepspeed: str | None = config_field(None, "DeepSpeed JSON config, e.g. configs/deepspeed/zero3.json.")
    eval_batch_size: int = config_field(8, "Pairs per batch when computing the pairwise accuracy.")
    save_steps: int = config_field(500, "Save a checkpoint every N optimizer steps.")
    save_total_limit: int | None = config_field(2, "Keep at most N checkpoints.")
    logging_steps: int = config_field(10, "Log every N steps.")
    seed: int = config_field(42, "Random seed (held-out split, data order, LoRA and head init).")
    report_to: str = config_field("none", "none, tensorboard, wandb (comma-separated).")
    progress_bar: bool = config_field(True, "Show a progress bar over training steps.")

    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must lie in [0, 1), got {self.eval_fraction}")
        if self.max_length < 8:
            raise ConfigError(f"max_length must be at least 8 tokens, got {self.max_length}")
        if "{prompt}" not in self.prompt_template:
            raise ConfigError("prompt_template must contain {prompt}")
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise ConfigError(f"deepspeed config {self.deepspeed!r} does not exist (see configs/deepspeed/)")
