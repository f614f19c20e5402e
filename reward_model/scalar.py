"""The scalar reward model of the paper's PPO baseline: a sequence classifier trained on preference pairs.

    python -m reward_model.scalar --config configs/slf5k/scalar_rm.yaml           # one device
    text2grad train-scalar-rm --config configs/slf5k/scalar_rm.yaml
    deepspeed --num_gpus 8 -m reward_model.scalar --config ... --deepspeed configs/deepspeed/zero3.json
    accelerate launch --num_processes 8 -m reward_model.scalar --config ...

Standard RLHF (Bradley-Terry): a causal LM with a one-output head, ``r(x, y)``, trained on pairs
``(x, y_chosen, y_rejected)`` with the pairwise loss ``-log sigmoid(r(x, y_c) - r(x, y_r))``, through TRL's
`RewardTrainer` (LoRA through peft by default). The pairs are the ``preference_pairs.jsonl`` files of
``text2grad prepare-data`` (fields ``prompt``, ``chosen``, ``rejected``): SLF5K's own comparisons,
UltraFeedback's chosen/rejected, KodCode's passing/failing programs (paper, Appendix N).

Encoding (`encode_pair_text`, shared by training and scoring so PPO scores exactly what was trained):
``prompt_template`` filled with the prompt (special tokens such as BOS added by the tokenizer), then the
response tokens, then EOS; when too long, the prompt is cut from the left (the response is never cut).

Evaluation: pairwise accuracy (share of held-out pairs whose chosen response scores higher; ties count as
wrong) and the mean margin, written to ``<output_dir>/eval_pairwise.json``. The held-out pairs are
``eval_dataset_path`` or, without one, an ``eval_fraction`` of the training pairs set aside (seeded).

In PPO (``--reward_mode scalar --scalar_source scalar_rm --scalar_source_kwargs '{"path": DIR}'``) the
trained model is the score function, `ScalarRewardScorer`: ``scorer(prompts, responses) -> list[float]``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel
from transformers import AutoModelForSequenceClassification, set_seed
from trl import RewardConfig, RewardTrainer

from reward_model.scalar_config import ScalarRMConfig
from reward_model.train import _allow_deepspeed_on_cpu, _strip_launcher_args, shared_training_kwargs
from text2grad.core.cli import EXIT_OK, exit_process, run_cli
from text2grad.core.config import ConfigError, load_config, save_config
from text2grad.core.data import DataError, load_records
from text2grad.core.modeling import end_distributed, is_adapter_only, load_tokenizer, merge_first, resolve_dtype
from text2grad.core.placement import resolve_device
from text2grad.core.run_dir import MetricsJsonl

__all__ = [
    "CONFIG_FILENAME",
    "pairwise_loss",
    "encode_pair_text",
    "load_pairs",
    "ScalarRewardScorer",
    "pairwise_accuracy",
    "train",
    "main",
]

logger = logging.getLogger("reward_model.scalar")

CONFIG_FILENAME = "scalar_rm_config.yaml"


# --------------------------------------------------------------------------------------------------
# Definitions
# --------------------------------------------------------------------------------------------------


def pairwise_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry loss ``mean(-log sigmoid(r_c - r_r))`` over (B,) rewards (the loss TRL's RewardTrainer uses)."""
    return -torch.nn.functional.logsigmoid(chosen_rewards - rejected_rewards).mean()


def encode_pair_text(tokenizer, prompt: str, response: str, *, prompt_template: str, max_length: int) -> list[int]:
    """Token ids of one (prompt, response) for the scalar reward model: template(prompt) + response + EOS.

    The prompt part keeps the tokenizer's special tokens (e.g. BOS); if the whole exceeds ``max_length``
    the prompt tokens are cut from the left (a leading BOS is kept), never the response.
    """
    head = tokenizer(prompt_template.format(prompt=prompt), add_special_tokens=True)["input_ids"]
    body = tokenizer(response, add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    room = max_length - len(body) - len(eos)
    if len(head) > room:
        bos = head[:1] if tokenizer.bos_token_id is not None and head[:1] == [tokenizer.bos_token_id] else []
        keep = max(room - len(bos), 0)
        head = bos + (head[len(head) - keep :] if keep else [])
    return (head + body + eos)[-max_length:] if len(head) + len(body) + len(eos) > max_length else head + body + eos


def load_pairs(path: str, split: str, field_map: dict[str, str], limit: int | None = None) -> list[dict[str, str]]:
    """Preference pairs with string ``prompt``, ``chosen`` and ``rejected``; a clear error naming a bad record."""
    records = load_records(path, split, field_map, limit=limit)
    out = []
    for i, rec in enumerate(records):
        missing = [k for k in ("prompt", "chosen", "rejected") if not isinstance(rec.get(k), str)]
        if missing:
            raise DataError(
                f"{path}: record {i} lacks string field(s) {missing} (it has {sorted(rec)}); preference pairs need "
                "prompt, chosen and rejected (rename fields with field_map)"
            )
        out.append({"prompt": rec["prompt"], "chosen": rec["chosen"], "rejected": rec["rejected"]})
    if not out:
        raise DataError(f"{path} holds no preference pairs")
    return out


def split_pairs(pairs: list[dict[str, str]], fraction: float, seed: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, held out): a seeded random ``fraction`` of the pairs held out (at least one when fraction > 0)."""
    if fraction <= 0 or len(pairs) < 2:
        return pairs, []
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_eval = min(max(1, round(len(pairs) * fraction)), len(pairs) - 1)
    held = set(order[:n_eval])
    return [p for i, p in enumerate(pairs) if i not in held], [p for i, p in enumerate(pairs) if i in held]


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------


class ScalarRewardScorer:
    """A trained scalar reward model as a score function: ``scorer(prompts, responses) -> list[float]``.

    Args:
        path: the ``output_dir`` of `train` (LoRA adapter or full weights, tokenizer, config).
        device: torch device (default: this process's own device, `text2grad.core.placement.resolve_device`:
            ``cuda:<LOCAL_RANK>`` under a launcher, so every rank scores on its own GPU; cpu without CUDA).
        batch_size: sequences per forward pass.
        model: an already built model (tests); ``tokenizer`` and ``config`` must come with it.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        device: str | None = None,
        batch_size: int = 16,
        model: Any = None,
        tokenizer: Any = None,
        config: ScalarRMConfig | None = None,
    ) -> None:
        if model is None:
            if not path:
                raise ValueError("ScalarRewardScorer needs path (the trained scalar reward model directory)")
            model, tokenizer, config = _load_trained(path)
        if tokenizer is None or config is None:
            raise ValueError("pass tokenizer and config together with model")
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer, self.config, self.batch_size = tokenizer, config, batch_size

    @torch.no_grad()
    def score_ids(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """r for each token-id sequence (right padded like the training collator)."""
        out: list[float] = []
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(sequences), self.batch_size):
            chunk = [list(s) for s in sequences[start : start + self.batch_size]]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, seq in enumerate(chunk):
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            out.extend(float(x) for x in logits.float().squeeze(-1).cpu())
        return out

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        cfg = self.config
        seqs = [
            encode_pair_text(self.tokenizer, p, r, prompt_template=cfg.prompt_template, max_length=cfg.max_length)
            for p, r in zip(prompts, responses)
        ]
        return self.score_ids(seqs)


def pairwise_accuracy(scorer: ScalarRewardScorer, pairs: Sequence[dict[str, str]]) -> dict[str, float]:
    """Share of pairs whose chosen response scores strictly higher, and the mean margin r_c - r_r."""
    if not pairs:
        return {"pairs": 0, "accuracy": float("nan"), "mean_margin": float("nan")}
    chosen = scorer([p["prompt"] for p in pairs], [p["chosen"] for p in pairs])
    rejected = scorer([p["prompt"] for p in pairs], [p["rejected"] for p in pairs])
    margins = [c - r for c, r in zip(chosen, rejected)]
    return {
        "pairs": len(pairs),
        "accuracy": sum(m > 0 for m in margins) / len(margins),
        "mean_margin": sum(margins) / len(margins),
    }


def _load_trained(path: str):
    root = Path(path)
    cfg_file = root / CONFIG_FILENAME
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path} is not a trained scalar reward model (no {CONFIG_FILENAME}); train one with "
                                "python -m reward_model.scalar")
    cfg = load_config(ScalarRMConfig, cfg_file)
    tokenizer = load_tokenizer(str(root), padding_side="right")
    dtype = resolve_dtype(cfg.dtype)
    kwargs = {"num_labels": 1, **({"dtype": dtype} if dtype is not None else {})}
    if (root / "adapter_config.json").is_file():
        base = AutoModelForSequenceClassification.from_pretrained(cfg.model_name_or_path, **kwargs)
        base.config.pad_token_id = tokenizer.pad_token_id
        model = PeftModel.from_pretrained(base, str(root)).merge_and_unload()
    else:
        model = AutoModelForSequenceClassification.from_pretrained(str(root), **kwargs)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, cfg


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def _reward_config(cfg: ScalarRMConfig):
    return RewardConfig(
        **shared_training_kwargs(RewardConfig, cfg, warmup_ratio=0.0),
        max_length=None,  # encode_pair_text already fits every pair (prompt cut from the left)
        center_rewards_coefficient=cfg.center_rewards_coefficient,
    )


def _encode_dataset(cfg: ScalarRMConfig, tokenizer, pairs: Sequence[dict[str, str]]):
    enc = lambda p, r: encode_pair_text(tokenizer, p, r, prompt_template=cfg.prompt_template, max_length=cfg.max_length)  # noqa: E731
    rows = [{"chosen_ids": enc(p["prompt"], p["chosen"]), "rejected_ids": enc(p["prompt"], p["rejected"])} for p in pairs]
    return Dataset.from_list(rows)


def train(cfg: ScalarRMConfig) -> dict[str, Any]:
    """Train on ``cfg.dataset_path``, save to ``cfg.output_dir`` and return training + held-out metrics."""
    if not cfg.model_name_or_path:
        raise ConfigError("set --model_name_or_path (a hub id or a local model directory)")
    if not cfg.dataset_path:
        raise ConfigError("set --dataset_path (preference_pairs.jsonl from `text2grad prepare-data`)")
    if is_adapter_only(cfg.model_name_or_path):
        raise ConfigError(
            f"model_name_or_path {cfg.model_name_or_path} holds only a LoRA adapter; a scalar reward model puts its "
            f"score head on a whole model. {merge_first(cfg.model_name_or_path)}"
        )
    pairs = load_pairs(cfg.dataset_path, cfg.dataset_split, cfg.field_map, cfg.limit)
    if cfg.eval_dataset_path:
        train_pairs, eval_pairs = pairs, load_pairs(cfg.eval_dataset_path, cfg.eval_dataset_split, cfg.field_map)
    else:
        train_pairs, eval_pairs = split_pairs(pairs, cfg.eval_fraction, cfg.seed)
    if cfg.deepspeed and os.environ.get("DS_ACCELERATOR") == "cpu" and not torch.cuda.is_available():
        _allow_deepspeed_on_cpu()
    args = _reward_config(cfg)  # first: a ZeRO-3 config must be registered before the weights load
    set_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.tokenizer_name_or_path or cfg.model_name_or_path, padding_side="right")
    dtype = resolve_dtype(cfg.dtype)
    model = AutoModelForSequenceClassification.from_pretrained(
        cfg.model_name_or_path, num_labels=1, **({"dtype": dtype} if dtype is not None else {})
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    peft_config = None
    if cfg.use_lora:
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        targets = [m for m in cfg.lora_target_modules if m in names or m == "all-linear"]
        if not targets:
            raise ConfigError(f"none of lora_target_modules {cfg.lora_target_modules} exist in {cfg.model_name_or_path}")
        peft_config = LoraConfig(
            task_type="SEQ_CLS", r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=targets[0] if targets == ["all-linear"] else targets,
        )
    trainer = RewardTrainer(
        model=model, args=args, train_dataset=_encode_dataset(cfg, tokenizer, train_pairs),
        processing_class=tokenizer, peft_config=peft_config,
        callbacks=[MetricsJsonl(fresh=True)],
    )
    result = trainer.train()
    metrics: dict[str, Any] = {"train_pairs": len(train_pairs), **result.metrics}
    trainer.save_model(cfg.output_dir)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(cfg.output_dir)
        save_config(cfg, Path(cfg.output_dir) / CONFIG_FILENAME)
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        if eval_pairs:
            scorer = ScalarRewardScorer(model=unwrapped, tokenizer=tokenizer, config=cfg,
                                        device=str(trainer.accelerator.device), batch_size=cfg.eval_batch_size)
            report = pairwise_accuracy(scorer, eval_pairs)
            report["source"] = cfg.eval_dataset_path or f"{cfg.eval_fraction:.0%} of {cfg.dataset_path} (seed {cfg.seed})"
            (Path(cfg.output_dir) / "eval_pairwise.json").write_text(json.dumps(report, indent=2))
            metrics.update({f"eval_{k}": v for k, v in report.items()})
        trainer.save_metrics("train", {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    return metrics


def train_scalar_reward_model(cfg: ScalarRMConfig) -> int:
    metrics = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        acc = metrics.get("eval_accuracy")
        shown = f", held-out pairwise accuracy {acc:.3f} on {metrics['eval_pairs']} pairs" if acc is not None else ""
        print(f"scalar reward model saved to {cfg.output_dir} ({metrics['train_pairs']} training pairs{shown})")
    end_distributed()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(ScalarRMConfig, train_scalar_reward_model, _strip_launcher_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    exit_process(main())
