"""From quoted spans to token labels: the span-to-token core shared by every phase.

Three steps, each a pure function:

1. `locate_spans` finds each quoted span in the response as a character interval. Exact match first;
   failing that, a match after Unicode/whitespace normalization (NFKC with combining marks composed,
   curly quotes and dashes folded, zero-width characters dropped, whitespace runs collapsed, case folded)
   whose offsets are mapped back to the original text.
   Quotes that cannot be found are returned in ``unmatched``, never silently dropped.
2. `char_labels` paints the response characters +1 (good), -1 (poor) or 0. Where a good and a poor
   span overlap, **poor wins** by default (a flaw inside praised text is still a flaw); pass
   ``overlap="good"`` for the opposite.
3. `token_labels` maps character labels to tokens through offsets (from the tokenizer's offset mapping,
   or from `decode_with_offsets` for token ids the policy generated; `sequence_token_labels` does this for a
   response embedded in a chat-templated sequence). **Boundary rule** (``boundary=``):
   only non-whitespace characters count, so a leading-space token such as ``" word"`` is judged by
   ``word``. ``"any"`` (default) labels a token if any of its characters is labelled, ``"majority"`` if more
   than half are, ``"all"`` only if all are. A token whose characters carry both labels takes the overlap
   winner.

Repeated quotes: ``occurrence="all"`` (default) labels every place the quote occurs, because the quote
alone cannot say which occurrence the critic meant and identical text usually carries the same fault or
merit; ``"first"`` labels only the first occurrence.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from text2grad.core.feedback import Feedback
from text2grad.core.reward_options import BOUNDARIES, OCCURRENCES, OVERLAPS, Boundary, Occurrence, Overlap

__all__ = [
    "CharSpan",
    "SpanAlignment",
    "locate_spans",
    "char_labels",
    "token_labels",
    "token_offsets",
    "decode_with_offsets",
    "feedback_token_labels",
    "interval_token_labels",
    "sequence_token_labels",
]


GOOD, POOR, NEUTRAL = 1, -1, 0


@dataclass(frozen=True)
class CharSpan:
    """A located quote: characters ``response[start:end]`` carry ``label`` (+1 good, -1 poor)."""

    start: int
    end: int
    label: int
    quote: str
    normalized: bool = False  # found only after normalization


@dataclass
class SpanAlignment:
    """Where a feedback's quotes sit in the response, and which quotes were not found."""

    spans: list[CharSpan] = field(default_factory=list)
    unmatched: list[tuple[str, int]] = field(default_factory=list)  # (quote, label)

    @property
    def n_quotes(self) -> int:
        matched_quotes = {(s.quote, s.label) for s in self.spans}
        return len(matched_quotes) + len(self.unmatched)

    @property
    def n_unmatched(self) -> int:
        return len(self.unmatched)


# --------------------------------------------------------------------------------------------------
# 1. Quotes to character intervals
# --------------------------------------------------------------------------------------------------

_FOLD = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"',
        "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2212": "-",
        "\u2026": "...",
    }
)


@functools.lru_cache(maxsize=8192)
def _fold(chars: str) -> str:
    """One character (with its combining marks) as matching sees it; invisible format characters (zero-width
    space and joiners, soft hyphen, BOM: category Cf) vanish. Cached: responses reuse a small alphabet."""
    if unicodedata.category(chars[0]) == "Cf":
        return ""
    return unicodedata.normalize("NFKC", chars).translate(_FOLD).casefold()


def _char_groups(text: str) -> list[tuple[int, int]]:
    """(start, end) of each base character with the combining marks that follow it, so that NFKC can compose
    a decomposed ``e`` + U+0301 into the same ``é`` a quote may hold precomposed."""
    groups: list[tuple[int, int]] = []
    for i, ch in enumerate(text):
        if groups and unicodedata.combining(ch) and groups[-1][1] == i:
            groups[-1] = (groups[-1][0], i + 1)
        else:
            groups.append((i, i + 1))
    return groups


def _normalize_with_bounds(text: str) -> tuple[str, list[int], list[int]]:
    """`normalize_with_map`, plus the source end (exclusive) of each normalized character."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    # ASCII has no combining marks, format characters or NFKC/fold changes beyond lower case: one char per group
    groups = ((i, i + 1) for i in range(len(text))) if text.isascii() else _char_groups(text)
    for g_start, g_end in groups:
        group = text[g_start:g_end]
        for folded in " " if group.isspace() else _fold(group):
            if folded.isspace():
                if not out or out[-1] == " ":
                    continue
                folded = " "
            out.append(folded)
            starts.append(g_start)
            ends.append(g_end)
    if out and out[-1] == " ":
        out.pop()
        starts.pop()
        ends.pop()
    return "".join(out), starts, ends


def normalize_with_map(text: str) -> tuple[str, list[int]]:
    """Normalize ``text`` for fuzzy-free matching and map each normalized character to its source index.

    NFKC over each character with its combining marks (so composed and decomposed accents agree), curly
    quotes/dashes folded to ASCII, case folded, invisible format characters (zero-width space and joiners,
    soft hyphen, BOM) dropped, whitespace runs collapsed to one space and leading/trailing whitespace dropped.
    Returns (normalized text, source index of each normalized char).
    """
    norm, starts, _ = _normalize_with_bounds(text)
    return norm, starts


def _find_all(haystack: str, needle: str, first_only: bool) -> list[int]:
    starts, pos = [], haystack.find(needle)
    while pos >= 0:
        starts.append(pos)
        if first_only:
            break
        pos = haystack.find(needle, pos + max(len(needle), 1))  # non-overlapping occurrences
    return starts


def locate_spans(
    response: str,
    good_spans: Sequence[str] = (),
    poor_spans: Sequence[str] = (),
    occurrence: Occurrence = "all",
) -> SpanAlignment:
    """Find each quote in ``response`` as character intervals.

    Args:
        response: the text the critic saw.
        good_spans / poor_spans: quotes labelled +1 / -1.
        occurrence: "all" labels every occurrence of a repeated quote, "first" only the first.

    Returns:
        A `SpanAlignment` with one `CharSpan` per located occurrence, in the order quotes were given,
        and the quotes that were found neither exactly nor after normalization.
    """
    if occurrence not in OCCURRENCES:
        raise ValueError(f"occurrence must be one of {', '.join(OCCURRENCES)}, got {occurrence!r}")
    alignment = SpanAlignment()
    norm_response: tuple[str, list[int], list[int]] | None = None  # computed lazily: exact matches are the common case
    for quotes, label in ((good_spans, GOOD), (poor_spans, POOR)):
        for quote in quotes:
            stripped = quote.strip() if isinstance(quote, str) else ""
            if not stripped:
                alignment.unmatched.append((quote if isinstance(quote, str) else str(quote), label))
                continue
            starts = _find_all(response, stripped, occurrence == "first")
            if starts:
                alignment.spans.extend(CharSpan(s, s + len(stripped), label, quote) for s in starts)
                continue
            if norm_response is None:
                norm_response = _normalize_with_bounds(response)
            norm_text, source_starts, source_ends = norm_response
            norm_quote, _ = normalize_with_map(stripped)
            starts = _find_all(norm_text, norm_quote, occurrence == "first") if norm_quote else []
            if not starts:
                alignment.unmatched.append((quote, label))
                continue
            for s in starts:
                e = s + len(norm_quote) - 1
                alignment.spans.append(CharSpan(source_starts[s], source_ends[e], label, quote, normalized=True))
    return alignment


# --------------------------------------------------------------------------------------------------
# 2. Character labels
# --------------------------------------------------------------------------------------------------


def char_labels(length: int, spans: Sequence[CharSpan], overlap: Overlap = "poor") -> np.ndarray:
    """Label each of ``length`` characters with +1, -1 or 0.

    Returns an int8 array of shape (length,). Overlapping good and poor spans resolve to the
    ``overlap`` winner ("poor" by default).
    """
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}")
    labels = np.zeros(length, dtype=np.int8)
    winner = POOR if overlap == "poor" else GOOD
    # Paint the loser first so the winner overwrites it.
    for span in sorted(spans, key=lambda s: s.label == winner):
        labels[max(span.start, 0) : min(span.end, length)] = span.label
    return labels


# --------------------------------------------------------------------------------------------------
# 3. Characters to tokens
# --------------------------------------------------------------------------------------------------


def token_labels(
    text: str,
    offsets: Sequence[tuple[int, int]],
    labels: np.ndarray,
    boundary: Boundary = "any",
    overlap: Overlap = "poor",
) -> list[int]:
    """Label tokens from character labels.

    Args:
        text: the response text the offsets index into.
        offsets: (start, end) character interval of each token; (s, s) for special/empty tokens.
        labels: per-character labels from `char_labels`, shape (len(text),).
        boundary: "any" | "majority" | "all" (see the module docstring).
        overlap: which label wins inside a token that touches both.

    Returns:
        One label in {-1, 0, +1} per token (length ``len(offsets)``).
    """
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}, got {boundary!r}")
    winner = POOR if overlap == "poor" else GOOD
    n = len(text)
    if len(offsets) == 0:
        return []
    visible = np.fromiter((not c.isspace() for c in text), dtype=bool, count=n)
    labels = np.asarray(labels)[:n]
    # Prefix sums turn "how many labelled visible characters in [start, end)" into two lookups per token.
    csum = lambda mask: np.concatenate(([0], np.cumsum(mask, dtype=np.int64)))  # noqa: E731
    n_vis, n_good, n_poor = csum(visible), csum(visible & (labels == GOOD)), csum(visible & (labels == POOR))
    bounds = np.clip(np.asarray(offsets, dtype=np.int64).reshape(-1, 2), 0, n)
    s, e = bounds[:, 0], np.maximum(bounds[:, 1], bounds[:, 0])
    vis, good, poor = n_vis[e] - n_vis[s], n_good[e] - n_good[s], n_poor[e] - n_poor[s]
    labelled = good + poor
    if boundary == "all":
        keep = (labelled == vis) & (vis > 0)
    elif boundary == "majority":
        keep = labelled * 2 > vis
    else:
        keep = labelled > 0
    out = np.where(good > 0, GOOD, NEUTRAL)
    out = np.where(poor > 0, POOR, out)
    out = np.where((good > 0) & (poor > 0), winner, out)
    return np.where(keep, out, NEUTRAL).astype(int).tolist()


def token_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Tokenize ``text`` (no special tokens) and return (token ids, character offsets).

    Needs a fast (Rust) Hugging Face tokenizer, which every modern model ships.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; offsets need one "
            "(load it with AutoTokenizer.from_pretrained(..., use_fast=True))."
        )
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def decode_with_offsets(tokenizer, token_ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decode generated token ids and give each token its character interval in the decoded text.

    This is how rewards reach the exact ids the policy sampled (which need not be the ids that
    re-tokenizing the text would give). Special tokens (EOS, padding) are skipped in the text and get an
    empty interval. Fast path: if re-encoding the text reproduces the ids, use the tokenizer's offset
    mapping; otherwise decode prefix by prefix. A token that is only part of a multi-byte character
    shares the interval of the token that completes it.

    Returns:
        (text, offsets) with ``len(offsets) == len(token_ids)``.
    """
    ids = [int(t) for t in token_ids]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    content = [i for i in ids if i not in special]
    content_offsets: list[tuple[int, int]] | None = None
    if getattr(tokenizer, "is_fast", False) and content:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == content:
            content_offsets = [tuple(o) for o in enc["offset_mapping"]]
    if content_offsets is None:
        content_offsets = _prefix_decode_offsets(tokenizer, content, text)
    # Special tokens sit between content tokens with an empty interval at the current position.
    offsets, it, last = [], iter(content_offsets), 0
    for i in ids:
        if i in special:
            offsets.append((last, last))
        else:
            s, e = next(it)
            offsets.append((s, e))
            last = e
    return text, offsets


def _prefix_decode_offsets(tokenizer, content: list[int], text: str) -> list[tuple[int, int]]:
    """Character intervals of ``content`` tokens from decoding growing prefixes (works for any ids)."""
    bounds, prev = [0], 0
    for k in range(1, len(content) + 1):
        prefix = tokenizer.decode(content[:k], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        # An incomplete UTF-8 sequence decodes to U+FFFD: the boundary has not advanced yet.
        prev = max(len(prefix) if text.startswith(prefix) else prev, prev)
        bounds.append(prev)
    offsets = [(bounds[k], bounds[k + 1]) for k in range(len(content))]
    for k in range(len(offsets) - 2, -1, -1):  # byte fragments take the completing token's characters
        s, e = offsets[k]
        if s == e and offsets[k + 1][0] == s:
            offsets[k] = offsets[k + 1]
    return offsets


@dataclass
class TokenLabelResult:
    """Token labels for one response plus what could not be aligned."""

    labels: list[int]
    alignment: SpanAlignment
    text: str


def feedback_token_labels(
    feedback: Feedback,
    text: str,
    offsets: Sequence[tuple[int, int]],
    *,
    occurrence: Occurrence = "all",
    overlap: Overlap = "poor",
    boundary: Boundary = "any",
) -> TokenLabelResult:
    """The whole core path for one response: locate quotes, paint characters, label tokens."""
    alignment = locate_spans(text, feedback.good_spans, feedback.poor_spans, occurrence)
    chars = char_labels(len(text), alignment.spans, overlap)
    return TokenLabelResult(token_labels(text, offsets, chars, boundary, overlap), alignment, text)


def interval_token_labels(
    spans: Sequence[CharSpan],
    text: str,
    offsets: Sequence[tuple[int, int]],
    *,
    overlap: Overlap = "poor",
    boundary: Boundary = "any",
) -> TokenLabelResult:
    """`feedback_token_labels` for spans already located as character intervals (e.g. a person's exact marks,
    which say which occurrence of a repeated quote was meant): paint characters, label tokens."""
    chars = char_labels(len(text), spans, overlap)
    return TokenLabelResult(token_labels(text, offsets, chars, boundary, overlap), SpanAlignment(list(spans)), text)


def sequence_token_labels(
    tokenizer,
    sequence_ids: Sequence[int],
    response_start: int,
    feedback: Feedback,
    *,
    response_end: int | None = None,
    occurrence: Occurrence = "all",
    overlap: Overlap = "poor",
    boundary: Boundary = "any",
) -> TokenLabelResult:
    """Token labels over a whole chat-templated sequence whose tokens ``[response_start, response_end)`` are
    the response (``response_end`` defaults to the end; pass it when the template appends text after the
    response, e.g. an end-of-turn marker and a newline).

    The response is aligned on exactly the given ids (`decode_with_offsets`), so the caller can pass the
    sequence the policy was trained on. ``labels`` has one entry per token of ``sequence_ids``: 0 for the
    prompt and the template's tokens, +1/-1/0 inside the response. ``text`` is the decoded response.
    """
    ids = [int(t) for t in sequence_ids]
    end = len(ids) if response_end is None else response_end
    if not 0 <= response_start <= end <= len(ids):
        raise ValueError(
            f"response tokens [{response_start}, {end}) do not lie inside a sequence of {len(ids)} tokens; "
            "response_start is the number of prompt (template) tokens before the response"
        )
    text, offsets = decode_with_offsets(tokenizer, ids[response_start:end])
    inner = feedback_token_labels(feedback, text, offsets, occurrence=occurrence, overlap=overlap, boundary=boundary)
    labels = [NEUTRAL] * response_start + inner.labels + [NEUTRAL] * (len(ids) - end)
    return TokenLabelResult(labels, inner.alignment, text)
