"""K generative reward models as one critic: K LoRA adapters on ONE copy of the base model's weights.

    python -m reward_model.train --config configs/slf5k/reward_model.yaml --ensemble_size 3 --bootstrap true
    python -m policy_optimization.train --config ... --critic reward_model_ensemble \\
        --critic_kwargs '{"path": "outputs/slf5k/reward_model"}' --ensemble_aggregation vote

``reward_model.train --ensemble_size K`` trains members ``member-0`` ... ``member-<K-1>`` in the output directory
(seeds seed, seed + 1, ...; with ``--bootstrap true`` each on its own resample of the annotations). This module
loads them as a peft model with K named adapters over a single base model and asks each member in turn
(switching the active adapter), so K members cost one base model of memory plus K small adapters, and K
generation passes per batch. Members trained without LoRA cannot share weights: they are loaded as K separate
models (`text2grad.core.ensemble.EnsembleCritic`), with a warning about the memory.

How the members' per-token rewards are combined (vote, mean - k * std) is `text2grad.core.ensemble`'s.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

from peft import PeftModel

from reward_model.inference import GenerativeRewardModel
from reward_model.train_config import MEMBER_PREFIX
from text2grad.core.ensemble import EnsembleCritic, EnsembleFeedback, consensus_feedback
from text2grad.core.feedback import Feedback

__all__ = ["RewardModelEnsemble", "member_paths"]

logger = logging.getLogger("reward_model.ensemble")


def member_paths(path: str | Path) -> list[str]:
    """The member directories of an ensemble trained by ``reward_model.train --ensemble_size K``, in order."""
    root = Path(path)
    members = sorted((p for p in root.glob(f"{MEMBER_PREFIX}*") if p.is_dir()),
                     key=lambda p: int(p.name[len(MEMBER_PREFIX):]) if p.name[len(MEMBER_PREFIX):].isdigit() else -1)
    if not members:
        raise ValueError(f"{root} holds no {MEMBER_PREFIX}<k> directories: train an ensemble with "
                         "python -m reward_model.train ... --ensemble_size K, or pass the members as paths: [...]")
    return [str(p) for p in members]


def _adapter_base(path: str) -> str | None:
    """The base model an adapter directory names, or None when ``path`` is not an adapter directory."""
    config = Path(path) / "adapter_config.json"
    if not config.is_file() or (Path(path) / "config.json").is_file():
        return None
    return json.loads(config.read_text()).get("base_model_name_or_path")


class RewardModelEnsemble:
    """K LoRA reward models on one shared base model (a `text2grad.core.critics.FeedbackSource`).

    Args:
        reward_model: a `GenerativeRewardModel` whose ``model`` is a ``PeftModel`` holding every member's adapter.
        adapters: the adapter names, one per member, in order.
        min_votes: m of the quote-level consensus in each `EnsembleFeedback`'s own spans (default: all members).
    """

    def __init__(self, reward_model: GenerativeRewardModel, adapters: Sequence[str], min_votes: int | None = None):
        if not isinstance(reward_model.model, PeftModel):
            raise TypeError("RewardModelEnsemble needs a reward model whose model is a PeftModel with the members' adapters")
        missing = [a for a in adapters if a not in reward_model.model.peft_config]
        if missing:
            raise ValueError(f"adapters {missing} are not loaded; loaded: {sorted(reward_model.model.peft_config)}")
        if len(adapters) < 2:
            raise ValueError(f"an ensemble needs at least 2 members, got {len(adapters)}")
        self.reward_model = reward_model
        self.adapters = list(adapters)
        self.min_votes = min_votes or len(self.adapters)
        self.device = reward_model.device

    @property
    def model(self) -> PeftModel:
        return self.reward_model.model

    @classmethod
    def from_pretrained(cls, paths: Sequence[str], min_votes: int | None = None, **kwargs: Any) -> "RewardModelEnsemble":
        """Load the adapters in ``paths`` (LoRA reward-model directories over the same base model) onto one base.

        ``kwargs`` go to `GenerativeRewardModel.from_pretrained` (dtype, device, max_new_tokens, grounded_spans, ...);
        every member is asked the way the first one was trained.
        """
        bases = [_adapter_base(p) for p in paths]
        if any(b is None for b in bases) or len(set(bases)) != 1:
            raise ValueError(f"members {list(paths)} must all be LoRA adapters over the same base model (found bases "
                             f"{bases}); members without LoRA load as separate models through from_critic_kwargs")
        if kwargs.get("backend", "hf") != "hf":
            raise ValueError("reward_model_ensemble switches adapters on a transformers model: backend must be 'hf'")
        kwargs.pop("merge_adapter", None)
        reward_model = GenerativeRewardModel.from_pretrained(paths[0], merge_adapter=False, **kwargs)
        names = [f"{MEMBER_PREFIX}{k}" for k in range(len(paths))]
        model = reward_model.model
        model.load_adapter(paths[0], adapter_name=names[0])
        model.set_adapter(names[0])
        model.delete_adapter("default")  # (loaded under peft's default name; the members are named member-<k>)
        for name, path in zip(names[1:], paths[1:]):
            model.load_adapter(path, adapter_name=name)
        model.to(reward_model.device).eval()
        return cls(reward_model, names, min_votes)

    @classmethod
    def from_critic_kwargs(cls, path: str | None = None, paths: Sequence[str] | None = None,
                           min_votes: int | None = None, **kwargs: Any):
        """The critic ``reward_model_ensemble``: ``path`` (an ensemble directory with ``member-<k>/``) or ``paths``.

        LoRA members share one base model (this class); members trained without LoRA load as separate models.
        """
        if not paths and not path:
            raise ValueError("critic 'reward_model_ensemble' needs path (a directory trained with --ensemble_size K) "
                             "or paths (the member reward models)")
        members = list(paths) if paths else member_paths(path)
        if all(_adapter_base(p) for p in members):
            return cls.from_pretrained(members, min_votes=min_votes, **kwargs)
        logger.warning("ensemble members %s are not all LoRA adapters: loading %d separate reward models (%d copies "
                       "of the base weights in memory)", members, len(members), len(members))
        return EnsembleCritic([GenerativeRewardModel.from_pretrained(p, **kwargs) for p in members], min_votes=min_votes)

    def member_feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[list[Feedback]]:
        """(K lists of B feedbacks): each member's feedback, with its adapter active."""
        out = []
        for name in self.adapters:
            self.model.set_adapter(name)
            out.append(self.reward_model.feedback(prompts, responses))
        return out

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[EnsembleFeedback]:
        per_member = self.member_feedback(prompts, responses)
        return [consensus_feedback(column, self.min_votes) for column in zip(*per_member)]
