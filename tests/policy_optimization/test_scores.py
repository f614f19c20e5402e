"""Task score functions for the scalar/score_spread/mixed reward modes, loaded by spec."""

from __future__ import annotations

import pytest

from policy_optimization.scores import build_score_fn


def scorer(prompts, responses):
    return [float(len(r)) for r in responses]


class LengthOverReference:
    """A score class: bound to the records, it scores a response by its length relative to the reference."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.references: dict[str, str] = {}

    def bind_records(self, records):
        self.references = {r["prompt"]: r["reference"] for r in records}

    def __call__(self, prompts, responses):
        return [self.scale * len(r) / len(self.references[p]) for p, r in zip(prompts, responses)]


def test_score_functions_and_classes_by_spec():
    fn = build_score_fn(f"{__name__}:scorer")
    assert fn(["p"], ["abc"]) == [3.0]
    scored = build_score_fn(f"{__name__}:LengthOverReference", {"scale": 2.0}, records=[{"prompt": "p", "reference": "abcd"}])
    assert scored(["p"], ["ab"]) == [1.0]
    with pytest.raises(ValueError, match="only apply to classes"):
        build_score_fn(f"{__name__}:scorer", {"scale": 2.0})
    with pytest.raises(ValueError, match="has no attribute"):
        build_score_fn(f"{__name__}:missing")
