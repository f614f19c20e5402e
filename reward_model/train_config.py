"""The configuration of `python -m reward_model.train` / `text2grad train-rm` (`RewardModelConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from text2grad.core.config import ConfigError, config_field, range_problems
from text2grad.core.model_config import ModelConfig

__all__ = ["RewardModelConfig", "LLAMA_LINEAR_MODULES", "CONFIG_FILENAME", "MEMBER_PREFIX", "DEFAULT_INSTRUCTION",
           "NOCOT_INSTRUCTION", "PromptFormat", "TargetFormat"]

# How the reward model's input is laid out, what it learns to write, and the instruction it is given (defined
# with the config that chooses them; reward_model.serialization builds the texts from them).
PromptFormat = Literal["auto", "chat", "plain"]
TargetFormat = Literal["cot", "nocot"]

DEFAULT_INSTRUCTION = (
    "You are a careful reviewer. Critique the response to the prompt below: say what it does well and what "
    "is wrong or missing. Write the critique as one paragraph, then on the last line a JSON object "
    '{"good_spans": [...], "poor_spans": [...]} listing short phrases copied exactly from the response '
    "that are good or poor. Use [] when there are none."
)

NOCOT_INSTRUCTION = (
    "You are a careful reviewer. Judge the response to the prompt below without explaining: answer only with a "
    'JSON object {"good_spans": [...], "poor_spans": [...]} listing short phrases copied exactly from the '
    "response that are good or poor. Use [] when there are none."
)

# Every linear projection of a Llama block: the default LoRA targets of both reward models.
LLAMA_LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# The exact config, saved next to a trained reward model and each of its checkpoints (read back by inference/merge).
CONFIG_FILENAME = "text2grad_config.yaml"
# The members of an ensemble trained with ensemble_size K live in <output_dir>/member-0 ... member-<K-1>.
MEMBER_PREFIX = "member-"

@dataclass
class RewardModelConfig(ModelConfig):
    """Train the Text2Grad generative reward model (critique + span JSON) with LoRA or full fine-tuning.

    Defaults follow the paper's reward-model setting for Llama-3.1-8B-Instruct (its public training
    script: LoRA r=16, alpha=32, dropout=0.05, learning rate 1e-5, 3 epochs, batch 1 per device,
    sequences up to 1400 tokens, gradient clipping 1.0, DeepSpeed ZeRO-3). One difference: LoRA here
    targets every linear projection of the Llama block (the paper's script adapted q_proj and v_proj
    only; pass ``--lora_target_modules q_proj,v_proj`` to match it exactly).
    """

    # ----- model and data
    model_name_or_path: str = config_field(
        "meta-llama/Llama-3.1-8B-Instruct",
        "Base model: a hub id or a local directory saved with save_pretrained().",
    )
    dataset_path: str = config_field(
        "",
        "Annotated training data: a JSONL/JSON file (annotation phase output), a save_to_disk "
        "directory or a hub dataset id, with prompt, response, critique, good_spans, poor_spans.",
    )
    dataset_split: str = config_field("train", "Split of dataset_path when it is a hub dataset.")
    eval_dataset_path: str | None = config_field(
        None,
        "Held-out annotated data for the evaluation loss (same layout).",
    )
    eval_dataset_split: str = config_field("validation", "Split of eval_dataset_path when it is a hub dataset.")
    field_map: dict[str, str] = config_field(
        {},
        "Rename dataset fields, {our_name: their_name}, e.g. {\"prompt\": \"post\"}.",
    )
    limit: int | None = config_field(None, "Use only the first N training records.")
    ensemble_size: int = config_field(
        1,
        "Train K reward models into <output_dir>/member-0 ... member-<K-1> (seeds seed, seed+1, ...), one after the "
        "other, for the critic reward_model_ensemble (K LoRA adapters on one shared base in memory). 1 = one model "
        "in output_dir.",
    )
    bootstrap: bool = config_field(
        False,
        "Train on a bootstrap resample of the training records (as many, drawn with replacement, with this run's "
        "seed), so the members of an ensemble see different data as well as different seeds.",
    )
    output_dir: str = config_field(
        "outputs/reward_model",
        "Where checkpoints and the final adapter/model, tokenizer and config go.",
    )
    # ----- how the model is asked
    instruction: str = config_field(
        DEFAULT_INSTRUCTION,
        "Instruction placed before the prompt and response (saved with the model for inference).",
    )
    prompt_format: PromptFormat = config_field(
        "auto",
        "auto: the tokenizer's chat template if it has one, else the plain template; chat; plain.",
    )
    target_format: TargetFormat = config_field(
        "cot",
        "cot: the model writes the critique, then the span JSON (Text2Grad); nocot: the span JSON "
        "only, no critique (the paper's no-CoT ablation; the instruction defaults to NOCOT_INSTRUCTION).",
    )
    max_length: int = config_field(
        1400,
        "Max tokens of input + target. Long task prompts are shortened in the middle; examples "
        "whose response + target cannot fit are dropped (and counted).",
    )
    # ----- LoRA
    lora_target_modules: list[str] = config_field(
        LLAMA_LINEAR_MODULES, "Module names that get LoRA adapters (comma-separated on the command line)."
    )
    # ----- optimisation
    learning_rate: float = config_field(1e-5, "Peak learning rate.")
    lr_scheduler_type: str = config_field("linear", "transformers scheduler name.")
    warmup_ratio: float = config_field(0.0, "Share of training steps for linear warmup.")
    weight_decay: float = config_field(0.0, "AdamW weight decay.")
    max_grad_norm: float = config_field(1.0, "Gradient clipping norm.")
    num_train_epochs: float = config_field(3.0, "Epochs over the training data.")
    max_steps: int = config_field(-1, "Stop after this many optimizer steps (overrides epochs if > 0).")
    per_device_train_batch_size: int = config_field(1, "Sequences per device per micro-step.")
    per_device_eval_batch_size: int = config_field(1, "Sequences per device for eval loss.")
    group_by_length: bool = config_field(
        True, "Batch examples of similar length together (transformers' length-grouped sampler, random within and "
        "across groups of 50 batches): less padding, 14 % fewer tokens per epoch on the quickstart's annotations. "
        "false: uniformly shuffled batches."
    )
    gradient_accumulation_steps: int = config_field(1, "Micro-steps per optimizer step.")
    gradient_checkpointing: bool = config_field(
        False,
        "Recompute activations in backward (less memory, ~30% slower).",
    )
    bf16: bool = config_field(False, "Train in bfloat16 mixed precision (Ampere+ GPUs).")
    fp16: bool = config_field(False, "Train in float16 mixed precision.")
    deepspeed: str | None = config_field(
        None,
        "DeepSpeed JSON config, e.g. configs/deepspeed/zero2.json or zero3.json.",
    )
    # ----- bookkeeping
    resume: str | None = config_field(
        None,
        "'auto' = continue from the latest checkpoint in output_dir if any (else start fresh); or a checkpoint-N "
        "directory. The checkpoint's saved config must match (see accept_config_changes).",
    )
    overwrite_output_dir: bool = config_field(
        False, "Start fresh in an output_dir that holds an earlier run (its checkpoints and logs are removed first)."
    )
    accept_config_changes: bool = config_field(
        False,
        "Resume even though the config differs from the checkpoint's (differences are logged and appended to "
        "<output_dir>/config_changes.jsonl).",
    )
    save_steps: int = config_field(500, "Save a checkpoint every N optimizer steps.")
    save_total_limit: int | None = config_field(2, "Keep at most N checkpoints.")
    eval_steps: int = config_field(500, "Evaluation loss every N steps (when eval_dataset_path is set).")
    logging_steps: int = config_field(10, "Log the training loss every N steps.")
    seed: int = config_field(42, "Random seed (data order, LoRA init).")
    report_to: str = config_field(
        "none",
        "Experiment tracker(s): none, tensorboard, wandb (comma-separated).",
    )
    progress_bar: bool = config_field(True, "Show a progress bar over training steps.")

    def __post_init__(self) -> None:
        problems = range_problems(
            self,
            positive=("learning_rate", "num_train_epochs", "per_device_train_batch_size", "per_device_eval_batch_size",
                      "gradient_accumulation_steps", "save_steps", "save_total_limit", "eval_steps", "logging_steps",
                      "limit", "lora_alpha", "ensemble_size"),
            non_negative=("weight_decay", "max_grad_norm"),
            share=("lora_dropout",),
        )
        if self.max_steps == 0 or self.max_steps < -1:
            problems.append(f"max_steps must be > 0, or -1 to train num_train_epochs, got {self.max_steps}")
        if problems:
            raise ConfigError("; ".join(problems))
        if self.resume is not None and self.resume.strip().lower() in ("latest", "true"):
            self.resume = "auto"
        if self.target_format == "nocot" and self.instruction == DEFAULT_INSTRUCTION:
            self.instruction = NOCOT_INSTRUCTION  # do not ask for a critique the model never learns to write
        if self.max_length < 8:
            raise ConfigError(f"max_length must be at least 8 tokens, got {self.max_length}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio is a share of the training steps in [0, 1), got {self.warmup_ratio}")
        if self.bf16 and self.fp16:
            raise ConfigError("choose at most one of bf16 and fp16")
        if self.use_lora and (self.lora_r <= 0 or not self.lora_target_modules):
            raise ConfigError("LoRA needs lora_r > 0 and at least one lora_target_modules entry")
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise ConfigError(f"deepspeed config {self.deepspeed!r} does not exist (see configs/deepspeed/)")
