"""``text2grad dpo`` / ``python -m policy_optimization.dpo``: the DPO baseline with TRL's DPOTrainer.

    python -m policy_optimization.dpo --config configs/ultrafeedback/dpo.yaml \\
        --model_name_or_path meta-llama/Llama-3.1-8B-Instruct --adapter outputs/ultrafeedback/sft

Each record gives a prompt and a chosen and a rejected response (``chosen_template`` / ``rejected_template``
filled from its fields, e.g. ``{chosen}`` / ``{rejected}``; map other names with ``field_map``). With LoRA
the reference model is the base with the adapter disabled (TRL's default), without it a frozen copy.
The output directory holds the adapter (or full model) and the tokenizer, loadable with
``text2grad.core.modeling.load_causal_lm``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from datasets import Dataset
from trl import DPOConfig, DPOTrainer

from policy_optimization.dpo_config import DPORunConfig
from policy_optimization.sft import (
    check_output_path,
    load_pairs,
    load_with_arguments,
    lora_config,
    save_final,
    training_kwargs,
)
from text2grad.core.cli import EXIT_OK, exit_process, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.data import DataError
from text2grad.core.modeling import check_model_path, end_distributed
from text2grad.core.run_dir import MetricsJsonl

__all__ = ["main"]

logger = logging.getLogger("policy_optimization.dpo")


def run_dpo(cfg: DPORunConfig) -> int:
    if not cfg.model_name_or_path or not cfg.dataset_path:
        raise ConfigError("set --model_name_or_path and --dataset_path")
    check_output_path(cfg.output_dir)
    rows = load_pairs(cfg, {"prompt": cfg.prompt_template, "chosen": cfg.chosen_template, "rejected": cfg.rejected_template})
    same = sum(r["chosen"] == r["rejected"] for r in rows)
    if same == len(rows):
        raise DataError("every record has chosen == rejected; check chosen_template / rejected_template")
    check_model_path(cfg.model_name_or_path)
    args, model, tokenizer, base = load_with_arguments(
        cfg, lambda: DPOConfig(**training_kwargs(cfg), beta=cfg.beta, loss_type=[cfg.loss_type])
    )
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        peft_config=lora_config(cfg) if cfg.use_lora else None, callbacks=[MetricsJsonl(fresh=True)],
    )
    result = trainer.train()
    save_final(trainer, tokenizer, cfg, base)
    logger.info("DPO done: %d steps, training loss %.4f; saved to %s", result.global_step, result.training_loss, Path(cfg.output_dir))
    end_distributed()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(DPORunConfig, run_dpo, argv)


if __name__ == "__main__":
    exit_process(main())
