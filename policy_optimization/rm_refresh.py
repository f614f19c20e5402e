"""On-policy reward-model refresh (iterated RLHF): the learned critic is re-taught on what the policy writes now.

A reward model trained on offline annotations is only right near the responses it saw; PPO moves the policy
away from them and then exploits the model's mistakes there (Gao et al. 2022, "Scaling Laws for Reward Model
Overoptimization"). Iterated RLHF closes the loop: every few iterations the annotating critic labels a
sample of the current rollouts and the reward model is fine-tuned on them (Ouyang et al. 2022 collected
comparisons on the current policy's outputs between rounds; Bai et al. 2022, "iterated online RLHF").

With ``rm_refresh_every N`` (`PPOConfig`), after every N-th iteration:

1. the iteration's (prompt, response) pairs of all processes are gathered and ``rm_refresh_samples`` of them are
   picked with a seeded generator (the same pick on every process);
2. the main process asks the annotating critic (``rm_refresh_critic`` + ``rm_refresh_critic_kwargs``, any critic
   of the registry: an LLM, unit tests, a fact checker) for feedback on them and shares the annotations;
   ``rm_refresh/agreement_*`` logs how well the reward model's own feedback on those same rollouts (the
   feedback PPO just trained on) agreed with the annotator's, before the refresh;
3. the main process fine-tunes the reward model (its LoRA adapter, every member's adapter of an ensemble, every
   member of an ensemble of separate models, or all weights of a model without LoRA) for ``rm_refresh_steps``
   steps on the new annotations plus ``rm_refresh_replay_ratio`` times as many replayed earlier ones
   (``rm_refresh_replay`` files and every earlier refresh's annotations), each step in pieces of
   ``rm_refresh_micro_batch_size`` records (`fine_tune`), then sends the new weights to every process;
   a reward model that writes its critiques through vLLM (``backend: vllm``) is trained as a transformers copy of its
   LoRA adapter, and the engine serves the refreshed adapter from then on (`attach_training_copy`);
4. ``<output_dir>/rm_refresh/step-<N>/`` receives the annotations (``annotations.jsonl``, reward-model training
   records) and the refreshed weights; a resumed run reloads the newest refresh at or before its checkpoint.

Counts for comparisons at equal annotation budgets: ``rm_refresh/annotations`` (this iteration),
``rm_refresh/annotations_total`` (the run so far) and ``rm_refresh/replay_pool`` (offline + earlier records).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from accelerate.utils import broadcast_object_list, gather_object
from peft import PeftModel
from safetensors.torch import load_file, save_file

from reward_model.ensemble import RewardModelEnsemble
from reward_model.inference import GenerativeRewardModel
from reward_model.metrics import evaluate_feedback
from reward_model.serialization import IGNORE_INDEX, collate, encode_example, record_feedback
from text2grad.core.critics import build_critic
from text2grad.core.data import load_records
from text2grad.core.ensemble import EnsembleCritic
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import load_causal_lm
from text2grad.core.placement import resolve_device

__all__ = ["REFRESH_DIR", "RewardModelRefresh", "agreement", "attach_training_copy", "build_rm_refresh", "fine_tune",
           "pick_rollouts", "reward_models", "summed_target_loss", "target_tokens"]

logger = logging.getLogger(__name__)

REFRESH_DIR = "rm_refresh"
WEIGHTS_FILE = "refreshed.safetensors"
ANNOTATIONS_FILE = "annotations.jsonl"


# --------------------------------------------------------------------------------------------------
# Small pieces
# --------------------------------------------------------------------------------------------------


def pick_rollouts(responses: Sequence[str], n: int | None, seed: int, step: int) -> list[int]:
    """Indices of up to ``n`` non-empty responses (all when ``n`` is None), drawn with a generator seeded by
    (seed, step), sorted: the same pick on every process."""
    candidates = [i for i, r in enumerate(responses) if r.strip()]
    if n is None or n >= len(candidates):
        return candidates
    return sorted(random.Random(f"{seed}-{step}").sample(candidates, n))


def agreement(predicted: Sequence[Feedback], reference: Sequence[Feedback], responses: Sequence[str], tokenizer) -> dict[str, float]:
    """Token-label agreement of ``predicted`` (the reward model) with ``reference`` (the annotator) on the same
    responses (`reward_model.metrics.evaluate_feedback`): F1 of the good and poor labels and label accuracy."""
    if not responses:
        return {}
    metrics, _ = evaluate_feedback(predicted, reference, responses, tokenizer)
    return {"agreement_f1_good": metrics.tokens["positive"].f1, "agreement_f1_poor": metrics.tokens["negative"].f1,
            "agreement_accuracy": metrics.label_accuracy}


def attach_training_copy(rm: GenerativeRewardModel) -> None:
    """Give a reward model that generates through vLLM a transformers copy to train (``rm.model``, on this process's
    device): an engine generates but cannot be trained, so a refresh fine-tunes the copy's LoRA adapter and then
    serves it on the engine (`RewardModelRefresh`); the critiques keep coming from the engine. No-op when ``rm``
    already has a model. Raises ValueError for a vLLM reward model without a LoRA adapter (whole weights are not
    refreshed on an engine)."""
    if rm.model is not None or rm.backend != "vllm":
        return
    engine = rm.engine
    if not getattr(engine, "adapter_dir", None):
        raise ValueError("rm_refresh trains a vLLM-served reward model through its LoRA adapter, and this one has "
                         "none (whole weights); train the reward model with LoRA, or use backend 'hf'")
    model = load_causal_lm(engine.base_model, adapter=engine.adapter_dir, dtype=engine.dtype, trainable_adapter=True)
    rm.model = model.to(resolve_device(None)).eval()


def reward_models(critic) -> list[GenerativeRewardModel]:
    """The generative reward models a refresh fine-tunes: the critic itself, the one shared model of a
    `RewardModelEnsemble` (its members are adapters), or every member of an `EnsembleCritic` (members trained without
    LoRA load as separate models). A vLLM-served one gets its training copy here (`attach_training_copy`). Raises
    ValueError where one is not a reward model this process can train (e.g. one behind a server)."""
    if isinstance(critic, RewardModelEnsemble):
        models = [critic.reward_model]
    elif isinstance(critic, EnsembleCritic):
        models = list(critic.members)
    else:
        models = [critic]
    for rm in models:
        if isinstance(rm, GenerativeRewardModel):
            attach_training_copy(rm)
    if not all(isinstance(rm, GenerativeRewardModel) and rm.model is not None for rm in models):
        raise ValueError("rm_refresh fine-tunes the PPO critic, so the critic must be a generative reward model "
                         "(critic reward_model or reward_model_ensemble) on the transformers or vLLM backend (not "
                         f"behind a server); got {type(critic).__name__} of {sorted({type(rm).__name__ for rm in models})}")
    return models


def trainable_groups(critic) -> list[tuple[GenerativeRewardModel, str | None, list[torch.nn.Parameter]]]:
    """(reward model, adapter name or None, the parameters a refresh trains) for each model a refresh fine-tunes:
    each member's LoRA parameters of a `RewardModelEnsemble`, each member of an `EnsembleCritic`, the adapter of a
    LoRA reward model, or every weight of a plain one."""
    groups = []
    for rm in reward_models(critic):
        model = rm.model
        if isinstance(model, PeftModel):
            adapters = critic.adapters if isinstance(critic, RewardModelEnsemble) else [model.active_adapter]
            groups += [(rm, name, [p for n, p in model.named_parameters() if "lora_" in n and f".{name}." in n])
                       for name in adapters]
        else:
            groups.append((rm, None, list(model.parameters())))
    return groups


def target_tokens(example: Mapping[str, Sequence[int]]) -> int:
    """Tokens a causal-LM loss scores in an encoded example: labels other than -100 after the one-token shift."""
    return sum(1 for label in list(example["labels"])[1:] if label != IGNORE_INDEX)


def summed_target_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy over the target positions.

    Args:
        logits: (B, L, V) the model's logits for each position.
        labels: (B, L) token ids, -100 where nothing is scored (the input, padding).
    Returns:
        a scalar: the sum over positions t with ``labels[:, t + 1] != -100`` of -log p(labels[:, t + 1]).
    """
    shifted = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:]  # position t predicts token t + 1
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), shifted.reshape(-1),
                                             ignore_index=IGNORE_INDEX, reduction="sum")


def fine_tune(model: torch.nn.Module, params: Sequence[torch.nn.Parameter], examples: Sequence[Mapping[str, Any]],
              pad_token_id: int, *, steps: int, batch_size: int, learning_rate: float, seed: int,
              micro_batch_size: int | None = None) -> dict[str, float]:
    """``steps`` AdamW steps of causal-LM loss on the targets of encoded ``examples`` (`encode_example` dicts),
    batches drawn without replacement (reshuffled when used up) with ``seed``; only ``params`` are trained.

    Each batch of ``batch_size`` runs forward and backward in pieces of ``micro_batch_size`` (None: the whole batch
    at once) whose summed losses are divided by the batch's target-token count, so the gradient is the whole
    batch's token mean whatever the piece size: pieces only bound the activations held at once. Returns the first and
    last batch's loss."""
    if not examples:
        return {}
    device = next(model.parameters()).device
    flags = [(p, p.requires_grad) for p in model.parameters()]
    chosen = {id(p) for p in params}
    for p, _ in flags:
        p.requires_grad_(id(p) in chosen)
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
    rng, order, losses = random.Random(seed), [], []
    piece = micro_batch_size or batch_size
    model.train()
    try:
        for _ in range(steps):
            if len(order) < batch_size:
                order += rng.sample(range(len(examples)), len(examples))
            rows, order = order[:batch_size], order[batch_size:]
            batch = [examples[i] for i in rows]
            n_targets = max(1, sum(target_tokens(e) for e in batch))
            loss = 0.0
            for start in range(0, len(batch), piece):
                tensors = {k: v.to(device) for k, v in collate(batch[start:start + piece], pad_token_id).items()}
                logits = model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"]).logits
                part = summed_target_loss(logits, tensors["labels"]) / n_targets
                part.backward()
                loss += float(part.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
    finally:
        model.eval()
        for p, flag in flags:
            p.requires_grad_(flag)
    return {"loss_first": losses[0], "loss_last": losses[-1]}


# --------------------------------------------------------------------------------------------------
# The refresh
# --------------------------------------------------------------------------------------------------


class RewardModelRefresh:
    """Re-teach the PPO critic (a reward model) on annotated on-policy rollouts every ``every`` iterations.

    Args:
        critic: the PPO critic: a `GenerativeRewardModel` (transformers backend, or vLLM with a LoRA adapter), a
            `RewardModelEnsemble`, or an `EnsembleCritic` of such reward models (an ensemble whose members were
            trained without LoRA).
        annotator: any critic (``feedback(prompts, responses)``) whose labels the reward model learns.
        every, samples, replay_paths, replay_ratio, steps, batch_size, learning_rate, seed, micro_batch_size: the
            ``rm_refresh_*`` options of `PPOConfig`.
    """

    def __init__(self, critic, annotator, *, every: int, samples: int | None, replay_paths: Sequence[str],
                 replay_ratio: float, steps: int, batch_size: int, learning_rate: float, seed: int,
                 micro_batch_size: int | None = None) -> None:
        self.reward_models = reward_models(critic)
        rm = self.reward_models[0]  # its tokenizer counts the agreement's tokens
        if not callable(getattr(annotator, "feedback", None)):
            raise TypeError("the annotating critic (rm_refresh_critic) has no feedback(prompts, responses) method")
        self.critic, self.rm, self.annotator = critic, rm, annotator
        self.every, self.samples, self.replay_ratio = every, samples, replay_ratio
        self.steps, self.batch_size, self.learning_rate, self.seed = steps, batch_size, learning_rate, seed
        self.micro_batch_size = micro_batch_size
        self.offline = [r for path in replay_paths for r in load_records(path, required=("prompt", "response"))]
        self.annotated: list[dict[str, Any]] = []  # on-policy annotations of the refreshes so far
        # the refreshed adapters of vLLM-served reward models, kept while their engines may still read them
        self._served = tempfile.TemporaryDirectory(prefix="text2grad-rm-refresh-") if any(
            rm.backend == "vllm" for rm in self.reward_models) else None
        self._serves = 0

    # ---- the iteration hook --------------------------------------------------------------------------
    def after_iteration(self, step: int, prompts: Sequence[str], responses: Sequence[str],
                        feedbacks: Sequence[Feedback], accelerator, output_dir: Path) -> dict[str, float]:
        """Refresh after iterations ``every``, ``2 * every``, ...; returns the ``rm_refresh/*`` metrics."""
        counts = {"rm_refresh/annotations": 0.0, "rm_refresh/annotations_total": float(len(self.annotated))}
        if step % self.every:
            return counts
        t0 = time.perf_counter()
        pairs = list(zip(prompts, responses, [fb.to_dict() | {"error": fb.error} for fb in feedbacks]))
        if accelerator.num_processes > 1:
            pairs = gather_object(pairs)
        picked = [pairs[i] for i in pick_rollouts([p[1] for p in pairs], self.samples, self.seed, step)]
        shared = [self._annotate(picked, step) if accelerator.is_main_process else None]
        if accelerator.num_processes > 1:
            broadcast_object_list(shared, from_process=0)
        new, stats = shared[0]
        losses = self._fine_tune(new, step) if accelerator.is_main_process and new else {}
        self._share_weights(accelerator)
        self._serve_on_engines()
        self.annotated.extend(new)
        if accelerator.is_main_process:
            self._save(output_dir / REFRESH_DIR / f"step-{step}", new)
        return {**counts, **stats, **{f"rm_refresh/{k}": v for k, v in losses.items()},
                "rm_refresh/annotations": float(len(new)), "rm_refresh/annotations_total": float(len(self.annotated)),
                "rm_refresh/replay_pool": float(len(self.offline) + len(self.annotated) - len(new)),
                "time/rm_refresh": time.perf_counter() - t0}

    def _annotate(self, picked: Sequence[tuple[str, str, dict]], step: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The annotator's training records on the picked pairs, and the agreement of the reward model's
        feedback on them with the annotator's (before the refresh)."""
        prompts, responses = [p[0] for p in picked], [p[1] for p in picked]
        labels = list(self.annotator.feedback(prompts, responses)) if picked else []
        ok = [k for k, fb in enumerate(labels) if fb.ok]
        before = [Feedback.failed(d["error"]) if d["error"] else Feedback.from_dict(d) for _, _, d in picked]
        stats = {f"rm_refresh/{k}": v for k, v in agreement([before[k] for k in ok], [labels[k] for k in ok],
                                                            [responses[k] for k in ok], self.rm.tokenizer).items()}
        stats["rm_refresh/annotator_errors"] = float(len(picked) - len(ok))
        records = [{"prompt": prompts[k], "response": responses[k], **labels[k].to_dict(), "iteration": step} for k in ok]
        return records, stats

    def _fine_tune(self, new: Sequence[Mapping[str, Any]], step: int) -> dict[str, float]:
        """Fine-tune each trainable group on the new records plus replayed earlier ones."""
        rng = random.Random(f"{self.seed}-replay-{step}")
        pool = self.offline + self.annotated
        replay = rng.sample(pool, min(len(pool), round(self.replay_ratio * len(new))))
        records = list(new) + replay
        examples = {id(rm): self._encode_all(rm, records, step) for rm in self.reward_models}
        results: dict[str, float] = {"too_long": float(len(records) - len(examples[id(self.rm)]))}
        groups = trainable_groups(self.critic)
        for k, (rm, adapter, params) in enumerate(groups):
            if adapter is not None:
                rm.model.set_adapter(adapter)
            # an ensemble's members each learn from their own bootstrap resample, so they stay different
            data = examples[id(rm)]
            if len(groups) > 1:
                data = [data[i] for i in random.Random(f"{self.seed}-{step}-{k}").choices(range(len(data)), k=len(data))]
            out = fine_tune(rm.model, params, data, rm.tokenizer.pad_token_id, steps=self.steps,
                            batch_size=self.batch_size, learning_rate=self.learning_rate, seed=self.seed + step + k,
                            micro_batch_size=self.micro_batch_size)
            for key, v in out.items():  # the members' mean
                results[key] = results.get(key, 0.0) + v / len(groups)
        return results

    def _encode_all(self, rm: GenerativeRewardModel, records: Sequence[Mapping[str, Any]],
                    step: int) -> list[dict[str, list[int]]]:
        """``records`` as ``rm``'s training examples (its tokenizer, instruction and prompt format); those longer than
        what it reads (its input bound) plus what it writes (its generation bound) are left out, with a warning."""
        max_length = (rm.max_input_length or 1024) + rm.max_new_tokens
        encoded = [encode_example(rm.tokenizer, str(r["prompt"]), str(r["response"]), record_feedback(dict(r)),
                                  max_length=max_length, instruction=rm.instruction, prompt_format=rm.prompt_format)
                   for r in records]
        examples = [e.as_dict() for e in encoded if e is not None]
        if len(examples) < len(encoded):
            logger.warning("refresh at iteration %d: %d of %d records do not fit in %d tokens (the reward model's "
                           "max_input_length + max_new_tokens) and are left out", step, len(encoded) - len(examples),
                           len(encoded), max_length)
        return examples

    # ---- weights: every process the same, saved and restored -------------------------------------------
    def _refreshed_parameters(self) -> dict[str, torch.nn.Parameter]:
        """The trained parameters by name; each separate model's names get a ``member-<k>.`` prefix."""
        trained = {id(p) for _, _, params in trainable_groups(self.critic) for p in params}
        several = len(self.reward_models) > 1
        return {(f"member-{k}." if several else "") + n: p for k, rm in enumerate(self.reward_models)
                for n, p in rm.model.named_parameters() if id(p) in trained}

    def _share_weights(self, accelerator) -> None:
        if accelerator.num_processes == 1:
            return
        with torch.no_grad():
            for p in self._refreshed_parameters().values():
                torch.distributed.broadcast(p.data, src=0)

    def _serve_on_engines(self) -> None:
        """Each vLLM-served reward model's engine serves its copy's adapter as it is now."""
        if self._served is None:
            return
        self._serves += 1
        for k, rm in enumerate(self.reward_models):
            if rm.backend == "vllm":
                folder = Path(self._served.name) / f"serve-{self._serves}-member-{k}"
                rm.model.save_pretrained(str(folder))
                rm.engine.serve_adapter(folder)

    def _save(self, folder: Path, new: Sequence[Mapping[str, Any]]) -> None:
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with open(tmp / ANNOTATIONS_FILE, "w", encoding="utf-8") as f:
            for record in new:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        save_file({n: p.detach().cpu().contiguous() for n, p in self._refreshed_parameters().items()}, str(tmp / WEIGHTS_FILE))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)

    def restore(self, output_dir: Path, step: int, is_main: bool) -> int | None:
        """Continue a run resumed at ``step``: reload the annotations of every refresh at or before it and the
        newest refreshed weights (returns that refresh's iteration, or None). A fresh run (``step`` 0) removes
        an earlier run's refreshes (main process only)."""
        root = output_dir / REFRESH_DIR
        if step == 0:
            if is_main:
                shutil.rmtree(root, ignore_errors=True)
            return None
        done = sorted((int(p.name.split("-")[1]), p) for p in root.glob("step-*") if p.name.split("-")[1].isdigit()
                      and (p / WEIGHTS_FILE).is_file()) if root.is_dir() else []
        done = [(s, p) for s, p in done if s <= step]
        self.annotated = [r for _, p in done for r in load_records(str(p / ANNOTATIONS_FILE))] if done else []
        if not done:
            return None
        weights = load_file(str(done[-1][1] / WEIGHTS_FILE))
        params = self._refreshed_parameters()
        if set(weights) != set(params):
            raise ValueError(f"{done[-1][1]} holds refreshed weights of another reward model: its parameter names "
                             "differ from the critic's; resume with the run's own critic_kwargs")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(weights[name].to(p.device, p.dtype))
        self._serve_on_engines()
        return done[-1][0]


def build_rm_refresh(config, critic, records: Sequence[Mapping[str, Any]]) -> RewardModelRefresh | None:
    """The refresh a `PPOConfig` asks for (None without ``rm_refresh_every``): the annotating critic is built
    from the registry and bound to ``records`` (the prompts as the critic sees them)."""
    if not config.rm_refresh_every:
        return None
    annotator = build_critic(config.rm_refresh_critic, config.rm_refresh_critic_kwargs, records=records)
    return RewardModelRefresh(
        critic, annotator, every=config.rm_refresh_every, samples=config.rm_refresh_samples,
        replay_paths=config.rm_refresh_replay, replay_ratio=config.rm_refresh_replay_ratio, steps=config.rm_refresh_steps,
        batch_size=config.rm_refresh_batch_size, learning_rate=config.rm_refresh_learning_rate, seed=config.seed,
        micro_batch_size=config.rm_refresh_micro_batch_size,
    )
