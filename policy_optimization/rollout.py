"""The rollout side of a PPO iteration: feedback and scores for sampled responses, the packed training tensors,
and the per-batch statistics and sample records the trainer logs.

Everything here is a function of its arguments (no trainer state), so `policy_optimization.trainer` can read as
the PPO step alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from text2grad.core.feedback import Feedback
from text2grad.core.generation import Generation
from text2grad.core.ppo_math import masked_mean
from text2grad.core.reward_options import SEQUENCE_SCORE_MODES
from text2grad.core.rewards import ScoreRewards

__all__ = [
    "Rollout", "SUM_KEYS", "batch_stats", "chunks", "collect_feedback", "collect_scores", "derived_rates",
    "feedback_errors", "feedback_failure_message", "pack_rollout", "sample_records",
]

logger = logging.getLogger(__name__)

# Batch statistics that are counts: summed over processes (the others are averaged).
SUM_KEYS = frozenset(
    {"samples/empty", "samples/feedback_error", "samples/no_matched_span", "samples/source_error", "samples/score_error",
     "samples/batch", "spans/quotes", "spans/unmatched", "tokens/total", "tokens/nonzero_reward"}
)


@dataclass
class Rollout:
    """One batch of sampled responses as training tensors. P = prompt width, T = response width."""

    input_ids: torch.Tensor  # (B, P + T): left-padded prompt + right-padded response
    attention_mask: torch.Tensor  # (B, P + T)
    position_ids: torch.Tensor  # (B, P + T)
    response_ids: torch.Tensor  # (B, T)
    generations: list[Generation]

    @property
    def response_length(self) -> int:
        return self.response_ids.shape[1]


def collect_feedback(source, prompts: Sequence[str], responses: Sequence[str]) -> tuple[list[Feedback], int]:
    """(feedback per response, number of samples lost to a source that raised). Empty responses get a failed
    feedback without asking the source; a source that raises costs a zero reward per sample, counted."""
    out = [Feedback.failed("empty response") for _ in responses]
    todo = [i for i, r in enumerate(responses) if r.strip()]
    if not todo:
        return out, 0
    try:
        got = source.feedback([prompts[i] for i in todo], [responses[i] for i in todo])
    except Exception as exc:  # the protocol says sources never raise; a broken one is counted, then judged by rate
        message = f"critic raised {type(exc).__name__}: {exc}"
        for i in todo:
            out[i] = Feedback.failed(message)
        return out, len(todo)
    got = list(got)
    if len(got) != len(todo):
        raise TypeError(f"the critic returned {len(got)} feedbacks for {len(todo)} responses; it must return one per pair")
    for i, fb in zip(todo, got):
        if isinstance(fb, Mapping):
            fb = Feedback.from_dict(dict(fb))
        if not isinstance(fb, Feedback):
            raise TypeError(f"the critic returned a {type(fb).__name__}; expected text2grad.core.feedback.Feedback")
        out[i] = fb
    return out, 0


def collect_scores(
    score_fn: Callable[[Sequence[str], Sequence[str]], Sequence[float]] | None,
    reward_mode: str,
    prompts: Sequence[str],
    responses: Sequence[str],
) -> tuple[list[float | None] | None, int]:
    """(task scores from ``score_fn``, number of samples without one). None when the sequence score comes from
    the feedback (no ``score_fn``) or the mode has none (nl_gradient, dense: not in `SEQUENCE_SCORE_MODES`), so
    a scalar reward model never runs for a score that would be thrown away."""
    if score_fn is None or reward_mode not in SEQUENCE_SCORE_MODES:
        return None, 0
    try:
        raw = list(score_fn(prompts, responses))
    except Exception as exc:
        logger.warning("score function raised %s: %s (score 0 for the batch)", type(exc).__name__, exc)
        return [None] * len(prompts), len(prompts)
    if len(raw) != len(prompts):
        raise TypeError(f"the score function returned {len(raw)} scores for {len(prompts)} responses")
    scores: list[float | None] = []
    for value in raw:
        try:
            scores.append(float(value))
        except (TypeError, ValueError):
            scores.append(None)
    return scores, sum(s is None for s in scores)


def feedback_errors(feedbacks: Sequence[Feedback], responses: Sequence[str]) -> list[str]:
    """The error of every non-empty response whose feedback failed (an empty response is the policy's doing,
    not the critic's, and is counted separately)."""
    return [fb.error or "feedback failed" for fb, r in zip(feedbacks, responses) if r.strip() and not fb.ok]


def feedback_failure_message(
    iteration: int, n_errors: int, n_samples: int, max_rate: float, cause: str, latest_checkpoint: Path | None
) -> str:
    """Why PPO stopped: the iteration's feedback failed on more than ``max_rate`` of its samples."""
    return (
        f"iteration {iteration}: feedback failed for {n_errors} of {n_samples} samples ({n_errors / n_samples:.0%}), "
        f"above max_feedback_error_rate={max_rate}; first cause: {cause}. Nothing of this iteration was trained on. "
        "Fix the critic (is its server reachable?), then rerun with --resume auto (continues from "
        f"{latest_checkpoint or 'the start'}), or raise --max_feedback_error_rate."
    )


def pack_rollout(generations: list[Generation], pad_token_id: int, device) -> Rollout:
    """Left-padded prompts + right-padded responses, with attention mask and position ids."""
    B = len(generations)
    P = max(len(g.prompt_ids) for g in generations)
    T = max(1, max(len(g.response_ids) for g in generations))
    input_ids = torch.full((B, P + T), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(B, P + T, dtype=torch.long)
    for b, g in enumerate(generations):
        p, r = len(g.prompt_ids), len(g.response_ids)
        input_ids[b, P - p : P] = torch.tensor(g.prompt_ids, dtype=torch.long)
        input_ids[b, P : P + r] = torch.tensor(g.response_ids, dtype=torch.long)
        attention_mask[b, P - p : P + r] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return Rollout(
        input_ids.to(device), attention_mask.to(device), position_ids.to(device), input_ids[:, P:].to(device), generations
    )


def batch_stats(
    score: ScoreRewards, rewards, kl, entropy, mask, generations: Sequence[Generation], n_source_errors: int, n_score_errors: int
) -> dict[str, float]:
    """This process's statistics of one iteration (rewards, KL, entropy: (B, T); mask: (B, T))."""
    seq_len = mask.sum(-1)
    stats = {
        "reward/score_mean": float(score.rewards.sum(-1).mean()),
        "reward/total_mean": float(rewards.sum(-1).mean()),
        "objective/kl": float(kl.sum(-1).mean()),
        "policy/rollout_entropy": float(masked_mean(entropy, mask)),
        "response/length_mean": float(seq_len.float().mean()),
        "response/missing_eos_rate": float(np.mean([not g.finished for g in generations])),
        "samples/source_error": float(n_source_errors),
        "samples/score_error": float(n_score_errors),
        "samples/batch": float(len(generations)),
    }
    stats.update(score.stats())
    return stats


def derived_rates(stats: dict[str, float]) -> dict[str, float | None]:
    """Rates from the summed counts (None where undefined, e.g. the unmatched rate in scalar mode)."""
    out: dict[str, float | None] = dict(stats)
    out["tokens/nonzero_reward_share"] = stats["tokens/nonzero_reward"] / stats["tokens/total"] if stats["tokens/total"] else 0.0
    out["spans/unmatched_rate"] = stats["spans/unmatched"] / stats["spans/quotes"] if stats["spans/quotes"] else None
    return out


def sample_records(
    iteration: int, limit: int, tokenizer, prompts, feedback_prompts, generations, feedbacks, score: ScoreRewards
) -> list[dict[str, Any]]:
    """The first ``limit`` samples as ``samples.jsonl`` records, with the tokens that got a non-zero reward."""
    out = []
    for b in range(min(limit, len(generations))):
        g, info = generations[b], score.samples[b]
        rewarded = [
            [tokenizer.decode([t]), round(float(score.rewards[b, i]), 4)]
            for i, t in enumerate(g.response_ids) if float(score.rewards[b, i]) != 0
        ]
        out.append({
            "iteration": iteration, "prompt": prompts[b], "feedback_prompt": feedback_prompts[b],
            "response": g.text, "finished": g.finished, "n_tokens": len(g.response_ids), "status": info.status,
            "feedback": {**feedbacks[b].to_dict(), "error": feedbacks[b].error},
            "score": info.score, "rewarded_tokens": rewarded,
        })
    return out


def chunks(n: int, size: int) -> list[slice]:
    """``[0:size], [size:2*size], ...`` covering ``range(n)``."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]
