"""``text2grad sft`` / ``python -m policy_optimization.sft``: supervised fine-tuning with TRL's SFTTrainer.

    python -m policy_optimization.sft --config configs/slf5k/sft.yaml --model_name_or_path meta-llama/Llama-3.1-8B-Instruct
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml -m policy_optimization.sft --config ... \\
        --deepspeed configs/deepspeed/zero3.json

Each record becomes a prompt-completion pair (``prompt_template`` and ``completion_template`` filled from
its fields), and the loss is on the completion only. With ``use_lora`` (default) the output directory holds
a LoRA adapter whose ``base_model_name_or_path`` is the base model, so ``load_causal_lm(output_dir)`` works
and the PPO step takes it as ``--adapter``. The tokenizer is saved alongside.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import Trainer
from trl import SFTConfig, SFTTrainer

from policy_optimization.sft_config import HFRunConfig, SFTRunConfig
from reward_model.train import _allow_deepspeed_on_cpu
from text2grad.core.cli import EXIT_OK, exit_process, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.data import DataError, load_records, record_id, render_template
from text2grad.core.modeling import check_model_path, end_distributed, load_causal_lm, load_tokenizer
from text2grad.core.placement import check_process_gpus
from text2grad.core.run_dir import MetricsJsonl

__all__ = ["main", "lora_config", "training_kwargs", "load_pairs"]

logger = logging.getLogger("policy_optimization.sft")


def lora_config(cfg: HFRunConfig):
    targets = list(cfg.lora_target_modules)
    return LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets, task_type="CAUSAL_LM", bias="none",
    )


def training_kwargs(cfg: HFRunConfig) -> dict[str, Any]:
    """The transformers TrainingArguments fields both runs share. Under DeepSpeed on CPU processes
    (``DS_ACCELERATOR=cpu``, how CI tests the ZeRO path) accelerate is told to use gloo first. A launch with more
    processes than visible GPUs is refused (`check_process_gpus`) before accelerate would crash on it."""
    check_process_gpus()
    if cfg.deepspeed and os.environ.get("DS_ACCELERATOR") == "cpu" and not torch.cuda.is_available():
        _allow_deepspeed_on_cpu()
    return dict(
        output_dir=cfg.output_dir, learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler_type,
        lr_scheduler_kwargs=dict(cfg.lr_scheduler_kwargs),
        warmup_steps=cfg.warmup_steps, num_train_epochs=cfg.num_train_epochs, max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, gradient_checkpointing=cfg.gradient_checkpointing,
        bf16=cfg.bf16, deepspeed=cfg.deepspeed, logging_steps=cfg.logging_steps, save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit, seed=cfg.seed, report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        use_cpu=not torch.cuda.is_available() and not cfg.deepspeed, max_length=cfg.max_length, dataset_num_proc=None,
    )


def load_pairs(cfg: HFRunConfig, templates: dict[str, str]) -> list[dict[str, Any]]:
    """Records rendered into the columns ``templates`` names (e.g. prompt / completion, or prompt / chosen /
    rejected), conversational when ``use_chat_template``."""
    records = load_records(cfg.dataset_path, cfg.dataset_split, cfg.field_map, limit=cfg.max_samples)
    if not records:
        raise DataError(f"{cfg.dataset_path} holds no records")
    rows = []
    for i, rec in enumerate(records):
        row = {col: render_template(tpl, rec, where=record_id(rec, i)) for col, tpl in templates.items()}
        if cfg.use_chat_template:
            row = {col: [{"role": "user" if col == "prompt" else "assistant", "content": text}] for col, text in row.items()}
        rows.append(row)
    return rows


def load_model_and_tokenizer(cfg: HFRunConfig):
    """(model, tokenizer, base path for a saved adapter). A start adapter is merged; with ``use_lora`` the
    merged weights are saved once to ``output_dir/base_merged`` so the new adapter has a loadable base."""
    tokenizer = load_tokenizer(cfg.tokenizer_name_or_path or cfg.model_name_or_path, padding_side="right")
    model = load_causal_lm(cfg.model_name_or_path, adapter=cfg.adapter, dtype=cfg.dtype, merge_adapter=True)
    base = cfg.model_name_or_path
    if cfg.adapter and cfg.use_lora:
        merged = Path(cfg.output_dir) / "base_merged"
        if int(os.environ.get("RANK", "0") or 0) == 0 and not (merged / "config.json").is_file():
            tmp = merged.with_name("base_merged.tmp")
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.replace(merged)
        base = str(merged)
    return model, tokenizer, base


def load_with_arguments(cfg: HFRunConfig, make_arguments: Callable[[], Any]) -> tuple[Any, Any, Any, str]:
    """(training arguments, model, tokenizer, base path) in the order ZeRO-3 needs. Without a start adapter the
    arguments come first: with a ZeRO-3 config they register DeepSpeed, so from_pretrained partitions the weights
    while they load instead of materialising the whole model on every process. A start adapter is merged into whole
    weights, so then the model loads first and ZeRO-3 partitions it when training starts."""
    if cfg.adapter:
        model, tokenizer, base = load_model_and_tokenizer(cfg)
        return make_arguments(), model, tokenizer, base
    arguments = make_arguments()
    model, tokenizer, base = load_model_and_tokenizer(cfg)
    return arguments, model, tokenizer, base


def save_final(trainer, tokenizer, cfg: HFRunConfig, base: str) -> None:
    """Save the model (adapter or full) and tokenizer; an adapter records its base for `load_causal_lm`."""
    model = trainer.model
    if cfg.use_lora and hasattr(model, "peft_config"):
        for peft_config in model.peft_config.values():
            peft_config.base_model_name_or_path = base
    trainer.save_model(cfg.output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(cfg.output_dir)


def run_sft(cfg: SFTRunConfig) -> int:
    if not cfg.model_name_or_path or not cfg.dataset_path:
        raise ConfigError("set --model_name_or_path and --dataset_path")
    check_output_path(cfg.output_dir)
    rows = load_pairs(cfg, {"prompt": cfg.prompt_template, "completion": cfg.completion_template})
    check_model_path(cfg.model_name_or_path)
    args, model, tokenizer, base = load_with_arguments(
        cfg, lambda: SFTConfig(**training_kwargs(cfg), completion_only_loss=cfg.completion_only_loss)
    )
    trainer = (SFTTrainer if cfg.fused_lm_head else FullLogitsSFTTrainer)(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        peft_config=lora_config(cfg) if cfg.use_lora else None, callbacks=[MetricsJsonl(fresh=True)],
    )
    result = trainer.train()
    save_final(trainer, tokenizer, cfg, base)
    logger.info("SFT done: %d steps, training loss %.4f; saved to %s", result.global_step, result.training_loss, Path(cfg.output_dir))
    end_distributed()
    return EXIT_OK


class FullLogitsSFTTrainer(SFTTrainer):
    """TRL's SFT (data preparation, completion-only labels, collation) with the model's own loss on full logits.

    TRL computes the loss, entropy and token accuracy through a fused LM head that works in vocabulary tiles; with a
    tiny vocabulary on a CPU those tiles cost more than the whole logits tensor (a third of the quickstart's SFT
    step). The loss is the same masked mean cross-entropy; TRL's entropy and token-accuracy logs are not computed.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = {**inputs, "use_cache": False}
        return Trainer.compute_loss(self, model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


def check_output_path(output_dir: str) -> None:
    """An output directory that is a file is refused before any model loads."""
    if Path(output_dir).exists() and not Path(output_dir).is_dir():
        raise ConfigError(f"output_dir {output_dir} is a file, not a directory; choose another --output_dir")


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(SFTRunConfig, run_sft, argv)


if __name__ == "__main__":
    exit_process(main())
