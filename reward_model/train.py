"""Train the generative reward model: (prompt x, response y) -> z = critique + span JSON (paper Sec. 3.4).

One device::

    python -m reward_model.train --config configs/slf5k/reward_model.yaml

Several devices with DeepSpeed (ZeRO-2 or ZeRO-3 JSON from configs/deepspeed/)::

    deepspeed --num_gpus 8 -m reward_model.train --config configs/slf5k/reward_model.yaml \\
        --deepspeed configs/deepspeed/zero3.json
    accelerate launch --num_processes 8 -m reward_model.train --config ...

Causal-LM maximum likelihood on z only (teacher forcing; prompt and response tokens carry label -100), built
on the transformers `Trainer`. LoRA through peft by default; ``--use_lora false`` fine-tunes every weight.
The output directory (and every ``checkpoint-N`` in it) holds the adapter (or full weights), the tokenizer
and ``text2grad_config.yaml``, the exact config, which inference reads back so the model is always asked
the way it was trained. ``--resume auto`` continues from the newest checkpoint (after checking that its saved
config matches). An output directory that holds an earlier run is refused unless ``--overwrite_output_dir
true`` (which removes that run's checkpoints and logs first) or ``--resume``. Every logged step (loss, learning
rate, gradient norm, eval loss) is appended to ``metrics.jsonl`` in the output directory, as PPO does.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import random
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType
from peft import LoraConfig, get_peft_model
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

from reward_model.serialization import collate, encode_example, record_feedback
from reward_model.train_config import CONFIG_FILENAME, MEMBER_PREFIX, RewardModelConfig
from text2grad.core import run_dir
from text2grad.core.cli import EXIT_OK, exit_process, run_cli
from text2grad.core.config import ConfigError, save_config
from text2grad.core.data import DataError, load_records
from text2grad.core.modeling import (
    check_model_path, end_distributed, is_adapter_only, load_causal_lm, load_tokenizer, merge_first,
)
from text2grad.core.placement import check_process_gpus

__all__ = ["CONFIG_FILENAME", "bootstrap_resample", "build_dataset", "ensemble_member_configs", "train", "main"]

logger = logging.getLogger("reward_model.train")

REQUIRED_FIELDS = ("prompt", "response", "critique", "good_spans", "poor_spans")


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


class _Examples(torch.utils.data.Dataset):
    def __init__(self, examples: list[dict[str, list[int]]]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.examples[i]


def bootstrap_resample(records: Sequence[Any], seed: int) -> list[Any]:
    """As many records as given, drawn with replacement with ``seed`` (an ensemble member's own resample)."""
    rng = random.Random(seed)
    return [records[rng.randrange(len(records))] for _ in records]


def build_dataset(
    cfg: RewardModelConfig, tokenizer, source: str, split: str, limit: int | None = None,
    bootstrap_seed: int | None = None,
) -> tuple[_Examples, int]:
    """Load annotated records and tokenize them (a bootstrap resample of them when ``bootstrap_seed`` is given).
    Returns (dataset, number of records dropped for length)."""
    required = REQUIRED_FIELDS if cfg.target_format == "cot" else tuple(f for f in REQUIRED_FIELDS if f != "critique")
    records = load_records(source, split=split, field_map=cfg.field_map, required=required, limit=limit)
    if bootstrap_seed is not None and records:
        records = bootstrap_resample(records, bootstrap_seed)
    examples, dropped = [], 0
    for rec in records:
        enc = encode_example(
            tokenizer,
            str(rec["prompt"]),
            str(rec["response"]),
            record_feedback(rec),
            max_length=cfg.max_length,
            instruction=cfg.instruction,
            prompt_format=cfg.prompt_format,
            target_format=cfg.target_format,
        )
        if enc is None:
            dropped += 1
        else:
            examples.append(enc.as_dict())
    if not examples:
        raise DataError(
            f"{source}: none of {len(records)} records fit in max_length={cfg.max_length} tokens "
            "(response + critique + JSON); raise --max_length"
        )
    return _Examples(examples), dropped


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


def check_adapter_base(cfg: RewardModelConfig) -> None:
    """Refuse a LoRA reward model on an adapter-only ``model_name_or_path`` (e.g. a LoRA SFT output): its adapter
    would name that adapter's bare base model and reload without the SFT weights, silently another model."""
    path = cfg.model_name_or_path
    if cfg.use_lora and is_adapter_only(path):
        raise ConfigError(
            f"model_name_or_path {path} holds only a LoRA adapter: a LoRA reward model trained on it would reload on "
            f"the adapter's base model without that adapter. {merge_first(path)}, or fine-tune the merged weights "
            "fully with --use_lora false"
        )


def _build_model(cfg: RewardModelConfig):
    # an adapter-only folder (use_lora false; check_adapter_base refuses it for LoRA) is folded into its base: the
    # full weights trained and saved are the adapted model's
    model = load_causal_lm(cfg.model_name_or_path, dtype=cfg.dtype, merge_adapter=True)
    if cfg.gradient_checkpointing:
        model.config.use_cache = False
    if not cfg.use_lora:
        return model.requires_grad_(True)  # a merged adapter leaves its base frozen, as PEFT loaded it

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in cfg.lora_target_modules if m not in names]
    if len(missing) == len(cfg.lora_target_modules):
        raise ConfigError(
            f"none of lora_target_modules {cfg.lora_target_modules} exist in {cfg.model_name_or_path}; "
            f"set --lora_target_modules to some of its linear layers"
        )
    lora = LoraConfig(
        task_type="CAUSAL_LM",
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=[m for m in cfg.lora_target_modules if m in names],
        bias="none",
    )
    model = get_peft_model(model, lora)
    if cfg.gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    return model


# Files of a run in output_dir besides its checkpoints (a fresh run refuses them, or removes them to overwrite).
RUN_FILES = (
    CONFIG_FILENAME, run_dir.METRICS_FILE, run_dir.CHANGES_FILE, "trainer_state.json", "train_results.json",
    "all_results.json", "eval_results.json", "adapter_config.json", "adapter_model.safetensors", "model.safetensors",
)
# Config keys a resumed run may change without --accept_config_changes: how long and how visibly it runs.
RESUMABLE_KEYS = (
    "resume", "overwrite_output_dir", "accept_config_changes", "output_dir", "num_train_epochs", "max_steps",
    "save_steps", "save_total_limit", "eval_steps", "logging_steps", "report_to", "progress_bar",
)
_CHECKPOINT_MARKER = "trainer_state.json"  # what transformers writes into every checkpoint-N


def prepare_run_dir(cfg: RewardModelConfig, is_main: bool) -> Path | None:
    """The output-directory rules (`text2grad.core.run_dir.open_run`), applied before any model loads; returns
    the checkpoint to resume from (None: a fresh run, after removing an earlier one's files when overwriting)."""
    return run_dir.open_run(
        cfg.output_dir, cfg, marker=_CHECKPOINT_MARKER, config_file=CONFIG_FILENAME, run_files=RUN_FILES,
        resumable_keys=RESUMABLE_KEYS, step_key="global_step", is_main=is_main,
    )


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def _allow_deepspeed_on_cpu() -> None:
    """Let the Trainer run DeepSpeed on CPU ranks (``DS_ACCELERATOR=cpu``), as CI does to test the ZeRO path.

    accelerate only knows DeepSpeed on accelerators: on a CPU rank under the deepspeed launcher it finds no
    communication backend and sets up a world of one process, so every rank trains alone. DeepSpeed itself
    runs its CPU ranks over a gloo process group; this tells accelerate the same. GPU runs never get here.
    """
    if getattr(PartialState._prepare_backend, "_text2grad_cpu", False):
        return
    original = PartialState._prepare_backend

    def prepare_backend(self, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None):
        found, kind = original(self, cpu, sagemaker_dp, backend)
        if found is None and int(os.environ.get("LOCAL_RANK", -1)) != -1:
            return "gloo", DistributedType.MULTI_CPU
        return found, kind

    prepare_backend._text2grad_cpu = True  # type: ignore[attr-defined]
    PartialState._prepare_backend = prepare_backend


def _checkpointing_kwargs(args_cls, enabled: bool) -> dict[str, bool]:
    """transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing``; pass whichever exists."""
    if not enabled:
        return {}
    params = inspect.signature(args_cls.__init__).parameters
    return {"activation_checkpointing" if "activation_checkpointing" in params else "gradient_checkpointing": True}


def _warmup_kwargs(args_cls, ratio: float) -> dict[str, float]:
    """TrainingArguments keywords for linear warmup over ``ratio`` of the training steps, on transformers 4.x and 5.

    transformers 5 dropped ``warmup_ratio`` and reads a float ``warmup_steps`` below 1 as a ratio, but 4.x takes
    ``warmup_steps`` as a step count (0.05 steps = no warmup), so the ratio must go to ``warmup_ratio`` there.
    """
    fields = {f.name: f for f in dataclasses.fields(args_cls)} if dataclasses.is_dataclass(args_cls) else {}
    legacy = fields.get("warmup_ratio")
    if legacy is not None and "deprecated" not in str(legacy.metadata.get("help", "")).lower():
        return {"warmup_ratio": ratio}
    return {"warmup_steps": ratio}


def _length_grouping_kwargs(args_cls, on: bool) -> dict[str, Any]:
    """TrainingArguments keywords for length-grouped batches: transformers 5 names it ``train_sampling_strategy``,
    4.x ``group_by_length``."""
    fields = {f.name for f in dataclasses.fields(args_cls)} if dataclasses.is_dataclass(args_cls) else set()
    if "train_sampling_strategy" in fields:
        return {"train_sampling_strategy": "group_by_length" if on else "random"}
    return {"group_by_length": on}


def shared_training_kwargs(args_cls, cfg: Any, *, warmup_ratio: float) -> dict[str, Any]:
    """The `transformers.TrainingArguments` keywords that both reward models (this module's and
    `reward_model.scalar`'s `RewardConfig`) set the same way from their configs: optimisation, precision,
    DeepSpeed, checkpoints, logging, seed and the progress bar. ``args_cls`` is the arguments class the
    keywords are for (transformers 4.x and 5 name warm-up and checkpointing differently). A launch with more
    processes than visible GPUs is refused here (`check_process_gpus`), before accelerate would crash on it."""
    check_process_gpus()
    return dict(
        output_dir=cfg.output_dir,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type,
        **_warmup_kwargs(args_cls, warmup_ratio),
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        **_checkpointing_kwargs(args_cls, cfg.gradient_checkpointing),
        bf16=cfg.bf16,
        deepspeed=cfg.deepspeed,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        report_to=[r for r in cfg.report_to.split(",") if r and r != "none"] or "none",
        seed=cfg.seed,
        disable_tqdm=not cfg.progress_bar,
        dataloader_num_workers=0,
    )


def training_arguments(cfg: RewardModelConfig):
    """The `transformers.TrainingArguments` for ``cfg`` (building them registers a ZeRO-3 DeepSpeed config)."""
    return TrainingArguments(
        **shared_training_kwargs(TrainingArguments, cfg, warmup_ratio=cfg.warmup_ratio),
        per_device_eval_batch_size=cfg.per_device_eval_batch_size,
        **_length_grouping_kwargs(TrainingArguments, cfg.group_by_length),
        fp16=cfg.fp16,
        eval_strategy="steps" if cfg.eval_dataset_path else "no",
        eval_steps=cfg.eval_steps if cfg.eval_dataset_path else None,
        remove_unused_columns=False,  # our examples are already model inputs
    )


def train(cfg: RewardModelConfig) -> dict[str, Any]:
    """Run training and save the result in ``cfg.output_dir``. Returns the final training metrics."""
    if not cfg.dataset_path:
        raise ConfigError("dataset_path is required (annotated JSONL from the annotation phase)")
    is_main = int(os.environ.get("RANK", "0")) == 0
    resume = prepare_run_dir(cfg, is_main)
    check_model_path(cfg.model_name_or_path)
    check_adapter_base(cfg)
    if cfg.deepspeed and os.environ.get("DS_ACCELERATOR") == "cpu" and not torch.cuda.is_available():
        _allow_deepspeed_on_cpu()
    # TrainingArguments first: with a ZeRO-3 config it registers DeepSpeed so that from_pretrained
    # partitions the weights while loading instead of materialising the full model on every rank.
    args = training_arguments(cfg)
    set_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.tokenizer_name_or_path or cfg.model_name_or_path, padding_side="right")
    train_set, dropped = build_dataset(cfg, tokenizer, cfg.dataset_path, cfg.dataset_split, cfg.limit,
                                       bootstrap_seed=cfg.seed if cfg.bootstrap else None)
    eval_set = None
    if cfg.eval_dataset_path:
        eval_set, eval_dropped = build_dataset(cfg, tokenizer, cfg.eval_dataset_path, cfg.eval_dataset_split)
        dropped += eval_dropped
    if dropped and args.process_index == 0:
        logger.warning("dropped %d record(s) longer than max_length=%d tokens", dropped, cfg.max_length)
    model = _build_model(cfg)
    if args.process_index == 0 and cfg.use_lora:
        numel = lambda p: getattr(p, "ds_numel", p.numel())  # noqa: E731 - ZeRO-3 params are partitioned
        trainable = sum(numel(p) for p in model.parameters() if p.requires_grad)
        total = sum(numel(p) for p in model.parameters())
        logger.info("LoRA: %d trainable of %d parameters (%.3f%%)", trainable, total, 100 * trainable / max(total, 1))

    class SaveConfig(TrainerCallback):
        """Put the exact config next to every checkpoint, so any checkpoint can be served or resumed alone."""

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if ckpt.is_dir():
                    save_config(cfg, ckpt / CONFIG_FILENAME)

    pad_id = tokenizer.pad_token_id
    trainer = Trainer(
        model=model,
        args=args,
        data_collator=lambda batch: collate(batch, pad_id),
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        callbacks=[SaveConfig(), run_dir.MetricsJsonl()],
    )
    result = trainer.train(resume_from_checkpoint=resume)
    metrics = dict(result.metrics)
    metrics["train_examples"] = len(train_set)
    metrics["dropped_too_long"] = dropped
    if eval_set is not None:  # the final model's eval loss, reusing the in-loop one when it was just computed
        last = next((h for h in reversed(trainer.state.log_history) if "eval_loss" in h), None)
        fresh = last is not None and last.get("step") == trainer.state.global_step
        metrics.update({k: v for k, v in last.items() if k.startswith("eval_")} if fresh else trainer.evaluate())
    trainer.save_model(cfg.output_dir)  # adapter only for LoRA; gathers ZeRO-3 shards
    if trainer.is_world_process_zero():
        tokenizer.padding_side = "left"  # the saved tokenizer is for generation
        tokenizer.save_pretrained(cfg.output_dir)
        save_config(cfg, Path(cfg.output_dir) / CONFIG_FILENAME)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
    return metrics


def _strip_launcher_args(argv: Sequence[str]) -> list[str]:
    """Drop ``--local_rank=N`` that the deepspeed launcher appends (the rank also arrives as LOCAL_RANK)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg.startswith(("--local_rank=", "--local-rank=")):
            continue
        if arg in ("--local_rank", "--local-rank"):
            skip = True
            continue
        out.append(arg)
    return out


def ensemble_member_configs(cfg: RewardModelConfig) -> list[RewardModelConfig]:
    """The K member configs of ``ensemble_size`` K: ``<output_dir>/member-<k>``, seed ``seed + k`` (with
    ``bootstrap``, the seed of its resample too); a single config (cfg itself) when K is 1."""
    if cfg.ensemble_size == 1:
        return [cfg]
    return [dataclasses.replace(cfg, output_dir=str(Path(cfg.output_dir) / f"{MEMBER_PREFIX}{k}"), seed=cfg.seed + k,
                                ensemble_size=1) for k in range(cfg.ensemble_size)]


def train_reward_model(cfg: RewardModelConfig) -> int:
    for member in ensemble_member_configs(cfg):
        metrics = train(member)
        if int(os.environ.get("RANK", "0")) == 0:
            loss = metrics.get("train_loss")
            shown = f"{loss:.4f}" if isinstance(loss, float) and math.isfinite(loss) else loss
            print(f"reward model saved to {member.output_dir} (train_loss={shown}, examples={metrics['train_examples']})")
    end_distributed()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(RewardModelConfig, train_reward_model, _strip_launcher_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    exit_process(main())
