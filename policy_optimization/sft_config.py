"""The configurations of `python -m policy_optimization.sft` / `text2grad sft` (`SFTRunConfig`) and, through the
fields both runs share (`HFRunConfig`), of `text2grad dpo` (`policy_optimization.dpo_config.DPORunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from text2grad.core.config import ConfigError, config_field, range_problems
from text2grad.core.model_config import ModelConfig

__all__ = ["HFRunConfig", "SFTRunConfig"]


@dataclass
class HFRunConfig(ModelConfig):
    """Fields shared by the SFT and DPO runs (both drive a transformers Trainer through TRL)."""

    adapter: str | None = config_field(None, "LoRA adapter to merge into the base before training (e.g. the SFT output for DPO).")
    dataset_path: str = config_field("", "Training records: .jsonl/.json file, saved dataset directory or hub id.")
    dataset_split: str = config_field("train", "Split for hub datasets.")
    field_map: dict[str, str] = config_field({}, "Rename record fields, {our_name: their_name}.")
    prompt_template: str = config_field("{prompt}", "Prompt with {field} placeholders filled from each record.")
    use_chat_template: bool = config_field(False, "Use conversational records (the tokenizer's chat template formats them).")
    max_samples: int | None = config_field(None, "Use only the first N records.")
    output_dir: str = config_field("outputs/sft", "Where the model (adapter or full) and tokenizer are saved.")
    learning_rate: float = config_field(2e-5, "Peak learning rate.")
    lr_scheduler_type: str = config_field("linear", "Scheduler name.")
    lr_scheduler_kwargs: dict[str, Any] = config_field(
        {}, "Extra arguments of the scheduler (JSON), e.g. '{\"lr_end\": 1e-4, \"power\": 1.0}' for polynomial."
    )
    warmup_steps: float = config_field(0, "Warm-up: a number of steps, or a ratio of all steps when below 1.")
    num_train_epochs: float = config_field(1.0, "Epochs.")
    max_steps: int = config_field(-1, "Stop after this many optimizer steps (-1 = use num_train_epochs).")
    per_device_train_batch_size: int = config_field(4, "Batch size per device.")
    gradient_accumulation_steps: int = config_field(1, "Gradient accumulation steps.")
    max_length: int | None = config_field(1024, "Truncate tokenized examples to this length.")
    gradient_checkpointing: bool = config_field(False, "Gradient checkpointing.")
    bf16: bool = config_field(False, "bf16 mixed precision (GPU).")
    deepspeed: str | None = config_field(None, "DeepSpeed JSON config, e.g. configs/deepspeed/zero3.json.")
    logging_steps: int = config_field(10, "Log every N steps.")
    save_steps: int = config_field(500, "Checkpoint every N steps.")
    save_total_limit: int | None = config_field(2, "Keep at most this many checkpoints.")
    seed: int = config_field(42, "Random seed.")
    report_to: str = config_field("none", "none, tensorboard or wandb.")

    def __post_init__(self) -> None:
        problems = range_problems(
            self,
            positive=("learning_rate", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
                      "max_length", "max_samples", "logging_steps", "save_steps", "save_total_limit", "lora_r",
                      "lora_alpha"),
            non_negative=("warmup_steps",),
            share=("lora_dropout",),
        )
        if self.max_steps == 0 or self.max_steps < -1:
            problems.append(f"max_steps must be > 0, or -1 to train num_train_epochs, got {self.max_steps}")
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass
class SFTRunConfig(HFRunConfig):
    """Supervised fine-tuning of the policy on prompt-completion pairs (TRL SFTTrainer, completion-only loss)."""

    completion_template: str = config_field("{completion}", "Target text with {field} placeholders (e.g. '{summary}').")
    completion_only_loss: bool = config_field(True, "Loss on the completion tokens only.")
    fused_lm_head: bool = config_field(
        True, "TRL's fused LM head: log-probs computed in vocabulary tiles, never the full logits (saves memory with "
        "large vocabularies). false: the model's own cross-entropy on full logits, faster when the vocabulary is "
        "small (the quickstart's 800-token tiny Llama: see benchmarks/README.md); the loss is the same."
    )
