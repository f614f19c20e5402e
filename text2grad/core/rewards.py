"""From feedback on generated token ids to the per-token score rewards of each reward mode.

This module computes the reward modes (their names: `text2grad.core.reward_options`); everything here is
pure (no model, no trainer state) and tested on hand-built batches in tests/policy_optimization/test_reward_modes.py.
The trainer adds the KL term afterwards: ``rewards = score_rewards - kl_coef * kl``.

For one response of ``T_b`` generated tokens (up to and including EOS) with feedback ``fb``:

- span labels: ``decode_with_offsets`` gives each sampled id its characters in the decoded text, and
  ``feedback_token_labels`` paints +1 / -1 / 0 per token from the quoted spans (exact or normalized
  matches only; the EOS token has no characters and stays 0). ``span_token_rewards`` turns labels into
  delta_t (uniform, or linear decay inside a span).
- sequence score ``s``: from ``scalar_source`` (an external function: the scalar reward model of
  `reward_model.scalar` for the paper's PPO baseline, unit tests passing, ...), or without one from the same
  feedback: ``(#good - #poor quotes) / (#good + #poor)`` in [-1, 1], 0 without quotes (``quote_count``; a
  derived score, not the paper's baseline).

Modes (``c`` = ``scalar_coef``)::

    nl_gradient   r_t = delta_t                                  (the method: span token rewards)
    scalar        r_t = c * s at the last token, 0 elsewhere     (PPO baseline; no span alignment at all)
    dense         r_t = delta_t                                  (the paper's dense ablation: the same arithmetic,
                                                                  fed by a critic/reward model that labels every
                                                                  part of the response, ~70 % of tokens)
    score_spread  r_t = delta_t on span tokens, c * s / n_0 on each of the n_0 other tokens
                  (every token carries reward; the unlabelled share sums to c * s whatever the length)
    mixed         r_t = delta_t, plus c * s at the last token    (span rewards + outcome reward)
    scalar_sum    r_t = sum_u delta_u at the last token, 0 elsewhere
                  (the information-matched baseline: exactly the token rewards nl_gradient gives this
                  response, same alignment, scheme, weighting and normalisation, summed and credited to the
                  sequence; it tests whether Text2Grad's gain comes from token-level credit or from what the
                  reward says)

``ScoreRewards.stats()`` reports ``tokens/labelled_share``: the share of response tokens with a +-1 label
(`labelled_token_share`); the paper reports ~30 % for CoT span labels and ~70 % for its dense ablation.

``weighting="pos_importance"`` multiplies each delta_t by its token's part-of-speech weight (1.0 nouns/verbs,
0.2 others; `text2grad.core.token_importance`), the paper's token-importance ablation.

In every mode (nl_gradient included) a response that ran out of tokens without EOS gets
``-missing_eos_penalty`` at its last token, on top of whatever the mode gave that token.

Failure rules (each counted by `ScoreRewards.stats` as ``samples/<status>``):

- empty response (no tokens, or only whitespace/special tokens): zero score reward in every mode, with an
  external score too (there is nothing to credit). ``missing_eos_penalty`` still applies when it ran out of
  tokens without EOS: filling ``response_length`` with blanks is exactly the failure to stop that it punishes.
- failed feedback (``fb.error``, including a critic that raised): no span reward and a
  feedback-derived score of 0; an external score (``scores``) still counts, since it does not come from the
  feedback.
- ok feedback none of whose quotes could be located (``no_matched_span``): the span part is zero; the
  outcome part stays, i.e. scalar/mixed keep ``c * s`` at the last token and score_spread spreads ``c * s``
  over every token (no token is labelled).

Unlabelled tokens earn 0 in nl_gradient/mixed mode, so a longer response earns nothing for its length alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch

from text2grad.core.feedback import Feedback
from text2grad.core.reward_options import (
    REWARD_MODES,
    REWARD_SCHEMES,
    SEQUENCE_SCORE_MODES,
    SPAN_MODES,
    TOKEN_WEIGHTINGS,
    Boundary,
    Occurrence,
    Overlap,
    RewardMode,
    RewardScheme,
    TokenWeightingName,
)
from text2grad.core.spans import decode_with_offsets, feedback_token_labels
from text2grad.core.token_importance import pos_importance_weights

__all__ = [
    "RewardScheme",
    "span_token_rewards",
    "SampleReward",
    "ScoreRewards",
    "span_sequence_score",
    "response_mask",
    "compute_score_rewards",
    "labelled_token_share",
    "REWARD_MODES",
    "SPAN_MODES",
    "TOKEN_WEIGHTINGS",
    "NoFeedback",
]

# A weighting hook gets (token ids, token labels) of one response and returns one weight per token;
# e.g. the paper's "token importance" ablation (1.0 on nouns/verbs, 0.2 elsewhere).
TokenWeighting = Callable[[Sequence[int], Sequence[int]], Sequence[float]]


# --------------------------------------------------------------------------------------------------
# Token rewards from span labels
# --------------------------------------------------------------------------------------------------


def _label_runs(labels: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal non-zero labels as (start, end, label)."""
    runs, i, n = [], 0, len(labels)
    while i < n:
        if labels[i] == 0:
            i += 1
            continue
        j = i
        while j < n and labels[j] == labels[i]:
            j += 1
        runs.append((i, j, int(labels[i])))
        i = j
    return runs


def span_token_rewards(
    labels: Sequence[int],
    scheme: RewardScheme = "uniform",
    *,
    token_ids: Sequence[int] | None = None,
    weighting: TokenWeighting | None = None,
    span_normalize: bool = False,
) -> torch.Tensor:
    """Per-token pseudo-rewards delta_t for one response, shape (T,).

    Args:
        labels: +1 / -1 / 0 per response token (from `text2grad.core.spans.feedback_token_labels`).
        scheme: "uniform" gives each labelled token its label (the paper's default). "linear_decay"
            scales the i-th token (1-based) of a run of n equally labelled tokens by
            ``1 - (i - 1) * 0.9 / (n - 1)`` (the paper's ablation; a one-token run keeps 1.0).
        token_ids, weighting: optional hook; ``weighting(token_ids, labels)`` returns a weight per token
            that multiplies the reward.
        span_normalize: divide each run's rewards by its length, so every span is worth +-1 in total
            however many tokens it has. Off by default, as in the paper.

    Unlabelled tokens always get 0, so a longer response earns nothing for its length alone.
    """
    if scheme not in REWARD_SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(REWARD_SCHEMES)}, got {scheme!r}")
    rewards = torch.tensor([float(x) for x in labels], dtype=torch.float32)
    if scheme == "linear_decay" or span_normalize:
        for start, end, _ in _label_runs(list(labels)):
            n = end - start
            if scheme == "linear_decay" and n > 1:
                rewards[start:end] *= 1.0 - torch.arange(n, dtype=torch.float32) * 0.9 / (n - 1)
            if span_normalize:
                rewards[start:end] /= n
    if weighting is not None:
        if token_ids is None:
            raise ValueError("a weighting hook needs token_ids")
        weights = torch.as_tensor(list(weighting(token_ids, labels)), dtype=torch.float32)
        if weights.shape != rewards.shape:
            raise ValueError(f"weighting returned {tuple(weights.shape)} weights for {len(labels)} tokens")
        rewards = rewards * weights
    return rewards


Status = Literal["ok", "empty", "feedback_error", "no_matched_span"]


@dataclass
class SampleReward:
    """What the reward step found for one response."""

    status: Status
    labels: list[int] = field(default_factory=list)  # per token; empty in scalar mode (no alignment is done)
    n_quotes: int = 0  # quotes that went through span alignment (0 in scalar mode)
    n_unmatched: int = 0
    score: float = 0.0  # the sequence score s of scalar/score_spread/mixed; scalar_sum: the summed span rewards


@dataclass
class ScoreRewards:
    """Score rewards for a batch: ``rewards`` (B, T) before the KL term, ``mask`` (B, T), one `SampleReward` each."""

    rewards: torch.Tensor
    mask: torch.Tensor
    samples: list[SampleReward]

    def stats(self) -> dict[str, float]:
        """Counts and rates for the metrics log."""
        n_quotes = sum(s.n_quotes for s in self.samples)
        n_unmatched = sum(s.n_unmatched for s in self.samples)
        n_tokens = float(self.mask.sum())
        nonzero = float(((self.rewards != 0) & (self.mask > 0)).sum())
        labelled = sum(sum(1 for x in s.labels if x != 0) for s in self.samples)
        aligned = sum(len(s.labels) for s in self.samples)
        out = {f"samples/{k}": float(sum(s.status == k for s in self.samples)) for k in ("empty", "feedback_error", "no_matched_span")}
        out.update(
            {
                "spans/quotes": float(n_quotes),
                "spans/unmatched": float(n_unmatched),
                "tokens/total": n_tokens,
                "tokens/nonzero_reward": nonzero,
                # share of the span-aligned tokens that carry a +-1 label (0 in scalar mode: nothing is aligned)
                "tokens/labelled_share": labelled / aligned if aligned else 0.0,
            }
        )
        return out


def span_sequence_score(feedback: Feedback) -> float:
    """(#good - #poor quotes) / (#good + #poor), in [-1, 1]; 0 for a failed feedback or one without quotes."""
    if not feedback.ok:
        return 0.0
    good, poor = len(feedback.good_spans), len(feedback.poor_spans)
    return (good - poor) / (good + poor) if good + poor else 0.0


class NoFeedback:
    """The critic of the scalar baseline with an external score (``critic: none``).

    Scalar mode aligns no spans, so it needs no critic: every pair gets an empty, successful `Feedback`
    and the whole reward comes from the score function (e.g. the scalar reward model).
    """

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        return [Feedback() for _ in responses]


def labelled_token_share(labels: Sequence[Sequence[int]]) -> float:
    """Share of tokens with a non-zero label over all tokens of the given responses (0 for no tokens).

    ``labels``: per response, one +1 / -1 / 0 per token (`SampleReward.labels`).
    """
    total = sum(len(row) for row in labels)
    return sum(1 for row in labels for x in row if x != 0) / total if total else 0.0


def response_mask(lengths: Sequence[int], length: int) -> torch.Tensor:
    """(B, length) float mask, 1.0 on the first ``lengths[b]`` positions of row b (right padding)."""
    positions = torch.arange(length).unsqueeze(0)
    return (positions < torch.as_tensor(list(lengths), dtype=torch.long).unsqueeze(1)).float()


def compute_score_rewards(
    feedbacks: Sequence[Feedback],
    response_ids: Sequence[Sequence[int]],
    tokenizer,
    *,
    mode: RewardMode,
    length: int | None = None,
    scores: Sequence[float | None] | None = None,
    finished: Sequence[bool] | None = None,
    scheme: RewardScheme = "uniform",
    span_normalize: bool = False,
    boundary: Boundary = "any",
    overlap: Overlap = "poor",
    occurrence: Occurrence = "all",
    scalar_coef: float = 1.0,
    missing_eos_penalty: float | None = None,
    weighting: TokenWeightingName = "none",
    pos_tagger: Callable[[str], list[tuple[str, str]]] | None = None,
    span_rewards: Sequence[torch.Tensor] | None = None,
) -> ScoreRewards:
    """Per-token score rewards for a batch of generated responses.

    Args:
        feedbacks: one `Feedback` per response, on the text ``tokenizer.decode(ids, skip_special_tokens=True)``.
        response_ids: the exact sampled ids of each response, up to and including EOS (no padding).
        tokenizer: the policy's (fast) tokenizer.
        mode: one of `REWARD_MODES` (``text2grad.core.reward_options``; the module docstring gives each formula).
        length: padded length T (default: the longest response).
        scores: external sequence scores (``None`` entries: the score function failed for that sample, 0
            is used; empty responses get 0 whatever their score). Without ``scores`` the score comes from the
            feedback (`span_sequence_score`).
        finished: whether each response ended with EOS; unfinished ones get ``-missing_eos_penalty`` at their
            last token in every mode, empty ones included.
        scheme, span_normalize: reward shape inside a span (`text2grad.core.rewards.span_token_rewards`).
        boundary, overlap, occurrence: span-to-token rules (`text2grad.core.spans`).
        scalar_coef: weight c of the sequence score.
        weighting: "pos_importance" multiplies span rewards by POS weights (1.0 nouns/verbs, 0.2 others).
        pos_tagger: ``fn(text) -> [(word, Penn tag)]`` for "pos_importance" (default: TextBlob's Pattern tagger).
        span_rewards: per response, its span token rewards delta_t already computed (shape (T_b,); e.g. an
            ensemble's aggregate, `text2grad.core.ensemble`): no quote is aligned, the signs are the labels, and
            the mode is built from them as from aligned spans.

    Returns:
        `ScoreRewards` with rewards and mask of shape (B, T), zero on padding.
    """
    if mode not in REWARD_MODES:
        raise ValueError(f"mode must be one of {', '.join(REWARD_MODES)}, got {mode!r}")
    if weighting not in TOKEN_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(TOKEN_WEIGHTINGS)}, got {weighting!r}")
    if len(feedbacks) != len(response_ids):
        raise ValueError(f"got {len(feedbacks)} feedbacks for {len(response_ids)} responses")
    if scores is not None and len(scores) != len(response_ids):
        raise ValueError(f"got {len(scores)} scores for {len(response_ids)} responses")
    if span_rewards is not None and len(span_rewards) != len(response_ids):
        raise ValueError(f"got {len(span_rewards)} span reward rows for {len(response_ids)} responses")
    lengths = [len(ids) for ids in response_ids]
    T = max(lengths, default=0) if length is None else length
    if T < max(lengths, default=0):
        raise ValueError(f"length {T} is shorter than the longest response ({max(lengths)} tokens)")
    rewards = torch.zeros(len(response_ids), T, dtype=torch.float32)
    samples: list[SampleReward] = []
    for b, (fb, ids) in enumerate(zip(feedbacks, response_ids)):
        ids = [int(t) for t in ids]
        n = len(ids)
        info = SampleReward(status="ok")
        external = None if scores is None else scores[b]
        text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) if n else ""
        delta = torch.zeros(n)
        if n == 0 or not text.strip():
            info.status = "empty"
        elif not fb.ok:
            info.status = "feedback_error"
        elif mode != "scalar" and span_rewards is not None:
            delta = span_rewards[b].detach().float().cpu()[:n]
            info.labels = [int(x) for x in torch.sign(delta).tolist()]
            if not any(info.labels):
                info.status = "no_matched_span"
        elif mode != "scalar":
            decoded, offsets = decode_with_offsets(tokenizer, ids)
            result = feedback_token_labels(fb, decoded, offsets, occurrence=occurrence, overlap=overlap, boundary=boundary)
            info.labels = list(result.labels)
            info.n_quotes = len(fb.good_spans) + len(fb.poor_spans)
            info.n_unmatched = result.alignment.n_unmatched
            if any(result.labels):
                delta = span_token_rewards(result.labels, scheme, span_normalize=span_normalize)
                if weighting == "pos_importance":
                    weights = pos_importance_weights(decoded, offsets, tagger=pos_tagger)
                    delta = delta * torch.tensor(weights, dtype=torch.float32)
            else:
                info.status = "no_matched_span"
        if mode in SEQUENCE_SCORE_MODES and info.status != "empty":
            if external is not None:
                info.score = float(external)
            elif scores is None and info.status != "feedback_error":
                info.score = span_sequence_score(fb)
        if mode == "scalar_sum":
            info.score = float(delta.sum())
            delta = torch.zeros(n)
            if n:
                delta[n - 1] = info.score
        if n:
            rewards[b, :n] = delta
            s = scalar_coef * info.score
            if mode in ("scalar", "mixed"):
                rewards[b, n - 1] += s
            elif mode == "score_spread":
                unlabelled = [t for t in range(n) if not info.labels or info.labels[t] == 0]
                if unlabelled:
                    rewards[b, unlabelled] += s / len(unlabelled)
                else:  # every token sits in a span: the score still counts, at the last token
                    rewards[b, n - 1] += s
            if missing_eos_penalty and finished is not None and not finished[b]:
                rewards[b, n - 1] -= missing_eos_penalty
        samples.append(info)
    return ScoreRewards(rewards=rewards, mask=response_mask(lengths, T), samples=samples)
