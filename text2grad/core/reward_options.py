"""The option sets of the reward computation, defined once.

Each set is a ``Literal`` type, so a config field annotated with it is checked by the config parser (an unknown
value exits 2 listing the allowed ones), and a tuple of its values for code and help texts. The configs
(`policy_optimization.ppo_config`, `policy_optimization.grpo_config`, the quickstart's), the reward functions
(`text2grad.core.rewards`, `text2grad.core.spans`), the trainer and the CLI help all read them from here.
This module imports nothing heavy (no torch), so a config can import it cheaply.

Reward modes (what each computes: `text2grad.core.rewards`):

=================  =====================================================================================
``nl_gradient``    span token rewards from the critic's quotes (the method)
``scalar``         one sequence score at the last token (the PPO baseline)
``dense``          span token rewards, the same arithmetic as ``nl_gradient``, for a critic that labels
                   every part of the response (the paper's dense-annotation ablation)
``score_spread``   span token rewards plus the sequence score spread evenly over the unlabelled tokens
``mixed``          span token rewards plus the sequence score at the last token
``scalar_sum``     the sum of the span token rewards ``nl_gradient`` would give the response, placed at its
                   last token: the same information as the method with sequence-level credit (the
                   information-matched scalar baseline)
=================  =====================================================================================
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "RewardMode",
    "REWARD_MODES",
    "SPAN_MODES",
    "SEQUENCE_SCORE_MODES",
    "RewardScheme",
    "REWARD_SCHEMES",
    "TokenWeightingName",
    "TOKEN_WEIGHTINGS",
    "Boundary",
    "BOUNDARIES",
    "Overlap",
    "OVERLAPS",
    "Occurrence",
    "OCCURRENCES",
    "Aggregation",
    "AGGREGATIONS",
]

RewardMode = Literal["nl_gradient", "scalar", "dense", "score_spread", "mixed", "scalar_sum"]
REWARD_MODES: tuple[str, ...] = get_args(RewardMode)
# Modes whose reward uses the critic's span labels.
SPAN_MODES: tuple[str, ...] = tuple(m for m in REWARD_MODES if m != "scalar")
# Modes whose reward uses a sequence score s; the others never compute one (no scalar reward model run).
SEQUENCE_SCORE_MODES: tuple[str, ...] = ("scalar", "score_spread", "mixed")

RewardScheme = Literal["uniform", "linear_decay"]  # the reward shape inside a span
REWARD_SCHEMES: tuple[str, ...] = get_args(RewardScheme)
TokenWeightingName = Literal["none", "pos_importance"]  # within-span token weights
TOKEN_WEIGHTINGS: tuple[str, ...] = get_args(TokenWeightingName)

# The span-to-token rules (`text2grad.core.spans`).
Boundary = Literal["any", "majority", "all"]  # which tokens a span edge labels
BOUNDARIES: tuple[str, ...] = get_args(Boundary)
Overlap = Literal["poor", "good"]  # the label that wins where a good and a poor span overlap
OVERLAPS: tuple[str, ...] = get_args(Overlap)
Occurrence = Literal["all", "first"]  # label every occurrence of a repeated quote, or the first
OCCURRENCES: tuple[str, ...] = get_args(Occurrence)

# How an ensemble critic's members are combined per token (`text2grad.core.ensemble`).
Aggregation = Literal["vote", "mean_minus_std"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
