"""``text2grad train-policy`` / ``python -m policy_optimization.train``: Text2Grad PPO from a config.

    python -m policy_optimization.train --config configs/slf5k/ppo.yaml \\
        --model_name_or_path meta-llama/Llama-3.1-8B-Instruct --adapter outputs/slf5k/sft \\
        --critic reward_model --critic_kwargs '{"path": "outputs/slf5k/reward_model"}'

    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml -m policy_optimization.train --config ...

Loads the policy (merging an SFT adapter if given), the value model, the prompts (templates filled from
each record), builds the critic and runs `NLGradientPPOTrainer`. Writes ``metrics.jsonl``,
``samples.jsonl``, ``checkpoint-<step>/`` and, at the end, ``policy/`` and ``value_model/`` into
``output_dir``. Exit codes: 0 done, 1 stopped because the feedback failed on more than
``max_feedback_error_rate`` of an iteration, 2 bad config/data/paths (found before any model loads), 3 stopped
on NaN/inf (checkpoint saved).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

from policy_optimization.ppo_config import SCALAR_SOURCES, PPOConfig
from policy_optimization.models import ValueModel
from policy_optimization.scores import build_score_fn
from policy_optimization.checkpoints import check_process_count, open_ppo_run
from policy_optimization.trainer import FeedbackFailureError, NLGradientPPOTrainer, NonFiniteError
from text2grad.core.cli import EXIT_NONFINITE, EXIT_OK, RunFailed, exit_process, print_error, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.critics import build_critic
from text2grad.core.data import DataError, load_records, record_id, render_template
from text2grad.core.generation import apply_chat_template
from text2grad.core.modeling import check_model_path, end_distributed, load_causal_lm, load_tokenizer
from text2grad.core.placement import check_process_gpus, world_size
from text2grad.core.rewards import NoFeedback

__all__ = ["main", "build_prompt_records", "load_models"]

logger = logging.getLogger("policy_optimization.train")


def build_prompt_records(cfg: PPOConfig, tokenizer) -> list[dict[str, Any]]:
    """Records with ``prompt`` (policy prompt, chat template applied if asked) and ``feedback_prompt``.

    The record's own fields are kept (critics read references and tests from them).
    """
    records = load_records(cfg.dataset_path, cfg.dataset_split, cfg.field_map, limit=cfg.max_samples)
    if not records:
        raise DataError(f"{cfg.dataset_path} holds no records")
    if cfg.use_chat_template and not getattr(tokenizer, "chat_template", None):
        logger.warning("use_chat_template is set but the tokenizer has no chat template; prompts are used as they are")
    items = []
    for i, rec in enumerate(records):
        where = record_id(rec, i)
        base = render_template(cfg.prompt_template, rec, where=where)
        prompt = apply_chat_template(tokenizer, base, cfg.system_prompt) if cfg.use_chat_template else base
        feedback_prompt = render_template(cfg.feedback_prompt_template, rec, where=where) if cfg.feedback_prompt_template else base
        items.append({**rec, "prompt": prompt, "feedback_prompt": feedback_prompt})
    return items


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def load_models(cfg: PPOConfig, tokenizer):
    """(policy, reference or None, value model (None for value_model: shared_backbone), base path for the saved adapter)."""
    policy = load_causal_lm(cfg.model_name_or_path, adapter=cfg.adapter, dtype=cfg.dtype, merge_adapter=True)
    base_path = cfg.model_name_or_path
    if cfg.adapter and cfg.use_lora:
        # The PPO adapter sits on the SFT-merged weights; save them once so the final adapter has a loadable base.
        merged = Path(cfg.output_dir) / "base_merged"
        if _is_main_process() and not (merged / "config.json").is_file():
            tmp = merged.with_name("base_merged.tmp")
            policy.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.replace(merged)
        base_path = str(merged)
    ref = load_causal_lm(cfg.ref_model_name_or_path, dtype=cfg.dtype) if cfg.ref_model_name_or_path else None
    if cfg.value_design == "shared_backbone":
        value = None  # the trainer puts a value head on the policy's own backbone
    elif cfg.value_model_name_or_path:
        value = ValueModel.from_pretrained(cfg.value_model_name_or_path, dtype=cfg.dtype)
    elif cfg.adapter:
        value = ValueModel.from_causal_lm(load_causal_lm(cfg.model_name_or_path, adapter=cfg.adapter, dtype=cfg.dtype, merge_adapter=True))
    else:
        value = ValueModel.from_pretrained(cfg.model_name_or_path, dtype=cfg.dtype)
    return policy, ref, value, base_path


def check_run_dir(cfg: PPOConfig, num_processes: int = 1) -> None:
    """The output directory rules (`text2grad.core.run_dir`), checked before any model loads: no file in
    its place, no earlier run unless resumed or overwritten, and a resumed checkpoint's config matches and was
    written by as many processes as this run has."""
    resume_from = open_ppo_run(cfg, write=False)
    if resume_from is not None:
        check_process_count(resume_from, num_processes)


def build_trainer(cfg: PPOConfig) -> NLGradientPPOTrainer:
    """Tokenizer, prompts, critic, score function, models and the trainer, cheapest first so a typo
    fails before the models load. Every error here is the user's and is raised as a ConfigError."""
    if not cfg.model_name_or_path:
        raise ConfigError("set --model_name_or_path (a hub id or a local model directory)")
    if not cfg.dataset_path:
        raise ConfigError("set --dataset_path (a .jsonl/.json file, a saved dataset or a hub id)")
    check_process_gpus()  # more processes than GPUs: exit 2 now, not a CUDA crash after the models load
    try:
        cfg.iterations()  # fails early if neither num_iterations nor total_episodes is set
        cfg.process_batch(world_size())  # batch_size must split evenly over the launched processes
        check_run_dir(cfg, world_size())
        check_model_path(cfg.model_name_or_path)
        tokenizer = load_tokenizer(cfg.tokenizer_name_or_path or cfg.model_name_or_path, padding_side="left")
        items = build_prompt_records(cfg, tokenizer)
        seen_by_source = [{**it, "prompt": it["feedback_prompt"]} for it in items]
        try:
            if cfg.critic == "none":  # scalar baseline: the score function is the whole reward
                source = NoFeedback()
            else:
                kwargs = dict(cfg.critic_kwargs)
                if cfg.rm_refresh_every and cfg.critic == "reward_model":
                    kwargs.setdefault("merge_adapter", False)  # a refresh trains the LoRA adapter, so keep it apart
                source = build_critic(cfg.critic, kwargs, records=seen_by_source)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{exc} (check --critic and --critic_kwargs)") from None
        score_fn = None
        if cfg.scalar_source != "quote_count":
            spec = SCALAR_SOURCES.get(cfg.scalar_source) or cfg.scalar_source
            try:
                score_fn = build_score_fn(spec, cfg.scalar_source_kwargs, records=seen_by_source)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{exc} (check --scalar_source and --scalar_source_kwargs)") from None
        policy, ref, value, base_path = load_models(cfg, tokenizer)
        return NLGradientPPOTrainer(cfg, tokenizer, policy, ref, value, source, items, score_fn=score_fn, base_model_path=base_path)
    except (ConfigError, DataError, FileNotFoundError, FileExistsError):
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    except ImportError as exc:  # e.g. openai for critic llm, peft for use_lora
        fix = f"pip install {exc.name.split('.')[0]}" if exc.name else "install the missing package"
        raise ConfigError(
            f"{exc}. The chosen critic, scalar_source or model options need a package that is not "
            f"installed: {fix}"
        ) from None
    except TypeError as exc:
        # Setup only builds objects from the config, so a TypeError here almost always means wrong
        # critic_kwargs / scalar_source_kwargs for a constructor. The traceback stays available with
        # debug logging in case it is a bug after all; errors during training are never caught like this.
        logger.debug("setup raised TypeError", exc_info=True)
        raise ConfigError(
            f"{exc}. Check critic_kwargs / scalar_source_kwargs against the constructor of "
            f"{cfg.critic!r} / {cfg.scalar_source!r}"
        ) from None


def train_policy(cfg: PPOConfig) -> int:
    """Build and run the trainer. Exit codes: 0 done, 1 feedback failed, 2 user error, 3 NaN/inf."""
    trainer = build_trainer(cfg)
    try:
        metrics = trainer.train()
    except NonFiniteError as exc:
        print_error(f"stopped: {exc}")
        return EXIT_NONFINITE
    except FeedbackFailureError as exc:
        raise RunFailed(f"stopped: {exc}") from None
    finally:
        close = getattr(trainer.critic, "close", None)
        if callable(close):
            close()
    if trainer.accelerator.is_main_process and metrics:
        logger.info(
            "done: %d iterations, score %.4f, KL %.3f; policy saved to %s",
            metrics["iteration"], metrics["reward/score_mean"], metrics["objective/kl"], Path(cfg.output_dir) / "policy",
        )
    end_distributed()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PPOConfig, train_policy, argv)


if __name__ == "__main__":
    exit_process(main())
