"""Critic ensembles: K critics judge every response, and their per-token values are aggregated conservatively.

A policy optimised against one learned reward model finds the tokens that model over-rewards (Gao et al. 2022,
"Scaling Laws for Reward Model Overoptimization"). Several reward models trained on different seeds or
bootstrap resamples of the annotations rarely share the same mistakes, so a reward that only pays where they
agree is much harder to exploit (Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization").

An ensemble critic returns one `EnsembleFeedback` per response: the K members' own `Feedback` in ``members``,
plus a quote-level consensus in its own spans for consumers that only read quotes. The PPO trainer aggregates
at the token level instead (`ensemble_score_rewards`): each member's feedback becomes span token rewards on
the exact sampled ids, and the K rows are combined by one of the pure functions below; the sequence scores of
the scalar modes are combined by the same function over the members' scores, and every reward mode is then
built from the aggregate exactly as from one critic's feedback.

Aggregations (``values`` has shape (K, ...), one row per member; members whose feedback failed on a response
are left out of that response, through ``valid``):

- ``vote(values, min_votes)``: negative where ANY member is negative (the mean of the negative values); positive
  only where at least ``min_votes`` members are positive and none is negative (the mean of the positive values);
  0 elsewhere. On +-1 span labels: -1 where any member says poor, +1 where m of K say good.
- ``mean_minus_std(values, std_coef)``: mean - std_coef * std over the members (population std).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from text2grad.core.critics import build_critic
from text2grad.core.feedback import Feedback
from text2grad.core.reward_options import AGGREGATIONS, Aggregation
from text2grad.core.rewards import SEQUENCE_SCORE_MODES, ScoreRewards, compute_score_rewards, span_sequence_score

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "EnsembleCritic",
    "EnsembleFeedback",
    "aggregate",
    "consensus_feedback",
    "ensemble_score_rewards",
    "mean_minus_std",
    "vote",
]


# --------------------------------------------------------------------------------------------------
# Pure aggregations over per-member values
# --------------------------------------------------------------------------------------------------


def _valid_mask(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """``valid`` (K, ...) or broadcastable to ``values`` as a bool tensor of the values' shape (all True if None)."""
    if valid is None:
        return torch.ones_like(values, dtype=torch.bool)
    valid = valid.to(device=values.device, dtype=torch.bool)
    while valid.dim() < values.dim():
        valid = valid.unsqueeze(-1)
    return valid.expand_as(values)


def vote(values: torch.Tensor, min_votes: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Conservative vote of K members per position.

    Args:
        values: (K, *S) per-member values (span token rewards, or sequence scores); the sign is the member's vote.
        min_votes: how many members must be positive for a positive result (m of K, >= 1). Where fewer members
            are valid than ``min_votes``, all valid members must agree.
        valid: (K, *S) or a leading-dims prefix of it, e.g. (K, B) for (K, B, T) values: False leaves that
            member out at that position (its critic failed on that response).

    Returns:
        (*S): the mean of the negative values where any valid member is negative; else the mean of the positive
        values where at least min(m, valid members) are positive; else 0 (also where no member is valid).
    """
    if min_votes < 1:
        raise ValueError(f"min_votes must be >= 1, got {min_votes}")
    ok = _valid_mask(values, valid)
    positive, negative = (values > 0) & ok, (values < 0) & ok
    n_positive, n_negative, n_valid = positive.sum(0), negative.sum(0), ok.sum(0)
    needed = torch.clamp(n_valid, max=min_votes)
    mean_negative = (values * negative).sum(0) / n_negative.clamp(min=1)
    mean_positive = (values * positive).sum(0) / n_positive.clamp(min=1)
    zero = torch.zeros_like(mean_positive)
    agreed = (n_positive >= needed) & (n_valid > 0)
    return torch.where(n_negative > 0, mean_negative, torch.where(agreed, mean_positive, zero))


def mean_minus_std(values: torch.Tensor, std_coef: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean minus ``std_coef`` standard deviations over the members, per position.

    Args:
        values: (K, *S) per-member values.
        std_coef: k >= 0; 0 is the plain ensemble mean.
        valid: as in `vote`; invalid members are left out of both moments.

    Returns:
        (*S): mean - k * std with the population standard deviation sqrt(mean((v - mean)^2)) of the valid
        members; 0 where no member is valid.
    """
    if std_coef < 0:
        raise ValueError(f"std_coef must be >= 0, got {std_coef}")
    ok = _valid_mask(values, valid).to(values.dtype)
    n = ok.sum(0)
    mean = (values * ok).sum(0) / n.clamp(min=1)
    var = (((values - mean) ** 2) * ok).sum(0) / n.clamp(min=1)
    return torch.where(n > 0, mean - std_coef * var.sqrt(), torch.zeros_like(mean))


def aggregate(values: torch.Tensor, how: Aggregation, *, min_votes: int, std_coef: float,
              valid: torch.Tensor | None = None) -> torch.Tensor:
    """`vote` or `mean_minus_std` of (K, *S) values -> (*S)."""
    if how == "vote":
        return vote(values, min_votes, valid)
    if how == "mean_minus_std":
        return mean_minus_std(values, std_coef, valid)
    raise ValueError(f"ensemble aggregation must be one of {list(AGGREGATIONS)}, got {how!r}")


# --------------------------------------------------------------------------------------------------
# Ensemble feedback and the generic ensemble critic
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnsembleFeedback(Feedback):
    """A `Feedback` that also carries each member's own feedback on the same response (``members``, K of them).

    Its own spans are the quote-level consensus (`consensus_feedback`), for consumers that read quotes only;
    it is failed only when every member failed.
    """

    members: tuple[Feedback, ...] = ()


def consensus_feedback(members: Sequence[Feedback], min_votes: int) -> EnsembleFeedback:
    """The members' feedback on one response as one `EnsembleFeedback`: a good quote is kept when at least
    min(``min_votes``, working members) members quote it as good and none as poor; every member's poor quotes
    are kept. Members whose feedback failed are left out; all failed -> failed."""
    working = [fb for fb in members if fb.ok]
    if not working:
        errors = "; ".join(sorted({fb.error or "" for fb in members}))
        return EnsembleFeedback(error=f"every ensemble member failed: {errors}", members=tuple(members))
    needed = min(min_votes, len(working))
    poor = list(dict.fromkeys(q for fb in working for q in fb.poor_spans))
    counts: dict[str, int] = {}
    for fb in working:
        for quote in dict.fromkeys(fb.good_spans):
            counts[quote] = counts.get(quote, 0) + 1
    good = [q for q, c in counts.items() if c >= needed and q not in poor]
    critique = " | ".join(fb.critique for fb in working if fb.critique)
    return EnsembleFeedback(critique=critique, good_spans=tuple(good), poor_spans=tuple(poor), members=tuple(members))


class EnsembleCritic:
    """Any critics as one ensemble critic (registry name ``ensemble``): each member judges every response.

    Args:
        members: the member critics as ``[{"critic": name, "critic_kwargs": {...}}, ...]`` (registry names or
            ``package.module:Name``), or already built critics.
        min_votes: m of `consensus_feedback` (the quote-level consensus); default: every member (unanimity).
            The PPO trainer's token-level aggregation is set by its own ensemble_* options.

    For K generative reward models that share one base model, use ``reward_model_ensemble`` instead
    (`reward_model.ensemble.RewardModelEnsemble`: K LoRA adapters, one copy of the base weights).
    """

    def __init__(self, members: Sequence[Any], min_votes: int | None = None) -> None:
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 members, got {len(members)}")
        built = []
        for spec in members:
            if isinstance(spec, Mapping):
                if "critic" not in spec:
                    raise ValueError(f"ensemble member {dict(spec)} has no 'critic' key; write {{critic: NAME, critic_kwargs: {{...}}}}")
                built.append(build_critic(spec["critic"], spec.get("critic_kwargs") or {}))
            elif callable(getattr(spec, "feedback", None)):
                built.append(spec)
            else:
                raise TypeError(f"ensemble members must be {{critic:, critic_kwargs:}} mappings or critics, got {type(spec).__name__}")
        self.members = built
        self.min_votes = min_votes or len(built)

    def bind_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        for member in self.members:
            if callable(getattr(member, "bind_records", None)):
                member.bind_records(records)

    def member_feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[list[Feedback]]:
        """(K lists of B feedbacks): every member's feedback on every pair."""
        return [list(member.feedback(prompts, responses)) for member in self.members]

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[EnsembleFeedback]:
        per_member = self.member_feedback(prompts, responses)
        return [consensus_feedback(column, self.min_votes) for column in zip(*per_member)]

    def close(self) -> None:
        for member in self.members:
            close = getattr(member, "close", None)
            if callable(close):
                close()


# --------------------------------------------------------------------------------------------------
# Token-level aggregation of an ensemble's feedback into score rewards
# --------------------------------------------------------------------------------------------------


def ensemble_score_rewards(
    feedbacks: Sequence[Feedback],
    response_ids: Sequence[Sequence[int]],
    tokenizer,
    *,
    aggregation: Aggregation,
    min_votes: int | None,
    std_coef: float,
    mode: str,
    scores: Sequence[float | None] | None = None,
    **reward_kwargs: Any,
) -> ScoreRewards:
    """`compute_score_rewards` for a batch whose feedbacks are `EnsembleFeedback` (plain ones pass straight through).

    Each member's feedback becomes span token rewards (K, B, T) with the same alignment options; they are
    aggregated per token (members that failed on a response are left out of it); in the modes with a sequence
    score and no external ``scores``, each member's quote-count score (K, B) is aggregated the same way. The
    reward mode is then built from the aggregate exactly as from one critic (so e.g. a sum of the token rewards
    is the sum of the aggregated ones). ``min_votes`` None = every member.
    """
    if not any(isinstance(fb, EnsembleFeedback) and fb.members for fb in feedbacks):
        return compute_score_rewards(feedbacks, response_ids, tokenizer, mode=mode, scores=scores, **reward_kwargs)
    sizes = {len(fb.members) for fb in feedbacks if isinstance(fb, EnsembleFeedback) and fb.members}
    if len(sizes) != 1:
        raise ValueError(f"ensemble feedbacks of one batch must have the same number of members, got {sorted(sizes)}")
    k = sizes.pop()
    empty = Feedback.failed("no member feedback")
    member_rows = [[fb.members[i] if isinstance(fb, EnsembleFeedback) and fb.members else empty for fb in feedbacks]
                   for i in range(k)]
    span_kwargs = {key: v for key, v in reward_kwargs.items() if key not in ("finished", "missing_eos_penalty", "scalar_coef")}
    span_mode = "dense" if mode == "dense" else "nl_gradient"
    per_member = [compute_score_rewards(rows, response_ids, tokenizer, mode=span_mode, **span_kwargs).rewards
                  for rows in member_rows]
    valid = torch.tensor([[fb.ok for fb in rows] for rows in member_rows], dtype=torch.bool)  # (K, B)
    spans = aggregate(torch.stack(per_member), aggregation, min_votes=min_votes or k, std_coef=std_coef, valid=valid)
    if mode in SEQUENCE_SCORE_MODES and scores is None:
        member_scores = torch.tensor([[span_sequence_score(fb) for fb in rows] for rows in member_rows])
        scores = aggregate(member_scores, aggregation, min_votes=min_votes or k, std_coef=std_coef, valid=valid).tolist()
    lengths = [len(ids) for ids in response_ids]
    return compute_score_rewards(feedbacks, response_ids, tokenizer, mode=mode, scores=scores,
                                 span_rewards=[spans[b, :n] for b, n in enumerate(lengths)], **reward_kwargs)
