"""The configuration of `python -m policy_optimization.grpo` / `text2grad train-grpo` (`GRPORunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from text2grad.core.config import config_field
from text2grad.core.model_config import ModelConfig
from text2grad.core.reward_options import Boundary, Occurrence, Overlap, RewardScheme

__all__ = ["GRPORunConfig"]


@dataclass
class GRPORunConfig(ModelConfig):
    """Text2Grad-GRPO: group-relative advantages plus span rewards per token (no value model)."""

    adapter: str | None = config_field(None, "LoRA adapter to start from (e.g. the SFT output); merged into the base weights.")
    lora_dropout: float = config_field(0.0, "LoRA dropout.")

    dataset_path: str = config_field("", "Prompts: a .jsonl/.json file, a saved datasets directory, or a hub id.")
    dataset_split: str = config_field("train", "Split for hub datasets.")
    field_map: dict[str, str] = config_field({}, "Rename record fields, {our_name: their_name}.")
    prompt_template: str = config_field("{prompt}", "Policy prompt with {field} placeholders (the critic sees it too).")
    feedback_prompt_template: str | None = config_field(None, "Unused by GRPO (the critic sees the policy prompt); kept for PPO YAML compatibility.")
    use_chat_template: bool = config_field(False, "Wrap prompts in the tokenizer's chat template.")
    system_prompt: str | None = config_field(None, "System message for the chat template.")
    max_samples: int | None = config_field(None, "Use only the first N records.")

    critic: str = config_field("reward_model", "Critic name (text2grad.core.critics) or package.module:ClassName.")
    critic_kwargs: dict[str, Any] = config_field({}, "Keyword arguments of the critic.")
    scalar_source: str = config_field(
        "quote_count",
        "Sequence reward of the group baseline: quote_count = (#good - #poor) / (#good + #poor) of the feedback; "
        "scalar_rm = the Bradley-Terry reward model (reward_model.scalar, kwargs {\"path\": ...}); or "
        "package.module:function(prompts, responses) -> list[float].",
    )
    scalar_source_kwargs: dict[str, Any] = config_field({}, "Keyword arguments when scalar_source names a class.")
    span_coef: float = config_field(1.0, "Weight of the span rewards added to each token's group advantage (0 = plain GRPO).")
    reward_scheme: RewardScheme = config_field("uniform", "Reward shape inside a span.")
    boundary: Boundary = config_field("any", "Which tokens a span edge labels.")
    overlap: Overlap = config_field("poor", "Label that wins where spans overlap.")
    occurrence: Occurrence = config_field("all", "Label every occurrence of a repeated quote, or the first.")

    num_generations: int = config_field(4, "Completions per prompt (the group).")
    max_completion_length: int = config_field(128, "Maximum new tokens per completion.")
    temperature: float = config_field(1.0, "Sampling temperature.")
    top_p: float = config_field(1.0, "Nucleus sampling.")
    per_device_train_batch_size: int = config_field(8, "Completions per device per step (a multiple of num_generations).")
    gradient_accumulation_steps: int = config_field(1, "Micro-batches per optimizer step.")
    learning_rate: float = config_field(1e-6, "Learning rate.")
    lr_scheduler_type: str = config_field("linear", "transformers scheduler name.")
    max_steps: int = config_field(-1, "Optimizer steps (overrides num_train_epochs if > 0).")
    num_train_epochs: float = config_field(1.0, "Epochs over the prompts.")
    beta: float = config_field(0.0, "KL coefficient against the reference policy (TRL's default 0 keeps no reference model).")
    epsilon: float = config_field(0.2, "Clip range of the ratio.")
    bf16: bool = config_field(False, "bfloat16 mixed precision.")
    use_vllm: bool = config_field(False, "Generate with vLLM (GPU; pip install 'text2grad[vllm]'). TRL's GRPOConfig.use_vllm.")
    vllm_mode: Literal["colocate", "server"] = config_field("colocate", "colocate: vLLM in the training process; server: `trl vllm-serve`.")
    vllm_gpu_memory_utilization: float = config_field(0.3, "GPU memory share of a colocated vLLM engine.")
    output_dir: str = config_field("outputs/grpo", "Checkpoints and the final policy (adapter or weights + tokenizer).")
    save_steps: int = config_field(500, "Save a checkpoint every N steps.")
    logging_steps: int = config_field(1, "Log every N steps.")
    seed: int = config_field(42, "Random seed.")
    report_to: str = config_field("none", "none, tensorboard, wandb (comma-separated).")

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a group needs two samples), got {self.num_generations}")
        if self.per_device_train_batch_size % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size ({self.per_device_train_batch_size}) must be a multiple of "
                f"num_generations ({self.num_generations})"
            )
