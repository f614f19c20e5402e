"""Fold a LoRA reward-model adapter into its base model and save a standalone model directory.

    python -m reward_model.merge --adapter outputs/slf5k/reward_model --output_dir outputs/slf5k/reward_model_merged

The merged directory holds the weights, the tokenizer (the adapter's own copy when it has one) and the
training ``text2grad_config.yaml``, so `GenerativeRewardModel.from_pretrained(merged_dir)` asks it the same
way it was trained, and serving stacks without PEFT (vLLM without LoRA, TGI) can load it directly.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Sequence

from peft import PeftConfig

from reward_model.merge_config import MergeConfig
from reward_model.train_config import CONFIG_FILENAME
from text2grad.core.cli import EXIT_OK, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.modeling import load_causal_lm, load_tokenizer

__all__ = ["merge", "main"]



def merge(cfg: MergeConfig) -> Path:
    """Write the merged model to ``cfg.output_dir`` and return that path."""
    adapter = Path(cfg.adapter)
    if not cfg.adapter or not (adapter / "adapter_config.json").is_file():
        raise ConfigError(
            f"adapter {cfg.adapter!r} is not a LoRA adapter directory (no adapter_config.json); a full fine-tune "
            "needs no merge"
        )
    if not cfg.output_dir:
        raise ConfigError("output_dir is required")
    out = Path(cfg.output_dir)
    if out.resolve() == adapter.resolve():
        raise ConfigError("output_dir must differ from the adapter directory")
    base = cfg.base_model or PeftConfig.from_pretrained(str(adapter)).base_model_name_or_path
    model = load_causal_lm(base, adapter=str(adapter), dtype=cfg.dtype, merge_adapter=True)
    tok_dir = str(adapter) if (adapter / "tokenizer_config.json").is_file() else base
    tokenizer = load_tokenizer(tok_dir, padding_side="left")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=cfg.max_shard_size)
    tokenizer.save_pretrained(out)
    if (adapter / CONFIG_FILENAME).is_file():
        shutil.copyfile(adapter / CONFIG_FILENAME, out / CONFIG_FILENAME)
    return out


def run_merge(cfg: MergeConfig) -> int:
    out = merge(cfg)
    print(f"merged model written to {out}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(MergeConfig, run_merge, argv)


if __name__ == "__main__":
    sys.exit(main())
