"""`NLGradientPPOTrainer`: token-level PPO whose rewards come from natural-language feedback.

One iteration (`NLGradientPPOTrainer.step`), top to bottom:

1. take this process's share (``batch_size`` / processes) of the next ``batch_size`` prompts of a seeded order;
2. sample one response per prompt (left-padded prompts, KV cache, exact sampled ids, cut at the first EOS);
3. ask the feedback source for a `Feedback` on each (prompt, response); optional task score function;
4. turn feedback into per-token score rewards on the sampled ids (`text2grad.core.rewards`, per mode);
5. one no-grad pass: log-probs and entropy of the policy, values, log-probs of the reference policy;
6. rewards = score rewards - kl_coef * KL_t (k1 or k3), optional whitening; GAE advantages and returns;
7. ``num_ppo_epochs`` passes of shuffled minibatch updates: clipped policy loss + vf_coef * clipped value
   loss - entropy_coef * entropy, with gradient accumulation over micro-batches;
8. adaptive KL coefficient, metrics (metrics.jsonl, optional TensorBoard/W&B), checkpoint every
   ``save_steps``; with ``rm_refresh_every``, the reward model is re-taught on annotated rollouts of this
   iteration (`policy_optimization.rm_refresh`).

An ensemble critic's members are aggregated per token in step 4 (`text2grad.core.ensemble`).

The math is the shared core's (`text2grad.core.ppo_math`, `text2grad.core.rewards`); the trainer only moves tensors between those pure
functions. It runs through `accelerate`, so the same code serves one CPU, one GPU, DDP, and DeepSpeed
ZeRO-2/3 (policy and value model are one prepared module; under ZeRO-3 the policy's parameters are
gathered for generation).
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from accelerate.utils import broadcast_object_list, set_seed
from tqdm.auto import tqdm
from transformers import get_scheduler

from policy_optimization.checkpoints import (
    CONFIG_FILE,
    STATE_FILE,
    TrainerState,
    find_latest_checkpoint,
    open_ppo_run,
    read_trainer_state,
    write_checkpoint_files,
)
from policy_optimization.ppo_config import PPOConfig
from policy_optimization.distributed import (
    any_process,
    batch_explained_variance,
    batch_whiten,
    check_shared_directory,
    is_peft,
    make_accelerator,
    mean_over_processes,
    policy_for_generation,
    policy_for_saving,
    prepare_reference,
    save_policy_and_value,
    wrap_lora,
)
from policy_optimization.models import PolicyAndValue, ValueHead, ValueModel, disable_dropout
from policy_optimization.rm_refresh import RewardModelRefresh, build_rm_refresh
from policy_optimization.vllm_rollouts import start_vllm_rollouts
from policy_optimization.rollout import (
    SUM_KEYS,
    Rollout,
    batch_stats,
    chunks,
    collect_feedback,
    collect_scores,
    derived_rates,
    feedback_errors,
    feedback_failure_message,
    pack_rollout,
    sample_records,
)
from text2grad.core import run_dir
from text2grad.core.config import config_to_dict, save_config
from text2grad.core.generation import Generation, generate
from text2grad.core.placement import misplaced
from text2grad.core.ensemble import ensemble_score_rewards
from text2grad.core.rewards import ScoreRewards
from text2grad.core.ppo_math import (
    adaptive_kl_coef,
    kl_controller_steps,
    entropy_from_logits,
    gae,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    policy_loss,
    value_loss,
)

__all__ = ["NLGradientPPOTrainer", "NonFiniteError", "FeedbackFailureError", "TrainerState", "find_latest_checkpoint"]

logger = logging.getLogger(__name__)

class NonFiniteError(RuntimeError):
    """NaN or inf in rewards, values, advantages or the loss; ``checkpoint-<step>-nonfinite`` was saved before raising."""


class FeedbackFailureError(RuntimeError):
    """More than ``max_feedback_error_rate`` of an iteration's samples got no feedback; nothing was trained on it."""


class NLGradientPPOTrainer:
    """Token-level PPO with a feedback source (Text2Grad Algorithm 4).

    Args:
        config: a `PPOConfig`.
        tokenizer: the policy's fast tokenizer (needs a pad token).
        policy: a causal LM. With ``config.use_lora`` it is wrapped in a LoRA adapter unless it already is a
            ``PeftModel``.
        ref_policy: a separate frozen reference model, or None: then the reference is the policy with its
            adapter disabled (LoRA) or a frozen copy of the initial policy (full fine-tuning).
        value_model: a `ValueModel` (separate backbone + scalar head), or None for ``value_model: shared_backbone``
            (the trainer puts a `ValueHead` on the policy's last hidden state). With ``value_model: auto`` a given
            ValueModel is trained (separate) and None means shared_backbone.
        critic: anything with ``feedback(prompts, responses) -> list[Feedback]``.
        train_dataset: records with ``"prompt"`` (the policy prompt, template already applied) and optionally
            ``"feedback_prompt"`` (what the critic sees; default: ``"prompt"``).
        score_fn: task score ``fn(prompts, responses) -> list[float]`` for the sequence score of the
            scalar/score_spread/mixed modes (`SEQUENCE_SCORE_MODES`; never called in the other modes). Default:
            the score from the feedback's quotes. It gets the feedback prompts.
        base_model_path: written as the base of the saved LoRA adapter (default: ``config.model_name_or_path``).
        rm_refresh: the on-policy reward-model refresh (`policy_optimization.rm_refresh`); default: the one the
            config's ``rm_refresh_*`` options ask for, if any.
    """

    def __init__(
        self,
        config: PPOConfig,
        tokenizer,
        policy: torch.nn.Module,
        ref_policy: torch.nn.Module | None,
        value_model: ValueModel | None,
        critic,
        train_dataset: Sequence[Mapping[str, Any]],
        *,
        score_fn: Callable[[Sequence[str], Sequence[str]], Sequence[float]] | None = None,
        base_model_path: str | None = None,
        rm_refresh: RewardModelRefresh | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.critic = critic
        self.score_fn = score_fn
        self.base_model_path = base_model_path or config.model_name_or_path or None
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to the EOS token)")
        if not callable(getattr(critic, "feedback", None)):
            raise TypeError("critic must have a feedback(prompts, responses) method")
        self.dataset = [dict(r) for r in train_dataset]
        if not self.dataset:
            raise ValueError("train_dataset is empty")
        missing = [i for i, r in enumerate(self.dataset) if not isinstance(r.get("prompt"), str)]
        if missing:
            raise ValueError(f"train_dataset records {missing[:5]} have no string 'prompt' field")

        self.accelerator = make_accelerator(config)
        acc = self.accelerator
        self.num_iterations = config.iterations()
        self.batch = config.process_batch(acc.num_processes)  # this process's share of the global batch_size
        set_seed(config.seed)  # the same LoRA initialisation on every process

        if config.use_lora and not is_peft(policy):
            policy = wrap_lora(policy, config)
        self.is_peft = is_peft(policy)
        if ref_policy is None and not self.is_peft:
            logger.warning("no reference policy and no LoRA: keeping a frozen copy of the initial policy in memory")
            ref_policy = copy.deepcopy(policy)
        # auto with a ValueModel given: the caller built a separate value model, so it is trained
        self.value_design = "separate" if config.value_model == "auto" and value_model is not None else config.value_design
        if self.value_design == "shared_backbone":
            if value_model is not None:
                raise ValueError("value_model is shared_backbone (the default for LoRA runs): pass value_model=None, "
                                 "or set value_model: separate to train the given ValueModel")
            value_model = ValueHead(policy.config.hidden_size)
        elif value_model is None:
            raise ValueError("value_model: separate needs a ValueModel (or set value_model: shared_backbone)")
        for model in (policy, value_model) + ((ref_policy,) if ref_policy is not None else ()):
            disable_dropout(model)
        if config.gradient_checkpointing:
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if isinstance(value_model, ValueModel):
                value_model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if self.is_peft:
                policy.enable_input_require_grads()

        wrapper = PolicyAndValue(policy, value_model)
        policy_params = [p for p in policy.parameters() if p.requires_grad]
        value_params = [p for p in value_model.parameters() if p.requires_grad]
        if not policy_params:
            raise ValueError("the policy has no trainable parameters")
        optimizer = torch.optim.AdamW(
            [
                {"params": policy_params, "lr": config.learning_rate},
                {"params": value_params, "lr": config.value_learning_rate or config.learning_rate},
            ],
            weight_decay=config.weight_decay,
        )

        total_updates = self.num_iterations * config.num_ppo_epochs * config.num_mini_batches
        scheduler = get_scheduler(config.lr_scheduler_type, optimizer, config.warmup_steps, total_updates)

        self.zero_stage = 0
        ds_plugin = acc.state.deepspeed_plugin
        if ds_plugin is not None:
            ds = ds_plugin.deepspeed_config
            ds["train_micro_batch_size_per_gpu"] = self.batch.micro_batch
            ds["gradient_accumulation_steps"] = config.gradient_accumulation_steps
            ds["train_batch_size"] = self.batch.micro_batch * config.gradient_accumulation_steps * acc.num_processes
            ds["gradient_clipping"] = config.max_grad_norm
            self.zero_stage = int(ds_plugin.zero_stage or 0)
        self.model, self.optimizer, self.scheduler = acc.prepare(wrapper, optimizer, scheduler)
        self.ref_model = prepare_reference(ref_policy, acc, self.zero_stage) if ref_policy is not None else None
        elsewhere = misplaced(acc.device, {"the critic": getattr(critic, "device", None),
                                           "the scalar_source": getattr(score_fn, "device", None)})
        if elsewhere:
            logger.warning(
                "process %d trains on %s but %s: leave device out of critic_kwargs / scalar_source_kwargs so that "
                "each process loads its reward model onto its own GPU", acc.process_index, acc.device, ", ".join(elsewhere),
            )

        set_seed(config.seed + acc.process_index)  # different samples on each process
        self.state = TrainerState(kl_coef=config.kl_coef)
        self.output_dir = Path(config.output_dir)
        self._permutations: dict[int, np.ndarray] = {}
        self._stop_requested = False
        self._trackers = False
        self._saved_step = -1
        self.vllm_rollouts = None
        if config.generation_backend == "vllm":  # a LoRA policy's adapter rank: the engine serves or merges it
            rank = next(iter(self.policy.peft_config.values())).r if self.is_peft else None
            self.vllm_rollouts = start_vllm_rollouts(config, self.tokenizer, self.zero_stage,
                                                     self.base_model_path or config.model_name_or_path, rank)
        seen_by_critic = [{**r, "prompt": r.get("feedback_prompt", r["prompt"])} for r in self.dataset]
        self.rm_refresh = rm_refresh or build_rm_refresh(config, critic, seen_by_critic)

    # ---------------------------------------------------------------------------------------------
    # The training loop
    # ---------------------------------------------------------------------------------------------

    @property
    def policy(self) -> torch.nn.Module:
        """The (unwrapped) policy being trained."""
        return self.accelerator.unwrap_model(self.model).policy

    @property
    def value_model(self) -> ValueModel | ValueHead:
        return self.accelerator.unwrap_model(self.model).value_model

    def train(self) -> dict[str, float]:
        """Run (or resume) until ``num_iterations``; returns the last iteration's metrics.

        Checkpoints every ``save_steps`` and at the end; the final policy, value model and tokenizer go to
        ``output_dir/policy`` and ``output_dir/value_model``. Ctrl-C or SIGTERM finish the current iteration,
        save a checkpoint and return (a second Ctrl-C stops at once).
        """
        self.start_run()
        acc = self.accelerator
        metrics: dict[str, float] = {}
        bar = tqdm(
            total=self.num_iterations, initial=self.state.step, desc="ppo", unit="it",
            disable=not (acc.is_main_process and self.config.progress_bar),
        )
        with run_dir.graceful_stop(self._request_stop):
            while self.state.step < self.num_iterations:
                metrics = self.step()
                bar.update(1)
                bar.set_postfix(score=f"{metrics['reward/score_mean']:.3f}", kl=f"{metrics['objective/kl']:.2f}")
                stop = any_process(acc, self._stop_requested)
                if stop or (self.config.save_steps and self.state.step % self.config.save_steps == 0):
                    self.save_checkpoint()
                if stop:
                    logger.warning("stop requested: saved checkpoint at iteration %d", self.state.step)
                    break
        bar.close()
        if self.state.step >= self.num_iterations:
            if self._saved_step != self.state.step:  # not the filesystem: another process may be writing it now
                self.save_checkpoint()
            self.save_model(self.output_dir)
        if self._trackers:
            acc.end_training()
        if self.vllm_rollouts is not None:
            self.vllm_rollouts.close()
        return metrics

    def step(self) -> dict[str, float]:
        """One PPO iteration; returns its metrics (also appended to ``output_dir/metrics.jsonl``)."""
        cfg, acc = self.config, self.accelerator
        t_start = time.perf_counter()

        # 1-2. prompts and responses
        items = self._next_items()
        prompts = [r["prompt"] for r in items]
        feedback_prompts = [r.get("feedback_prompt", r["prompt"]) for r in items]
        generations = self._generate(prompts)
        responses = [g.text for g in generations]
        t_generated = time.perf_counter()

        # 3. feedback (and the optional task score)
        feedbacks, n_source_errors = collect_feedback(self.critic, feedback_prompts, responses)
        scores, n_score_errors = collect_scores(self.score_fn, cfg.reward_mode, feedback_prompts, responses)
        self._check_feedback_errors(feedback_errors(feedbacks, responses), n_score_errors, len(responses))
        t_feedback = time.perf_counter()

        # 4. token-level score rewards on the exact sampled ids
        rollout = pack_rollout(generations, self.tokenizer.pad_token_id, acc.device)
        T = rollout.response_length
        score = ensemble_score_rewards(  # = compute_score_rewards for one critic; an ensemble's members aggregated
            feedbacks, [g.response_ids for g in generations], self.tokenizer, aggregation=cfg.ensemble_aggregation,
            min_votes=cfg.ensemble_min_votes, std_coef=cfg.ensemble_std_coef, mode=cfg.reward_mode, length=T, scores=scores, finished=[g.finished for g in generations],
            scheme=cfg.reward_scheme, span_normalize=cfg.span_normalize, boundary=cfg.boundary,
            overlap=cfg.overlap, occurrence=cfg.occurrence, scalar_coef=cfg.scalar_coef,
            missing_eos_penalty=cfg.missing_eos_penalty, weighting=cfg.reward_weighting,
        )
        mask = score.mask.to(acc.device)
        score_rewards = score.rewards.to(acc.device)
        t_rewards = time.perf_counter()

        # 5. log-probs, values and reference log-probs of the sampled tokens
        logprobs, values, entropy, ref_logprobs = self._rollout_forward(rollout)

        # 6. KL-penalised rewards, GAE
        kl = torch.where(mask > 0, kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator), 0.0)
        rewards = score_rewards - self.state.kl_coef * kl
        if cfg.whiten_rewards:
            rewards = batch_whiten(acc, rewards, mask, cfg.whiten_scope, shift_mean=False)
        advantages, returns = gae(rewards, values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            advantages = batch_whiten(acc, advantages, mask, cfg.whiten_scope)
        self._guard_finite(
            {"score rewards": score_rewards, "KL": kl, "values": values, "advantages": advantages, "returns": returns},
            mask, during_update=False,
        )
        t_forward = time.perf_counter()

        # 7. PPO epochs over shuffled minibatches
        lr = float(self.scheduler.get_last_lr()[0])  # the policy learning rate this iteration starts with
        update_stats = self._ppo_update(rollout, mask, logprobs, values, advantages, returns)
        t_update = time.perf_counter()

        # 8. KL controller, bookkeeping, metrics
        stats = batch_stats(score, rewards, kl, entropy, mask, generations, n_source_errors, n_score_errors)
        stats = mean_over_processes(acc, stats, sums=SUM_KEYS)
        stats["value/explained_variance"] = batch_explained_variance(acc, values, returns, mask, cfg.whiten_scope)
        global_batch = cfg.batch_size
        kl_used = self.state.kl_coef
        if cfg.adaptive_kl:
            steps = kl_controller_steps(cfg.kl_horizon_unit, global_batch)
            self.state.kl_coef = adaptive_kl_coef(kl_used, stats["objective/kl"], cfg.target_kl, steps, cfg.kl_horizon)
        self.state.step += 1
        self.state.episodes += global_batch
        metrics = {
            "iteration": self.state.step,
            "episodes": self.state.episodes,
            **derived_rates(stats),
            **update_stats,
            "objective/kl_coef": kl_used,
            "lr": lr,
            **(self.vllm_rollouts.metrics(generations, logprobs, self.accelerator) if self.vllm_rollouts else {}),
            "time/generation": t_generated - t_start,
            "time/feedback": t_feedback - t_generated,
            "time/rewards": t_rewards - t_feedback,
            "time/forward": t_forward - t_rewards,
            "time/update": t_update - t_forward,
            "time/total": time.perf_counter() - t_start,
        }
        if self.rm_refresh is not None:  # every rm_refresh_every iterations: the reward model learns these rollouts
            metrics.update(self.rm_refresh.after_iteration(self.state.step, feedback_prompts, responses, feedbacks,
                                                           acc, self.output_dir))
        self._log(metrics, prompts, feedback_prompts, generations, feedbacks, score)
        return metrics

    # ---------------------------------------------------------------------------------------------
    # Steps of an iteration
    # ---------------------------------------------------------------------------------------------

    def _next_items(self) -> list[dict[str, Any]]:
        """This process's share of the next global batch of ``batch_size`` records; every epoch is a new seeded
        shuffle. Process k takes the k-th slice, so the batch is the same at any number of processes."""
        cfg, acc = self.config, self.accelerator
        n, need, share = len(self.dataset), cfg.batch_size, self.batch.rollouts
        picked: list[int] = []
        while len(picked) < need:
            if self.state.data_pos >= n:
                self.state.data_epoch, self.state.data_pos = self.state.data_epoch + 1, 0
            perm = self._permutation(self.state.data_epoch)
            take = min(need - len(picked), n - self.state.data_pos)
            picked.extend(int(i) for i in perm[self.state.data_pos : self.state.data_pos + take])
            self.state.data_pos += take
        mine = picked[acc.process_index * share : (acc.process_index + 1) * share]
        return [self.dataset[i] for i in mine]

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            self._permutations = {epoch: np.random.default_rng([self.config.seed, epoch]).permutation(len(self.dataset))}
        return self._permutations[epoch]

    @property
    def _prompt_special_tokens(self) -> bool | None:
        """The special tokens rule (text2grad.core.generation): prompts that went through the chat template
        already hold BOS, so they are tokenized without special tokens; otherwise the rule decides per prompt."""
        templated = self.config.use_chat_template and getattr(self.tokenizer, "chat_template", None)
        return False if templated else None

    def _generate(self, prompts: list[str]) -> list[Generation]:
        cfg = self.config
        self.model.eval()
        if self.vllm_rollouts is not None:  # this process's engine gets the policy as it is now: on-policy rollouts
            adapter_only = self.vllm_rollouts.refreshes_adapter_only
            with policy_for_saving(self.model, self.accelerator, self.zero_stage, adapter_only=adapter_only) as policy:
                self.vllm_rollouts.refresh(policy)
            return self.vllm_rollouts.sample(prompts, self._prompt_special_tokens)
        gather = cfg.ds3_gather_for_generation
        with policy_for_generation(self.model, self.accelerator, self.zero_stage, gather=gather) as policy:
            return generate(
                policy, self.tokenizer, prompts,
                max_new_tokens=cfg.response_length, batch_size=cfg.generation_batch_size or len(prompts),
                do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                max_prompt_length=cfg.max_prompt_length, stop_strings=cfg.stop_strings,
                add_special_tokens=self._prompt_special_tokens,
                synced_gpus=self.zero_stage == 3 and not gather and self.accelerator.num_processes > 1,
            )

    @torch.no_grad()
    def _rollout_forward(self, rollout: Rollout) -> tuple[torch.Tensor, ...]:
        """(logprobs, values, entropy, ref_logprobs), each (B, T), in micro-batches."""
        cfg = self.config
        T = rollout.response_length
        outs: list[tuple[torch.Tensor, ...]] = []
        self.model.eval()
        for rows in chunks(len(rollout.generations), self.batch.micro_batch):
            ids, attn, pos = rollout.input_ids[rows], rollout.attention_mask[rows], rollout.position_ids[rows]
            logits, values = self.model(ids, attn, pos, T)
            logits = logits.float() / cfg.temperature
            logprobs = logprobs_from_logits(logits, rollout.response_ids[rows])
            entropy = entropy_from_logits(logits)
            del logits
            ref_logits = self._reference_logits(ids, attn, pos, T).float() / cfg.temperature
            ref_logprobs = logprobs_from_logits(ref_logits, rollout.response_ids[rows])
            outs.append((logprobs, values.float(), entropy, ref_logprobs))
        return tuple(torch.cat(parts) for parts in zip(*outs))

    def _reference_logits(self, ids, attn, pos, T: int) -> torch.Tensor:
        kwargs = dict(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=T + 1)
        # The prepared policy runs under accelerate's autocast (mixed precision); the reference must too, or the
        # KL would measure the precision difference instead of the policy's drift.
        with self.accelerator.autocast():
            if self.ref_model is not None:
                return self.ref_model(**kwargs).logits[:, :-1]
            policy = self.accelerator.unwrap_model(self.model).policy
            with policy.disable_adapter():
                return policy(**kwargs).logits[:, :-1]

    def _ppo_update(self, rollout: Rollout, mask, old_logprobs, old_values, advantages, returns) -> dict[str, float]:
        cfg, acc = self.config, self.accelerator
        T = rollout.response_length
        self.model.train()
        totals: dict[str, float] = {}
        n_micro = 0
        for _ in range(cfg.num_ppo_epochs):
            batch = self.batch
            order = torch.randperm(batch.rollouts)
            for mb_start in range(0, batch.rollouts, batch.mini_batch):
                minibatch = order[mb_start : mb_start + batch.mini_batch]
                for micro_start in range(0, batch.mini_batch, batch.micro_batch):
                    rows = minibatch[micro_start : micro_start + batch.micro_batch].to(acc.device)
                    with acc.accumulate(self.model):
                        logits, vpred = self.model(rollout.input_ids[rows], rollout.attention_mask[rows], rollout.position_ids[rows], T)
                        logits = logits.float() / cfg.temperature
                        m = mask[rows]
                        logprobs = logprobs_from_logits(logits, rollout.response_ids[rows])
                        pg_loss, pg_stats = policy_loss(logprobs, old_logprobs[rows], advantages[rows], m, cfg.cliprange)
                        vf_loss, vf_stats = value_loss(vpred.float(), old_values[rows], returns[rows], m, cfg.cliprange_value)
                        entropy = masked_mean(entropy_from_logits(logits), m)
                        loss = pg_loss + cfg.vf_coef * vf_loss - cfg.entropy_coef * entropy
                        self._guard_finite({"loss": loss.detach().reshape(1)}, None, during_update=True)
                        acc.backward(loss)
                        if acc.sync_gradients and cfg.max_grad_norm > 0:
                            acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                        self.optimizer.step()
                        if acc.sync_gradients:
                            self.scheduler.step()
                        self.optimizer.zero_grad()
                    step_stats = {
                        "loss/policy": pg_loss.item(), "loss/value": vf_loss.item(), "loss/total": loss.item(),
                        "policy/entropy": entropy.item(), "policy/clipfrac": pg_stats["clipfrac"].item(),
                        "policy/approx_kl": pg_stats["approx_kl"].item(), "value/clipfrac": vf_stats["vf_clipfrac"].item(),
                    }
                    for k, v in step_stats.items():
                        totals[k] = totals.get(k, 0.0) + v
                    n_micro += 1
        return mean_over_processes(self.accelerator, {k: v / n_micro for k, v in totals.items()})

    # ---------------------------------------------------------------------------------------------
    # Guards, metrics, logging
    # ---------------------------------------------------------------------------------------------

    def _guard_finite(self, tensors: Mapping[str, torch.Tensor], mask: torch.Tensor | None, during_update: bool) -> None:
        """Stop with a checkpoint and a clear message if any tensor holds NaN/inf (on any process)."""
        bad_names = []
        for name, t in tensors.items():
            bad = ~torch.isfinite(t)
            if mask is not None:
                bad = bad & (mask > 0)
            if bool(bad.any()):
                rows = sorted({int(r) for r in bad.nonzero()[:, 0].tolist()}) if t.dim() > 1 else []
                bad_names.append(f"{name}" + (f" (rows {rows[:8]})" if rows else ""))
        if not any_process(self.accelerator, bool(bad_names)):
            return
        # Never "checkpoint-<step>": that is the clean checkpoint saved after iteration <step>, and this state has
        # already consumed the next batch, so overwriting it would make --resume auto skip that batch. The
        # suffix keeps this directory out of find_latest_checkpoint and out of checkpoint rotation.
        path = self.save_checkpoint(name=f"checkpoint-{self.state.step}-nonfinite", rotate=False)
        clean = find_latest_checkpoint(self.output_dir)
        where = "during the PPO update (weights may be partly updated)" if during_update else "before this iteration's update"
        raise NonFiniteError(
            f"non-finite values at iteration {self.state.step + 1} on process {self.accelerator.process_index}: "
            f"{', '.join(bad_names) or 'on another process'}. State {where} saved for inspection to {path}; "
            f"--resume auto ignores it and continues from {clean or 'the start (no clean checkpoint yet)'}. Likely "
            "causes: a feedback source or scalar_source returning inf/NaN scores, or a learning rate too high for "
            "this model; fix it and rerun with --resume auto."
        )

    def _check_feedback_errors(self, errors: list[str], n_score_errors: int, n_samples: int) -> None:
        """Warn on every iteration with feedback errors; stop before the update when their share (over all
        processes) exceeds ``max_feedback_error_rate``: training on zero rewards would only follow the KL term."""
        counts = mean_over_processes(self.accelerator, {"errors": float(len(errors) + n_score_errors), "samples": float(n_samples)},
                                   sums=frozenset({"errors", "samples"}))
        if counts["errors"] == 0:
            return
        rate, iteration = counts["errors"] / counts["samples"], self.state.step + 1
        cause = errors[0] if errors else "the score function failed"
        if self.accelerator.is_main_process:
            logger.warning("iteration %d: %d of %d samples got no feedback (%.0f%%); first cause: %s",
                           iteration, counts["errors"], counts["samples"], 100 * rate, cause)
        if rate > self.config.max_feedback_error_rate:
            raise FeedbackFailureError(feedback_failure_message(
                iteration, int(counts["errors"]), int(counts["samples"]), self.config.max_feedback_error_rate, cause,
                find_latest_checkpoint(self.output_dir),
            ))

    def _log(self, metrics, prompts, feedback_prompts, generations, feedbacks, score: ScoreRewards) -> None:
        if self._trackers:
            self.accelerator.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=self.state.step)
        if not self.accelerator.is_main_process:
            return
        run_dir.append_jsonl(self.output_dir / run_dir.METRICS_FILE, metrics)
        for record in sample_records(self.state.step, self.config.log_samples, self.tokenizer, prompts, feedback_prompts,
                                     generations, feedbacks, score):
            run_dir.append_jsonl(self.output_dir / "samples.jsonl", record)

    # ---------------------------------------------------------------------------------------------
    # Checkpoints and saving
    # ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, name: str | None = None, rotate: bool = True) -> Path:
        """Save weights, optimizer, scheduler, per-process RNG states, trainer state and config.

        Must be called on every process (DeepSpeed saves its shards collectively).
        """
        acc = self.accelerator
        path = self.output_dir / (name or f"checkpoint-{self.state.step}")
        acc.save_state(str(path))
        if acc.is_main_process:
            write_checkpoint_files(path, self.state, self.config, acc.num_processes)
            if rotate and self.config.save_total_limit:
                run_dir.rotate_checkpoints(self.output_dir, self.config.save_total_limit)
        acc.wait_for_everyone()
        if name is None:
            self._saved_step = self.state.step
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint written by `save_checkpoint` (weights, optimizer, scheduler, RNG, state)."""
        path = Path(path)
        if not (path / STATE_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a checkpoint of this trainer (no {STATE_FILE})")
        self.accelerator.load_state(str(path))
        self.state = read_trainer_state(path, self.accelerator.num_processes)
        self._saved_step = self.state.step

    def save_model(self, output_dir: str | Path) -> None:
        """Write ``policy/`` (LoRA adapter, or full model) with the tokenizer, and ``value_model/``.

        ``text2grad.core.modeling.load_causal_lm(output_dir/"policy")`` loads the policy (for an adapter, its
        ``base_model_name_or_path`` names the base). Must be called on every process (ZeRO-3 gathers weights).
        """
        save_policy_and_value(self.accelerator, self.model, self.tokenizer, Path(output_dir),
                              self.base_model_path if self.is_peft else None)

    # ---------------------------------------------------------------------------------------------
    # Run setup
    # ---------------------------------------------------------------------------------------------

    def start_run(self) -> None:
        """Resume (checking the saved config) or start fresh (refusing to mix with an earlier run), and start
        trackers; the output-directory rules are `text2grad.core.run_dir`'s. `train` calls it; a caller that steps
        the trainer itself (evaluating between iterations, as benchmarks/method_study.py does) calls it first."""
        cfg, acc = self.config, self.accelerator
        if self.state.step == 0:  # (a trainer stepped by hand before train() keeps its state)
            # The main process alone applies the output-directory rules (it may cut logs or remove an earlier
            # run) and the others take its decision, rather than each reading a directory that is being changed.
            decision = [str(open_ppo_run(cfg) or "") if acc.is_main_process else ""]
            if acc.num_processes > 1:
                broadcast_object_list(decision, from_process=0)
            resume_from = Path(decision[0]) if decision[0] else None
            check_shared_directory(acc, self.output_dir)
            if resume_from is not None:
                self.load_checkpoint(resume_from)
                logger.info("resumed from %s at iteration %d", resume_from, self.state.step)
            if self.rm_refresh is not None:  # the refreshed reward model as it was at that checkpoint
                acc.wait_for_everyone()
                self.rm_refresh.restore(self.output_dir, self.state.step, acc.is_main_process)
        acc.wait_for_everyone()
        if acc.is_main_process:
            save_config(cfg, self.output_dir / CONFIG_FILE)
        if cfg.report_to != "none" and not self._trackers:
            flat = {k: v for k, v in config_to_dict(cfg).items() if isinstance(v, (int, float, str, bool))}
            acc.init_trackers(cfg.run_name or "text2grad-ppo", config=flat)
            self._trackers = True

    def _request_stop(self) -> bool:
        """Ask the loop to stop after this iteration; returns whether a stop had already been asked for."""
        already, self._stop_requested = self._stop_requested, True
        return already
