"""Text2Grad-GRPO: TRL's `GRPOTrainer` with token-level advantages from span feedback.

GRPO has no value model: each completion's advantage is its sequence reward normalized within its group of
``num_generations`` samples of the same prompt. This variant keeps that baseline and adds the span rewards
of the feedback on top, per token::

    A[b, t] = A_group[b] + span_coef * delta[b, t]

with ``delta`` the +1 / -1 / 0 span rewards of `text2grad.core.rewards` on the exact completion ids
(``reward_scheme`` and the span rules as in PPO). TRL's loss accepts advantages of shape (B, T) and applies
its clipped ratio per token, so a flagged span is pushed up or down on its own tokens while the rest of the
completion follows the group baseline.

By default the sequence reward is the feedback's own score, ``(#good - #poor quotes) / (#good + #poor)``
(`span_sequence_score`); pass ``reward_funcs`` to use task rewards (e.g. unit tests) instead. The feedback
source is asked once per completion (the default reward function and the token advantages share it)::

    trainer = Text2GradGRPOTrainer(model, args=GRPOConfig(...), train_dataset=ds, processing_class=tok,
                                   critic=build_critic("reference", records=records))
    trainer.train()

From the command line (`GRPORunConfig`; YAML in configs/<dataset>/grpo.yaml, flags override it)::

    python -m policy_optimization.grpo --config configs/slf5k/grpo.yaml \
        --critic reward_model --critic_kwargs '{"path": "runs/slf5k/reward_model"}'
    text2grad train-grpo --config ...                       # the same
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml -m policy_optimization.grpo --config ...
    python -m policy_optimization.grpo --config ... --use_vllm true --vllm_mode colocate    # GPU: vLLM rollouts

``use_vllm``/``vllm_mode``/``vllm_gpu_memory_utilization`` go to TRL's `GRPOConfig` unchanged (GPU only: colocate
mode is refused on CPU, where TRL's weight sync into vLLM fails; see policy_optimization/README.md). ``span_coef 0`` gives plain GRPO on the same sequence reward, the scalar-advantage baseline.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from datasets import Dataset
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from policy_optimization.ppo_config import SCALAR_SOURCES
from policy_optimization.grpo_config import GRPORunConfig
from policy_optimization.scores import build_score_fn
from reward_model.train import _allow_deepspeed_on_cpu
from policy_optimization.train import build_prompt_records
from text2grad.core.cli import EXIT_OK, exit_process, run_cli
from text2grad.core.config import ConfigError, save_config
from text2grad.core.critics import build_critic
from text2grad.core.data import DataError
from text2grad.core.modeling import end_distributed, load_causal_lm, load_tokenizer
from text2grad.core.placement import check_process_gpus
from text2grad.core.reward_options import Boundary, Occurrence, Overlap, RewardScheme
from text2grad.core.rewards import compute_score_rewards, span_sequence_score
from text2grad.core.feedback import Feedback

__all__ = ["Text2GradGRPOTrainer", "token_advantages", "main"]

logger = logging.getLogger("policy_optimization.grpo")


def token_advantages(sequence_advantages: torch.Tensor, span_rewards: torch.Tensor, mask: torch.Tensor, span_coef: float) -> torch.Tensor:
    """(B,) group advantages + span_coef * (B, T) span rewards -> (B, T) advantages, 0 on padding."""
    return (sequence_advantages.unsqueeze(1) + span_coef * span_rewards) * mask


class Text2GradGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose advantages are (B, T): the group-relative sequence advantage plus span rewards.

    Extra keyword arguments (all others go to `GRPOTrainer`):
        critic: a `FeedbackSource`; it sees the prompt and the decoded completion.
        span_coef: weight of the span rewards in the token advantages.
        reward_scheme, boundary, overlap, occurrence: span-to-token rules (as in `PPOConfig`).
    """

    def __init__(
        self,
        *args: Any,
        critic,
        span_coef: float = 1.0,
        reward_scheme: RewardScheme = "uniform",
        boundary: Boundary = "any",
        overlap: Overlap = "poor",
        occurrence: Occurrence = "all",
        **kwargs: Any,
    ) -> None:
        if not callable(getattr(critic, "feedback", None)):
            raise TypeError("critic must have a feedback(prompts, responses) method")
        self.critic = critic
        self.span_coef = span_coef
        self.span_rules = dict(scheme=reward_scheme, boundary=boundary, overlap=overlap, occurrence=occurrence)
        self._feedback_cache: dict[tuple[str, str], Feedback] = {}
        if kwargs.get("reward_funcs") is None and (len(args) < 2 or args[1] is None):
            kwargs["reward_funcs"] = self.feedback_score
        super().__init__(*args, **kwargs)

    def _feedback_for(self, prompts: Sequence[Any], completions: Sequence[str]) -> list[Feedback]:
        """Feedback per (prompt, completion), asking the source only for pairs not seen in this batch."""
        texts = [p if isinstance(p, str) else str(p[-1]["content"]) for p in prompts]
        todo = [i for i, key in enumerate(zip(texts, completions)) if key not in self._feedback_cache]
        if todo:
            try:
                got = list(self.critic.feedback([texts[i] for i in todo], [completions[i] for i in todo]))
            except Exception as exc:  # a broken source costs zero reward, not the run
                got = [Feedback.failed(f"critic raised {type(exc).__name__}: {exc}")] * len(todo)
            if len(got) != len(todo):
                raise TypeError(f"the critic returned {len(got)} feedbacks for {len(todo)} completions")
            for i, fb in zip(todo, got):
                self._feedback_cache[(texts[i], completions[i])] = fb
        return [self._feedback_cache[key] for key in zip(texts, completions)]

    def feedback_score(self, prompts, completions, **kwargs) -> list[float]:
        """Default GRPO reward: the feedback's normalized quote balance."""
        completions = [c if isinstance(c, str) else str(c[-1]["content"]) for c in completions]
        return [span_sequence_score(fb) for fb in self._feedback_for(prompts, completions)]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._feedback_cache = {}
        output = super()._generate_and_score_completions(inputs)
        ids, mask = output["completion_ids"], output["completion_mask"]
        rows = [ids[b][mask[b].bool()].tolist() for b in range(ids.shape[0])]
        completions = self.processing_class.batch_decode(rows, skip_special_tokens=True)
        feedbacks = self._feedback_for([x["prompt"] for x in inputs], completions)
        spans = compute_score_rewards(feedbacks, rows, self.processing_class, mode="nl_gradient", length=ids.shape[1], **self.span_rules)
        output["advantages"] = token_advantages(output["advantages"], spans.rewards.to(ids.device), mask.float(), self.span_coef)
        stats = spans.stats()
        mode = "train" if self.model.training else "eval"
        share = stats["tokens/nonzero_reward"] / stats["tokens/total"] if stats["tokens/total"] else 0.0
        self._metrics[mode]["text2grad/nonzero_reward_share"].append(share)
        self._metrics[mode]["text2grad/feedback_error"].append(stats["samples/feedback_error"])
        return output


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _score_reward_func(score_fn) -> Any:
    """A TRL reward function (prompts, completions, **kw) -> floats from ``score_fn(prompts, responses)``."""

    def sequence_score(prompts, completions, **kwargs) -> list[float]:
        texts = [p if isinstance(p, str) else str(p[-1]["content"]) for p in prompts]
        outs = [c if isinstance(c, str) else str(c[-1]["content"]) for c in completions]
        return [float(x) for x in score_fn(texts, outs)]

    return sequence_score


def _setup(cfg: GRPORunConfig) -> tuple[Any, list[dict[str, Any]], Any, Any, Any]:
    """(tokenizer, prompt records, critic, sequence reward function or None, model), or a ConfigError / DataError
    naming what is wrong with the user's settings or data (exit 2 through the shared main)."""
    if not cfg.model_name_or_path:
        raise ConfigError("set --model_name_or_path (a hub id or a local model directory)")
    if not cfg.dataset_path:
        raise ConfigError("set --dataset_path (a .jsonl/.json file, a saved dataset or a hub id)")
    if cfg.scalar_source not in ("quote_count", "scalar_rm") and ":" not in cfg.scalar_source:
        raise ConfigError(f"scalar_source must be quote_count, scalar_rm or package.module:function, got {cfg.scalar_source!r}")
    try:
        tokenizer = load_tokenizer(cfg.tokenizer_name_or_path or cfg.model_name_or_path, padding_side="left")
        items = build_prompt_records(cfg, tokenizer)
        source = build_critic(cfg.critic, cfg.critic_kwargs, records=items)
        reward_funcs = None
        if cfg.scalar_source != "quote_count":
            spec = SCALAR_SOURCES.get(cfg.scalar_source) or cfg.scalar_source
            reward_funcs = _score_reward_func(build_score_fn(spec, cfg.scalar_source_kwargs, records=items))
        model = load_causal_lm(cfg.model_name_or_path, adapter=cfg.adapter, dtype=cfg.dtype, merge_adapter=True)
    except (ConfigError, DataError, FileNotFoundError):
        raise
    except (ValueError, TypeError, ImportError) as exc:  # a critic/score spec or its kwargs that do not fit
        raise ConfigError(str(exc)) from None
    return tokenizer, items, source, reward_funcs, model


def train_grpo(cfg: GRPORunConfig) -> int:
    if cfg.use_vllm and cfg.vllm_mode == "colocate" and not torch.cuda.is_available():
        # TRL's colocate weight sync writes through vLLM's per-parameter weight loaders, which vLLM's CPU build has
        # replaced by its CPU-kernel copies (policy_optimization/README.md, "The paper's baselines and ablations")
        raise ConfigError("use_vllm with vllm_mode colocate needs a GPU: on CPU, TRL's weight sync into vLLM fails "
                         "(vLLM's CPU kernels keep no weight loaders). Drop --use_vllm on CPU, or use PPO's "
                         "--generation_backend vllm, which reloads weights the way vLLM's CPU build supports")
    check_process_gpus()  # more processes than GPUs: exit 2 before any model loads
    tokenizer, items, source, reward_funcs, model = _setup(cfg)
    peft_config = None
    if cfg.use_lora:
        targets = cfg.lora_target_modules
        peft_config = LoraConfig(
            task_type="CAUSAL_LM", r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=targets[0] if targets == ["all-linear"] else targets,
        )
    deepspeed_on_cpu = (os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
                        and os.environ.get("DS_ACCELERATOR") == "cpu" and not torch.cuda.is_available())
    if deepspeed_on_cpu:  # accelerate + DeepSpeed on CPU processes (how CI tests the ZeRO path): gloo
        _allow_deepspeed_on_cpu()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        # The launcher's accelerate config carries its own gradient_accumulation_steps (1 in configs/accelerate);
        # DeepSpeed refuses to start when it differs from the trainer's, so this run's own value is the one it gets.
        os.environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(cfg.gradient_accumulation_steps)
    args = GRPOConfig(
        output_dir=cfg.output_dir, use_cpu=not torch.cuda.is_available() and not deepspeed_on_cpu, seed=cfg.seed,
        per_device_train_batch_size=cfg.per_device_train_batch_size, num_generations=cfg.num_generations,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature, top_p=cfg.top_p, learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type, max_steps=cfg.max_steps, num_train_epochs=cfg.num_train_epochs,
        beta=cfg.beta, epsilon=cfg.epsilon, bf16=cfg.bf16, use_vllm=cfg.use_vllm, vllm_mode=cfg.vllm_mode,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, save_steps=cfg.save_steps,
        logging_steps=cfg.logging_steps, report_to=[r for r in cfg.report_to.split(",") if r and r != "none"] or "none",
    )
    trainer = Text2GradGRPOTrainer(
        model, reward_funcs=reward_funcs, args=args, train_dataset=Dataset.from_list([{"prompt": it["prompt"]} for it in items]),
        processing_class=tokenizer, peft_config=peft_config, critic=source, span_coef=cfg.span_coef,
        reward_scheme=cfg.reward_scheme, boundary=cfg.boundary, overlap=cfg.overlap, occurrence=cfg.occurrence,
    )
    try:
        trainer.train()
    finally:
        close = getattr(source, "close", None)
        if callable(close):
            close()
    trainer.save_model(cfg.output_dir)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(cfg.output_dir)
        save_config(cfg, Path(cfg.output_dir) / "grpo_config.yaml")
        with (Path(cfg.output_dir) / "metrics.jsonl").open("w") as fh:
            for row in trainer.state.log_history:
                fh.write(json.dumps(row) + "\n")
        logger.info("done: %d steps; policy saved to %s", trainer.state.global_step, cfg.output_dir)
    end_distributed()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(GRPORunConfig, train_grpo, argv)


if __name__ == "__main__":
    exit_process(main())
