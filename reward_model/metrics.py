"""Feedback metrics: how well one critic's spans agree with another's (the paper's Table 1 and Appendix C).

A prediction (e.g. the reward model's feedback) is compared with a reference (e.g. the annotator's) on
the same response, at three levels:

- **tokens**: both feedbacks are turned into +1 / -1 / 0 token labels by the *same* core path
  (`text2grad.core.spans.feedback_token_labels`) over the *same* tokenization of the response, then
  precision, recall and F1 are computed per class (positive, negative, neutral) from counts summed over
  every token of every example (micro-averaged; long responses weigh more, as in the paper).
- **spans**: located character intervals are matched within the same label. A reference span is an
  *exact* match if a predicted span has the identical interval, a *partial* match if it has no exact
  match but overlaps a predicted span by at least one character (Appendix C, "GT / Pred (Exact - Partial)").
- **output health**: the JSON-validity rate (the critic's output parsed into a feedback at all) and the
  unmatched-span rate (quotes that are not in the response, so they carry no reward).

A prediction that failed to parse has no spans: every token is neutral, so failures cost recall on the
positive and negative classes instead of being skipped. Division by zero (e.g. precision of a class that
was never predicted) gives ``zero_division`` (0.0 by default, like scikit-learn); the raw counts are kept
next to every score so a reader can tell "0 because wrong" from "0 because empty".
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from text2grad.core.feedback import Feedback, ParseResult, parse_feedback
from text2grad.core.spans import (
    Boundary,
    CharSpan,
    Occurrence,
    Overlap,
    SpanAlignment,
    feedback_token_labels,
    interval_token_labels,
    token_offsets,
)

__all__ = [
    "CLASSES",
    "ClassScores",
    "SpanMatchCounts",
    "ValidityCounts",
    "ExampleComparison",
    "FeedbackMetrics",
    "confusion_matrix",
    "class_scores",
    "span_match_counts",
    "unmatched_span_rate",
    "json_validity",
    "compare_feedback",
    "aggregate",
    "evaluate_feedback",
    "format_markdown",
]

# Label value -> name, in the order used by `confusion_matrix` rows and columns.
CLASSES: dict[int, str] = {1: "positive", -1: "negative", 0: "neutral"}
_ORDER = tuple(CLASSES)  # (1, -1, 0)


# --------------------------------------------------------------------------------------------------
# Token-level precision / recall / F1
# --------------------------------------------------------------------------------------------------


def confusion_matrix(predicted: Sequence[int], reference: Sequence[int]) -> np.ndarray:
    """Counts of (reference label, predicted label) pairs over aligned tokens.

    Args:
        predicted, reference: labels in {+1, -1, 0}, one per token, same length N.

    Returns:
        int64 array of shape (3, 3); row = reference class, column = predicted class, both in the
        order of `CLASSES` (+1, -1, 0). The entries sum to N.
    """
    if len(predicted) != len(reference):
        raise ValueError(
            f"predicted and reference labels must cover the same tokens, got {len(predicted)} and {len(reference)}; "
            "label both feedbacks with the same tokenizer over the same response text"
        )
    pred = np.asarray(predicted, dtype=np.int64).reshape(-1)
    ref = np.asarray(reference, dtype=np.int64).reshape(-1)
    bad = set(np.unique(np.concatenate([pred, ref])).tolist()) - set(_ORDER)
    if bad:
        raise ValueError(f"token labels must be +1, -1 or 0, got {sorted(bad)}")
    # Map labels to their index in _ORDER (+1 -> 0, -1 -> 1, 0 -> 2), then count pairs with one bincount.
    r, p = (np.where(x == 1, 0, np.where(x == -1, 1, 2)) for x in (ref, pred))
    return np.bincount(r * 3 + p, minlength=9).reshape(3, 3).astype(np.int64)


@dataclass(frozen=True)
class ClassScores:
    """Precision, recall and F1 of one class, with the counts they come from.

    ``support`` = reference tokens of the class (tp + fn); ``predicted`` = predicted tokens of the
    class (tp + fp).
    """

    label: int
    precision: float
    recall: float
    f1: float
    tp: int
    support: int
    predicted: int


def _ratio(num: float, den: float, zero_division: float) -> float:
    return float(num) / float(den) if den > 0 else float(zero_division)


def class_scores(confusion: np.ndarray, zero_division: float = 0.0) -> dict[str, ClassScores]:
    """Per-class precision / recall / F1 from a (3, 3) confusion matrix (rows reference, columns predicted).

    Returns ``{"positive": ..., "negative": ..., "neutral": ...}``. F1 is the harmonic mean of precision
    and recall, and ``zero_division`` when both are 0.
    """
    confusion = np.asarray(confusion)
    if confusion.shape != (3, 3):
        raise ValueError(f"confusion must have shape (3, 3), got {confusion.shape}")
    out: dict[str, ClassScores] = {}
    for i, label in enumerate(_ORDER):
        tp = int(confusion[i, i])
        support = int(confusion[i, :].sum())
        predicted = int(confusion[:, i].sum())
        precision = _ratio(tp, predicted, zero_division)
        recall = _ratio(tp, support, zero_division)
        f1 = _ratio(2 * precision * recall, precision + recall, zero_division)
        out[CLASSES[label]] = ClassScores(label, precision, recall, f1, tp, support, predicted)
    return out


# --------------------------------------------------------------------------------------------------
# Span matching
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpanMatchCounts:
    """Span-level agreement (Appendix C's "GT / Pred (Exact - Partial)").

    Attributes:
        n_reference: located reference spans ("GT").
        n_predicted: located predicted spans ("Pred").
        exact: reference spans with a predicted span of the same label and the identical interval.
        partial: reference spans with no exact match but a same-label predicted span overlapping it.
        predicted_overlapping: predicted spans that overlap (or equal) some same-label reference span;
            ``predicted_overlapping / n_predicted`` is a span-level precision.
    """

    n_reference: int = 0
    n_predicted: int = 0
    exact: int = 0
    partial: int = 0
    predicted_overlapping: int = 0

    def __add__(self, other: "SpanMatchCounts") -> "SpanMatchCounts":
        return SpanMatchCounts(*(a + b for a, b in zip(astuple(self), astuple(other))))

    @property
    def exact_rate(self) -> float:
        """Share of reference spans matched exactly (0.0 when there are none)."""
        return _ratio(self.exact, self.n_reference, 0.0)

    @property
    def match_rate(self) -> float:
        """Share of reference spans matched exactly or partially: span-level recall."""
        return _ratio(self.exact + self.partial, self.n_reference, 0.0)

    @property
    def predicted_precision(self) -> float:
        """Share of predicted spans that overlap a same-label reference span."""
        return _ratio(self.predicted_overlapping, self.n_predicted, 0.0)


def _overlaps(a: CharSpan, b: CharSpan) -> bool:
    return a.start < b.end and b.start < a.end


def _dedupe(spans: Iterable[CharSpan]) -> list[CharSpan]:
    """One span per (start, end, label): the same quote listed twice is one span of the response."""
    seen: dict[tuple[int, int, int], CharSpan] = {}
    for s in spans:
        seen.setdefault((s.start, s.end, s.label), s)
    return list(seen.values())


def span_match_counts(predicted: Sequence[CharSpan], reference: Sequence[CharSpan]) -> SpanMatchCounts:
    """Match located spans of one response by label and character interval (see `SpanMatchCounts`).

    Spans with the same interval and label are counted once on each side.
    """
    pred, ref = _dedupe(predicted), _dedupe(reference)
    exact = partial = 0
    for r in ref:
        same_label = [p for p in pred if p.label == r.label]
        if any(p.start == r.start and p.end == r.end for p in same_label):
            exact += 1
        elif any(_overlaps(p, r) for p in same_label):
            partial += 1
    overlapping = sum(1 for p in pred if any(p.label == r.label and _overlaps(p, r) for r in ref))
    return SpanMatchCounts(len(ref), len(pred), exact, partial, overlapping)


def unmatched_span_rate(alignments: Sequence[SpanAlignment]) -> float:
    """Unmatched quotes / all quotes over many responses (paper Table 15). 0.0 when there are no quotes."""
    unmatched = sum(a.n_unmatched for a in alignments)
    total = sum(a.n_quotes for a in alignments)
    return _ratio(unmatched, total, 0.0)


# --------------------------------------------------------------------------------------------------
# JSON validity
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidityCounts:
    """How many critic outputs parsed into a feedback (``valid``), and how many of those needed repair."""

    total: int = 0
    valid: int = 0
    repaired: int = 0

    @property
    def rate(self) -> float:
        """JSON-validity rate: valid / total (0.0 for no outputs)."""
        return _ratio(self.valid, self.total, 0.0)

    @property
    def strict_rate(self) -> float:
        """Outputs that parsed without any repair (truncation, trailing commas, quotes) / total."""
        return _ratio(self.valid - self.repaired, self.total, 0.0)


def json_validity(outputs: Sequence[Feedback | ParseResult | str]) -> ValidityCounts:
    """Count parseable critic outputs.

    Accepts raw output strings (parsed here), `ParseResult` objects, or `Feedback` objects (valid when
    ``error is None``; whether it was repaired is read by re-parsing ``raw`` when there is one).
    """
    valid = repaired = 0
    for item in outputs:
        if isinstance(item, str):
            item = parse_feedback(item)
        if isinstance(item, ParseResult):
            ok, fixed = item.ok, item.repaired
        elif isinstance(item, Feedback):
            ok = item.ok
            fixed = bool(item.raw) and ok and parse_feedback(item.raw).repaired
        else:
            raise TypeError(f"expected Feedback, ParseResult or str, got {type(item).__name__}")
        valid += int(ok)
        repaired += int(ok and fixed)
    return ValidityCounts(len(outputs), valid, repaired)


# --------------------------------------------------------------------------------------------------
# One example, many examples
# --------------------------------------------------------------------------------------------------


@dataclass
class ExampleComparison:
    """A prediction compared with a reference on one response."""

    predicted_labels: list[int]
    reference_labels: list[int]
    confusion: np.ndarray  # (3, 3), rows reference, columns predicted
    spans: SpanMatchCounts
    predicted_alignment: SpanAlignment
    reference_alignment: SpanAlignment
    predicted_ok: bool

    def to_dict(self) -> dict[str, Any]:
        """Per-example summary for prediction dumps (JSON-serializable)."""
        return {
            "predicted_ok": self.predicted_ok,
            "n_tokens": len(self.reference_labels),
            "confusion": self.confusion.tolist(),
            "spans": asdict(self.spans),
            "predicted_unmatched": [q for q, _ in self.predicted_alignment.unmatched],
            "reference_unmatched": [q for q, _ in self.reference_alignment.unmatched],
        }


def compare_feedback(
    predicted: Feedback,
    reference: Feedback,
    response: str,
    tokenizer=None,
    *,
    offsets: Sequence[tuple[int, int]] | None = None,
    occurrence: Occurrence = "all",
    overlap: Overlap = "poor",
    boundary: Boundary = "any",
    reference_spans: Sequence[CharSpan] | None = None,
) -> ExampleComparison:
    """Compare two feedbacks on one response.

    Both sides are labelled by `feedback_token_labels` over the same token offsets: pass ``tokenizer``
    (offsets come from `token_offsets`) or precomputed ``offsets`` of the response. ``occurrence``,
    ``overlap`` and ``boundary`` are the core's span-to-token rules and apply to both sides alike.
    ``reference_spans``: the reference's exact character intervals when it has them (a person's marks,
    ``span_offsets``); they replace its located quotes, so marking the second of two equal passages labels only
    that one.
    """
    if offsets is None:
        if tokenizer is None:
            raise ValueError("compare_feedback needs a tokenizer or the response's token offsets")
        _, offsets = token_offsets(tokenizer, response)
    rules = dict(occurrence=occurrence, overlap=overlap, boundary=boundary)
    pred = feedback_token_labels(predicted, response, offsets, **rules)
    if reference_spans is None:
        ref = feedback_token_labels(reference, response, offsets, **rules)
    else:
        ref = interval_token_labels(reference_spans, response, offsets, overlap=overlap, boundary=boundary)
    return ExampleComparison(
        predicted_labels=pred.labels,
        reference_labels=ref.labels,
        confusion=confusion_matrix(pred.labels, ref.labels),
        spans=span_match_counts(pred.alignment.spans, ref.alignment.spans),
        predicted_alignment=pred.alignment,
        reference_alignment=ref.alignment,
        predicted_ok=predicted.ok,
    )


@dataclass
class FeedbackMetrics:
    """Corpus-level feedback metrics (what `reward_model.evaluate` reports)."""

    n_examples: int
    tokens: dict[str, ClassScores]
    confusion: np.ndarray
    spans: SpanMatchCounts
    validity: ValidityCounts
    predicted_unmatched_span_rate: float
    reference_unmatched_span_rate: float
    label_accuracy: float  # share of tokens whose predicted label equals the reference label
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_examples": self.n_examples,
            "json_validity_rate": self.validity.rate,
            "json_strict_validity_rate": self.validity.strict_rate,
            "json_validity": asdict(self.validity),
            "unmatched_span_rate": self.predicted_unmatched_span_rate,
            "reference_unmatched_span_rate": self.reference_unmatched_span_rate,
            "token_label_accuracy": self.label_accuracy,
            "token": {name: asdict(s) for name, s in self.tokens.items()},
            "token_confusion": {
                "order": [CLASSES[k] for k in _ORDER],
                "rows": "reference",
                "columns": "predicted",
                "counts": self.confusion.tolist(),
            },
            "spans": {
                **asdict(self.spans),
                "exact_rate": self.spans.exact_rate,
                "match_rate": self.spans.match_rate,
                "predicted_precision": self.spans.predicted_precision,
            },
            **self.extra,
        }


def aggregate(
    comparisons: Sequence[ExampleComparison],
    validity: ValidityCounts | None = None,
    zero_division: float = 0.0,
) -> FeedbackMetrics:
    """Sum per-example counts into corpus metrics. ``validity`` defaults to counting ``predicted_ok``."""
    confusion = np.zeros((3, 3), dtype=np.int64)
    spans = SpanMatchCounts()
    for c in comparisons:
        confusion += c.confusion
        spans = spans + c.spans
    if validity is None:
        ok = sum(int(c.predicted_ok) for c in comparisons)
        validity = ValidityCounts(len(comparisons), ok, 0)
    total_tokens = int(confusion.sum())
    return FeedbackMetrics(
        n_examples=len(comparisons),
        tokens=class_scores(confusion, zero_division),
        confusion=confusion,
        spans=spans,
        validity=validity,
        predicted_unmatched_span_rate=unmatched_span_rate([c.predicted_alignment for c in comparisons]),
        reference_unmatched_span_rate=unmatched_span_rate([c.reference_alignment for c in comparisons]),
        label_accuracy=_ratio(int(np.trace(confusion)), total_tokens, zero_division),
    )


def evaluate_feedback(
    predictions: Sequence[Feedback],
    references: Sequence[Feedback],
    responses: Sequence[str],
    tokenizer,
    *,
    occurrence: Occurrence = "all",
    overlap: Overlap = "poor",
    boundary: Boundary = "any",
    zero_division: float = 0.0,
    reference_spans: Sequence[Sequence[CharSpan] | None] | None = None,
) -> tuple[FeedbackMetrics, list[ExampleComparison]]:
    """All metrics for aligned lists of predicted feedback, reference feedback and responses.

    ``reference_spans``: per example, the reference's exact character intervals or None (`compare_feedback`).
    Returns the corpus metrics and the per-example comparisons (for prediction dumps).
    """
    if not (len(predictions) == len(references) == len(responses)):
        raise ValueError(
            f"need one prediction and one reference per response, got {len(predictions)} predictions, "
            f"{len(references)} references and {len(responses)} responses"
        )
    exact = list(reference_spans) if reference_spans is not None else [None] * len(responses)
    if len(exact) != len(responses):
        raise ValueError(f"reference_spans has {len(exact)} entries for {len(responses)} responses")
    comparisons = [
        compare_feedback(p, r, text, tokenizer, occurrence=occurrence, overlap=overlap, boundary=boundary,
                         reference_spans=spans)
        for p, r, text, spans in zip(predictions, references, responses, exact)
    ]
    return aggregate(comparisons, json_validity(predictions), zero_division), comparisons


def format_markdown(metrics: FeedbackMetrics | dict[str, Any], title: str = "Feedback metrics") -> str:
    """A Markdown report of `FeedbackMetrics` (or of its ``to_dict()``)."""
    d = metrics.to_dict() if isinstance(metrics, FeedbackMetrics) else metrics
    v, s = d["json_validity"], d["spans"]
    lines = [
        f"## {title}",
        "",
        f"- Examples: {d['n_examples']}",
        f"- JSON-validity rate: {d['json_validity_rate']:.2%} ({v['valid']}/{v['total']}; "
        f"{v['repaired']} needed repair, strict rate {d['json_strict_validity_rate']:.2%})",
        f"- Unmatched-span rate (predicted quotes not found in the response): {d['unmatched_span_rate']:.2%}",
        f"- Unmatched-span rate of the references: {d['reference_unmatched_span_rate']:.2%}",
        f"- Token label accuracy: {d['token_label_accuracy']:.2%}",
        "",
        "### Token-level precision / recall / F1",
        "",
        "| class | precision | recall | F1 | reference tokens | predicted tokens |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, c in d["token"].items():
        lines.append(
            f"| {name} | {c['precision']:.3f} | {c['recall']:.3f} | {c['f1']:.3f} | {c['support']} | {c['predicted']} |"
        )
    lines += [
        "",
        "### Span matches (reference spans found in the prediction)",
        "",
        "| GT spans | predicted spans | exact | partial | exact rate | exact+partial rate | predicted spans overlapping GT |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {s['n_reference']} | {s['n_predicted']} | {s['exact']} | {s['partial']} | {s['exact_rate']:.2%} | "
        f"{s['match_rate']:.2%} | {s['predicted_overlapping']} ({s['predicted_precision']:.2%}) |",
        "",
    ]
    return "\n".join(lines)
