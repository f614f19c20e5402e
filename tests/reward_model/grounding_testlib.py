"""A constraint for testing grounded span decoding on a model that was not trained to write span JSON: the first
tokens are forced to open a span list, then the reward model's grounded constraint
(`reward_model.decoding.grounded_request_constraint`) takes over. The same function constrains a transformers
row (`RowConstraints`) and a vLLM request (loaded by name in the engine's process), so both backends can be compared
token for token."""

from __future__ import annotations

from typing import Callable

import torch

from reward_model.decoding import grounded_request_constraint

SPAN_LIST_OPENING = '{"poor_spans": ["'


def forced_span_list(tokenizer, source: str) -> Callable[[list[int], torch.Tensor], torch.Tensor]:
    """Force `SPAN_LIST_OPENING`, then quote only from ``source``."""
    opening = tokenizer(SPAN_LIST_OPENING, add_special_tokens=False)["input_ids"]
    grounded = grounded_request_constraint(tokenizer, source)

    def constrain(generated_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if len(generated_ids) < len(opening):
            forced = torch.full_like(logits, float("-inf"))
            forced[opening[len(generated_ids)]] = 0.0
            return forced
        return grounded(generated_ids, logits)

    return constrain


class RowConstraints:
    """A transformers logits processor applying one per-row constraint (``constrain(generated_ids, logits)``) to each
    row of a batch whose new tokens start at column ``prompt_width``."""

    def __init__(self, constraints: list[Callable[[list[int], torch.Tensor], torch.Tensor]], prompt_width: int):
        self.constraints, self.width = constraints, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for row, constrain in enumerate(self.constraints):
            scores[row] = constrain(input_ids[row, self.width :].tolist(), scores[row])
        return scores
