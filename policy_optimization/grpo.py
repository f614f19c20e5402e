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
                                   feedback_source=build_feedback_source("reference", records=records))
    trainer.train()
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import torch
from trl import GRPOTrainer

from text2grad.core.rewards import compute_score_rewards, span_sequence_score
from text2grad.core.feedback import Feedback

__all__ = ["Text2GradGRPOTrainer", "token_advantages"]


def token_advantages(sequence_advantages: torch.Tensor, span_rewards: torch.Tensor, mask: torch.Tensor, span_coef: float) -> torch.Tensor:
    """(B,) group advantages + span_coef * (B, T) span rewards -> (B, T) advantages, 0 on padding."""
    return (sequence_advantages.unsqueeze(1) + span_coef * span_rewards) * mask


class Text2GradGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose advantages are (B, T): the group-relative sequence advantage plus span rewards.

    Extra keyword arguments (all others go to `GRPOTrainer`):
        feedback_source: a `FeedbackSource`; it sees the prompt and the decoded completion.
        span_coef: weight of the span rewards in the token advantages.
        reward_scheme, boundary, overlap, occurrence: span-to-token rules (as in `PPOConfig`).
    """

    def __init__(
        self,
        *args: Any,
        feedback_source,
        span_coef: float = 1.0,
        reward_scheme: Literal["uniform", "linear_decay"] = "uniform",
        boundary: Literal["any", "majority", "all"] = "any",
        overlap: Literal["poor", "good"] = "poor",
        occurrence: Literal["all", "first"] = "all",
        **kwargs: Any,
    ) -> None:
        if not callable(getattr(feedback_source, "feedback", None)):
            raise TypeError("feedback_source must have a feedback(prompts, responses) method")
        self.feedback_source = feedback_source
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
                got = list(self.feedback_source.feedback([texts[i] for i in todo], [completions[i] for i in todo]))
            except Exception as exc:  # a broken source costs zero reward, not the run
                got = [Feedback.failed(f"feedback source raised {type(exc).__name__}: {exc}")] * len(todo)
            if len(got) != len(todo):
                raise TypeError(f"the feedback source returned {len(got)} feedbacks for {len(todo)} completions")
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
