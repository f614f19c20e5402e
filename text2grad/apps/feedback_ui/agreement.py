"""How much annotators agree on the items two or more of them annotated: token-level F1 of their spans.

Each annotator's spans are painted on the response's characters and mapped to tokens exactly as every critic's
spans are (`text2grad.core.spans.char_labels` then `token_labels`, boundary rule ``any``). The tokens here are
the response's whitespace-separated words, so the number does not depend on a model's tokenizer. For one pair of
annotators and one label (good or poor), with A and B the sets of tokens each gave that label:

    F1 = 2 |A & B| / (|A| + |B|)

(1 when both marked the same tokens, 0 when they share none; undefined when neither marked any). The summary
reports, per label and for both labels together (a token agrees when both gave it the same non-zero label), the
micro average (the sums of 2|A & B| and |A| + |B| over every pair on every shared item) and the macro average
over the pairs where the F1 is defined, overall and per pair of annotators.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from text2grad.core.spans import CharSpan, char_labels, locate_spans, token_labels

__all__ = ["span_f1", "token_labels_of_record", "agreement_summary", "format_agreement", "suggestion_summary",
           "format_suggestions", "attention_summary", "format_attention"]

_WORD = re.compile(r"\S+")
LABELS = {"good": 1, "poor": -1}


def token_labels_of_record(record: Mapping[str, Any]) -> list[int]:
    """One label in {-1, 0, +1} per whitespace word of ``record["response"]``.

    The exact intervals in ``span_offsets`` (feedback-ui and Label Studio records) are used when present;
    otherwise the quotes in ``good_spans``/``poor_spans`` are located as every critic's are (every occurrence).
    """
    response = str(record.get("response", ""))
    if record.get("span_offsets"):
        spans = [CharSpan(int(s["start"]), int(s["end"]), LABELS[s["label"]], s.get("text", ""))
                 for s in record["span_offsets"] if s.get("label") in LABELS]
    else:
        spans = locate_spans(response, record.get("good_spans") or (), record.get("poor_spans") or ()).spans
    offsets = [(m.start(), m.end()) for m in _WORD.finditer(response)]
    return token_labels(response, offsets, char_labels(len(response), spans))


def span_f1(a: Sequence[int], b: Sequence[int], label: int | None) -> tuple[int, int]:
    """(2 |A & B|, |A| + |B|) for the tokens two annotators gave ``label`` (None: any non-zero label, agreeing
    when equal). Returned as the two sums so that pairs can be micro-averaged; F1 is their ratio."""
    if len(a) != len(b):
        raise ValueError(f"token label sequences differ in length ({len(a)} vs {len(b)}): not the same response")
    if label is None:
        marked_a = {i for i, v in enumerate(a) if v != 0}
        marked_b = {i for i, v in enumerate(b) if v != 0}
        both = {i for i in marked_a & marked_b if a[i] == b[i]}
    else:
        marked_a = {i for i, v in enumerate(a) if v == label}
        marked_b = {i for i, v in enumerate(b) if v == label}
        both = marked_a & marked_b
    return 2 * len(both), len(marked_a) + len(marked_b)


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


class _Tally:
    """Micro sums and the per-pair F1 values of one label."""

    def __init__(self) -> None:
        self.numerator = 0
        self.denominator = 0
        self.values: list[float] = []

    def add(self, numerator: int, denominator: int) -> None:
        self.numerator += numerator
        self.denominator += denominator
        if denominator:
            self.values.append(numerator / denominator)

    def to_dict(self) -> dict[str, Any]:
        return {
            "micro_f1": _ratio(self.numerator, self.denominator),
            "macro_f1": sum(self.values) / len(self.values) if self.values else None,
            "pairs_with_marks": len(self.values),
        }


def agreement_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The agreement of every pair of annotators on every item both annotated (see the module doc).

    ``records`` carry ``id``, ``response``, ``annotator`` (or ``source``) and spans; the last record of one
    (item, annotator) counts. Items with one annotator are counted, not scored.
    """
    latest: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for record in records:
        if "id" in record:
            latest[str(record["id"])][str(record.get("annotator") or record.get("source") or "unknown")] = record
    labels = {"good": 1, "poor": -1, "any": None}
    overall = {name: _Tally() for name in labels}
    per_pair: dict[tuple[str, str], dict[str, _Tally]] = {}
    shared = 0
    for item_id, by_annotator in latest.items():
        if len(by_annotator) < 2:
            continue
        shared += 1
        token_sets = {who: token_labels_of_record(rec) for who, rec in by_annotator.items()}
        for first, second in itertools.combinations(sorted(token_sets), 2):
            pair = per_pair.setdefault((first, second), {name: _Tally() for name in labels})
            for name, label in labels.items():
                sums = span_f1(token_sets[first], token_sets[second], label)
                overall[name].add(*sums)
                pair[name].add(*sums)
    return {
        "items": len(latest),
        "shared_items": shared,
        "annotators": sorted({who for by in latest.values() for who in by}),
        "overall": {name: tally.to_dict() for name, tally in overall.items()},
        "pairs": [
            {"annotators": list(pair), **{name: tally.to_dict() for name, tally in tallies.items()}}
            for pair, tallies in sorted(per_pair.items())
        ],
    }


def _fmt(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:.3f}"


def format_agreement(summary: Mapping[str, Any]) -> str:
    """The summary as a few lines of text for the terminal."""
    lines = [
        f"items with records: {summary['items']}; annotated by two or more people: {summary['shared_items']}; "
        f"annotators: {', '.join(summary['annotators']) or '-'}",
    ]
    if not summary["shared_items"]:
        lines.append("no item has two annotators yet: run feedback-ui with --annotations_per_item 2 to collect some")
        return "\n".join(lines)
    lines.append("token-level span F1 (micro / macro over annotator pairs):")
    for name in ("poor", "good", "any"):
        row = summary["overall"][name]
        lines.append(f"  {name:>4}: {_fmt(row['micro_f1'])} / {_fmt(row['macro_f1'])}  ({row['pairs_with_marks']} pairs with marks)")
    for pair in summary["pairs"]:
        lines.append(f"  {' vs '.join(pair['annotators'])}: poor {_fmt(pair['poor']['micro_f1'])}, good "
                     f"{_fmt(pair['good']['micro_f1'])}, any {_fmt(pair['any']['micro_f1'])}")
    return "\n".join(lines)


def suggestion_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How people treated the suggestions of each critic (records with ``suggestion`` and ``changes``).

    Per critic: the records, the spans suggested, kept (same interval and label), removed and added, and

        kept rate  = kept / suggested         (how much of what the critic marks people accept: its precision)
        recall     = kept / (kept + added)    (how much of what people mark the critic had found)
        edited     = records whose critique was changed / records
    """
    tallies: dict[str, dict[str, int]] = defaultdict(lambda: {"records": 0, "suggested": 0, "kept": 0, "removed": 0,
                                                              "added": 0, "critique_edited": 0})
    for record in records:
        suggestion, changes = record.get("suggestion"), record.get("changes")
        if not isinstance(suggestion, Mapping) or not isinstance(changes, Mapping):
            continue
        tally = tallies[str(suggestion.get("critic") or "unknown")]
        tally["records"] += 1
        tally["suggested"] += len(suggestion.get("spans") or ())
        for key in ("kept", "removed", "added"):
            tally[key] += int(changes.get(key, 0))
        tally["critique_edited"] += int(bool(changes.get("critique_edited")))
    return {
        critic: {**t, "kept_rate": _ratio(t["kept"], t["suggested"]), "recall": _ratio(t["kept"], t["kept"] + t["added"]),
                 "edited_rate": _ratio(t["critique_edited"], t["records"])}
        for critic, t in sorted(tallies.items())
    }


def format_suggestions(summary: Mapping[str, Any]) -> str:
    """The suggestion summary as lines of text ("" when no record came from a suggestion)."""
    if not summary:
        return ""
    lines = ["suggested critiques, per critic (kept rate = kept / suggested spans; recall = kept / (kept + added)):"]
    for critic, t in summary.items():
        lines.append(f"  {critic}: {t['records']} records, {t['suggested']} spans suggested: {t['kept']} kept, "
                     f"{t['removed']} removed, {t['added']} added; kept rate {_fmt(t['kept_rate'])}, recall "
                     f"{_fmt(t['recall'])}; critique edited in {t['critique_edited']} of {t['records']}")
    return "\n".join(lines)


def attention_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Each annotator's score on attention-check items: input records with ``attention_check: true`` whose own
    ``good_spans``/``poor_spans`` (or ``span_offsets``) are the known answer (kept in the record's ``meta``).

    The score of one check is the token-level F1 of both labels together (`span_f1` with ``label=None``) between
    the person's marks and the answer; per annotator: the checks done, their mean and lowest score. A check where
    neither side marked anything scores 1 (nothing to find, nothing marked).
    """
    scores: dict[str, list[float]] = defaultdict(list)
    for record in records:
        meta = record.get("meta") if isinstance(record.get("meta"), Mapping) else {}
        if not meta.get("attention_check") or meta.get("adjudicated_from"):
            continue
        answer = {"response": record.get("response", ""), "span_offsets": meta.get("span_offsets"),
                  "good_spans": meta.get("good_spans") or [], "poor_spans": meta.get("poor_spans") or []}
        numerator, denominator = span_f1(token_labels_of_record(record), token_labels_of_record(answer), None)
        scores[str(record.get("annotator") or record.get("source") or "unknown")].append(
            numerator / denominator if denominator else 1.0)
    return {who: {"checks": len(values), "mean_f1": sum(values) / len(values), "min_f1": min(values)}
            for who, values in sorted(scores.items())}


def format_attention(summary: Mapping[str, Any]) -> str:
    """The attention-check scores as lines of text ("" when no check was annotated)."""
    if not summary:
        return ""
    lines = ["attention checks (token F1 against the known answer):"]
    for who, row in summary.items():
        lines.append(f"  {who}: {row['checks']} checks, mean {_fmt(row['mean_f1'])}, lowest {_fmt(row['min_f1'])}")
    return "\n".join(lines)
