"""Human feedback as annotation records: marked character intervals in, the annotate command's record out.

The page sends what the person selected as character offsets into the response, in the browser's own unit
(JavaScript counts UTF-16 code units; Python indexes code points, so an emoji before a span shifts every later
offset by one). `spans_from_offsets` converts, checks that each interval quotes the response exactly, trims
surrounding whitespace (the span-to-token mapping ignores it anyway) and refuses overlaps. `human_record` then
writes the record exactly as `annotation.runner.build_record` writes an LLM's (same keys, same span grounding
through `text2grad.core.spans.locate_spans`), with ``source: "human"``, the annotator, timestamps, and the
exact intervals under ``span_offsets`` (a quote alone cannot say which of two identical passages was meant).
"""

from __future__ import annotations

import re
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from annotation.critics import CriticResult
from annotation.runner import build_record
from text2grad.core.feedback import Feedback
from text2grad.core.spans import locate_spans

__all__ = [
    "HUMAN_SOURCE",
    "JS_SPACE",
    "REVEALED_CHARACTERS",
    "lone_surrogates",
    "repair_text",
    "splits_cluster",
    "MarkedSpan",
    "OffsetUnit",
    "SpanError",
    "codepoint_offsets",
    "human_record",
    "span_changes",
    "suggestion_of",
    "spans_from_offsets",
    "utc_now",
]

HUMAN_SOURCE = "human"
Label = Literal["good", "poor"]
OffsetUnit = Literal["utf16", "codepoint"]


# What JavaScript's ``\\s`` matches: the page trims a selection by it, so the server must trim by exactly the same set
# (``str.isspace`` also takes U+001C-U+001F and U+0085, which the page shows inside a mark).
JS_SPACE = frozenset(
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
# Characters that change how text reads without showing themselves: bidi embeddings, overrides and isolates,
# zero-width spaces, the soft hyphen (not the joiners, which hold emoji and scripts together). The page shows each one as a visible tag.
REVEALED_CHARACTERS = frozenset(
    "\u00ad\u061c\u200b\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062"
    "\u2063\u2064\u2066\u2067\u2068\u2069\ufeff"
)
_SURROGATE = re.compile("[\ud800-\udfff]")
_ZWJ = "\u200d"


def lone_surrogates(text: str) -> int:
    """How many unpaired UTF-16 surrogates ``text`` holds (valid JSON such as ``"\\ud83d"``: an emoji cut in half).

    Python keeps them in a ``str``, but they cannot be written as UTF-8, so such text must be repaired or refused
    before it reaches a record or a response.
    """
    return len(_SURROGATE.findall(text))


def repair_text(value: Any) -> tuple[Any, int]:
    """``value`` (text, or lists/objects of it) with every unpaired surrogate replaced by U+FFFD, and how many were
    replaced."""
    if isinstance(value, str):
        count = lone_surrogates(value)
        return (_SURROGATE.sub("\ufffd", value) if count else value), count
    if isinstance(value, list):
        pairs = [repair_text(v) for v in value]
        return [v for v, _ in pairs], sum(n for _, n in pairs)
    if isinstance(value, dict):
        out, total = {}, 0
        for key, inner in value.items():
            fixed_key, n_key = repair_text(key) if isinstance(key, str) else (key, 0)
            fixed, n = repair_text(inner)
            out[fixed_key] = fixed
            total += n_key + n
        return out, total
    return value, 0


def splits_cluster(text: str, offset: int) -> bool:
    """True when ``offset`` (code points) falls inside a user-perceived character: before a combining mark, a
    variation selector, an emoji skin-tone modifier or a zero-width joiner, or between a joiner and the emoji it
    joins."""
    if not 0 < offset < len(text):
        return False
    after, before = text[offset], text[offset - 1]
    return (
        unicodedata.combining(after) != 0
        or unicodedata.category(after) == "Me"
        or "\ufe00" <= after <= "\ufe0f"
        or "\U0001f3fb" <= after <= "\U0001f3ff"
        or after == _ZWJ
        or (before == _ZWJ and _pictographic(after))  # a joined emoji (a ZWJ between letters joins nothing)
    )


def _pictographic(char: str) -> bool:
    """Roughly Unicode's Extended_Pictographic: the emoji blocks and the older symbol blocks emoji come from."""
    return ord(char) >= 0x1F000 or 0x2600 <= ord(char) <= 0x27BF


class SpanError(ValueError):
    """A marked span does not fit the response (out of range, splits a character, overlaps another, ...)."""


@dataclass(frozen=True)
class MarkedSpan:
    """``response[start:end]`` (code point offsets) marked ``label`` by a person; ``text`` is that slice."""

    start: int
    end: int
    label: Label
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "label": self.label, "text": self.text}


def utc_now() -> str:
    """The current time as an ISO 8601 UTC timestamp, to the second (the records' timestamp format)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def codepoint_offsets(text: str) -> dict[int, int]:
    """``{UTF-16 offset: code point offset}`` for every character boundary of ``text`` (both ends included).

    An offset that falls between the two halves of a surrogate pair is not a boundary and is absent.
    """
    table, units = {0: 0}, 0
    for index, char in enumerate(text, 1):
        units += 2 if ord(char) > 0xFFFF else 1
        table[units] = index
    return table


def spans_from_offsets(
    response: str,
    spans: Sequence[Mapping[str, Any]],
    unit: OffsetUnit = "utf16",
    allow_overlap: bool = False,
    check_clusters: bool = True,
) -> list[MarkedSpan]:
    """Turn ``[{"start", "end", "label", "text"?}, ...]`` into checked `MarkedSpan` s, sorted by position.

    Args:
        response: the text the spans index into.
        spans: offsets in ``unit`` (``utf16``: as JavaScript counts; ``codepoint``: as Python indexes); ``label``
            is ``good`` or ``poor``; an optional ``text`` must equal the slice (a check that the page showed the
            same response the server holds).
        unit: the unit of ``start`` and ``end``.
        allow_overlap: keep overlapping spans (the span-to-token mapping then lets poor win, as for any critic)
            instead of refusing them.
        check_clusters: refuse an offset inside a user-perceived character (`splits_cluster`). Whitespace is
            trimmed by JavaScript's ``\\s`` (`JS_SPACE`), as the page trims.

    Raises:
        SpanError: an offset out of range or inside a character, a label other than good/poor, a ``text`` that
            differs from the slice, an offset that cuts a character cluster, or (unless ``allow_overlap``) two
            spans that overlap: each character gets one judgement.
    """
    table = codepoint_offsets(response) if unit == "utf16" else None
    out: list[MarkedSpan] = []
    for n, span in enumerate(spans, 1):
        label = span.get("label")
        if label not in ("good", "poor"):
            raise SpanError(f"span {n}: label must be 'good' or 'poor', got {label!r}")
        start, end = span.get("start"), span.get("end")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            raise SpanError(f"span {n}: start and end must be integers, got {start!r} and {end!r}")
        if table is not None:
            if start not in table or end not in table:
                raise SpanError(f"span {n}: offsets {start}-{end} are outside the response or split a character")
            start, end = table[start], table[end]
        if not 0 <= start < end <= len(response):
            raise SpanError(f"span {n}: offsets {start}-{end} are not a non-empty range inside the response "
                            f"({len(response)} characters)")
        if "text" in span and span["text"] is not None and span["text"] != response[start:end]:
            raise SpanError(f"span {n}: the text {span['text']!r} is not the response's text at {start}-{end} "
                            f"({response[start:end]!r}); reload the page")
        if check_clusters and (splits_cluster(response, start) or splits_cluster(response, end)):
            raise SpanError(f"span {n}: offsets {start}-{end} cut a character in two (a letter and its accent, or "
                            "the parts of one emoji); select whole characters")
        while start < end and response[start] in JS_SPACE:
            start += 1
        while end > start and response[end - 1] in JS_SPACE:
            end -= 1
        if start < end:
            out.append(MarkedSpan(start, end, label, response[start:end]))
    out.sort(key=lambda s: (s.start, s.end))
    for before, after in zip(out, out[1:]):
        if after.start < before.end and not allow_overlap:
            raise SpanError(f"spans {before.text!r} ({before.label}) and {after.text!r} ({after.label}) overlap; "
                            "remove one of them")
    return out


def human_record(
    item: Mapping[str, Any],
    critique: str,
    spans: Sequence[MarkedSpan],
    annotator: str,
    started_at: str,
    submitted_at: str,
    via: str = "feedback-ui",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The annotation record of one person's feedback on ``item`` (a mapped input record: id, prompt, response, meta).

    The keys and span grounding are `annotation.runner.build_record`'s; added: ``annotator``, ``started_at``,
    ``submitted_at`` and ``span_offsets`` (the exact intervals, in code points). ``via`` names the tool in
    ``meta._annotation``.
    """
    feedback = Feedback(
        critique=critique.strip(),
        good_spans=tuple(s.text for s in spans if s.label == "good"),
        poor_spans=tuple(s.text for s in spans if s.label == "poor"),
    )
    info = {"critic": via, "annotator": annotator, **(extra or {})}
    record = build_record(item, CriticResult(feedback, 0, info), HUMAN_SOURCE)
    record["annotator"] = annotator
    record["started_at"] = started_at
    record["submitted_at"] = submitted_at
    record["span_offsets"] = [s.to_dict() for s in spans]
    return record


def _critic_of(item: Mapping[str, Any]) -> str:
    """Who wrote an input record's critique: its source (``llm:<model>``, ``oracle``, ...), else the critic named in
    its ``meta._annotation``, else ``unknown``; a person's record is ``human:<annotator>``."""
    source = item.get("source")
    if source == HUMAN_SOURCE and item.get("annotator"):
        return f"human:{item['annotator']}"
    if isinstance(source, str) and source:
        return source
    meta = item.get("meta") if isinstance(item.get("meta"), Mapping) else {}
    inner = meta.get("meta") if isinstance(meta.get("meta"), Mapping) else meta
    annotation = inner.get("_annotation") if isinstance(inner.get("_annotation"), Mapping) else {}
    return str(annotation.get("critic") or annotation.get("model") or "unknown")


def suggestion_of(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """The critique and spans an input record already carries (an annotate record, the reward model's critique of a
    policy sample, another person's record), to be shown as an editable draft; None when it carries neither.

    Returns ``{"critic", "critique", "spans": [{"start", "end", "label", "text"}]}`` with code point offsets: the
    record's exact ``span_offsets`` when it has valid ones, else every place its quotes occur (as training reads
    them); a span overlapping an earlier one is left out (the page keeps one judgement per character). An
    attention-check item (``attention_check: true``) suggests nothing: its spans are the answer.
    """
    if item.get("attention_check"):
        return None  # its spans are the known answer the person is scored against, not a hint
    critique = item.get("critique")
    good, poor = item.get("good_spans"), item.get("poor_spans")
    if not isinstance(critique, str) and not isinstance(good, list) and not isinstance(poor, list):
        return None
    response = str(item.get("response", ""))
    spans: list[MarkedSpan] = []
    if item.get("span_offsets"):
        try:
            spans = spans_from_offsets(response, item["span_offsets"], unit="codepoint", allow_overlap=True,
                                       check_clusters=False)
        except (SpanError, AttributeError, TypeError):
            spans = []
    if not spans:
        quotes = [str(q) for q in good or () if isinstance(q, str)], [str(q) for q in poor or () if isinstance(q, str)]
        located = locate_spans(response, quotes[0], quotes[1]).spans
        spans = [MarkedSpan(s.start, s.end, "good" if s.label > 0 else "poor", response[s.start:s.end]) for s in located]
    kept: list[MarkedSpan] = []
    for span in sorted(spans, key=lambda s: (s.start, s.end)):
        if not kept or span.start >= kept[-1].end:
            kept.append(span)
    if not isinstance(critique, str) and not kept:
        return None
    return {"critic": _critic_of(item), "critique": critique if isinstance(critique, str) else "",
            "spans": [s.to_dict() for s in kept]}


def span_changes(suggested: Sequence[Mapping[str, Any]], final: Sequence[MarkedSpan], suggested_critique: str,
                 critique: str) -> dict[str, Any]:
    """What a person changed in a suggestion: spans kept (same interval and label), removed and added, and whether
    the critique was edited (compared with surrounding whitespace ignored)."""
    before = {(int(s["start"]), int(s["end"]), str(s["label"])) for s in suggested}
    after = {(s.start, s.end, s.label) for s in final}
    return {
        "kept": len(before & after),
        "removed": len(before - after),
        "added": len(after - before),
        "critique_edited": suggested_critique.strip() != critique.strip(),
    }
