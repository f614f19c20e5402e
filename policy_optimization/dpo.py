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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from policy_optimization.sft import HFRunConfig, load_model_and_tokenizer, load_pairs, lora_config, save_final, training_kwargs
from text2grad.core.config import config_field

__all__ = ["DPORunConfig", "main"]

logger = logging.getLogger("policy_optimization.dpo")


@dataclass
class DPORunConfig(HFRunConfig):
    """Direct preference optimization on chosen/rejected pairs (the paper's DPO baseline)."""

    chosen_template: str = config_field("{chosen}", "Preferred response, with {field} placeholders.")
    rejected_template: str = config_field("{rejected}", "Dispreferred response, with {field} placeholders.")
    beta: float = config_field(0.1, "DPO temperature beta (strength of the implicit KL constraint).")
    loss_type: str = config_field("sigmoid", "TRL DPO loss type (sigmoid = the original DPO loss).")


def main(argv: Sequence[str] | None = None) -> int:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from text2grad.core.config import ConfigError, parse_config
    from text2grad.core.data import DataError

    cfg = parse_config(DPORunConfig, argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if not cfg.model_name_or_path or not cfg.dataset_path:
            raise ConfigError("set --model_name_or_path and --dataset_path")
        rows = load_pairs(cfg, {"prompt": cfg.prompt_template, "chosen": cfg.chosen_template, "rejected": cfg.rejected_template})
        same = sum(r["chosen"] == r["rejected"] for r in rows)
        if same == len(rows):
            raise DataError("every record has chosen == rejected; check chosen_template / rejected_template")
        model, tokenizer, base = load_model_and_tokenizer(cfg)
    except (ConfigError, DataError, FileNotFoundError) as exc:
        print(f"dpo: error: {exc}", file=sys.stderr)
        return 2
    args = DPOConfig(**training_kwargs(cfg), beta=cfg.beta, loss_type=[cfg.loss_type])
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        peft_config=lora_config(cfg) if cfg.use_lora else None,
    )
    result = trainer.train()
    save_final(trainer, tokenizer, cfg, base)
    logger.info("DPO done: %d steps, training loss %.4f; saved to %s", result.global_step, result.training_loss, Path(cfg.output_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
