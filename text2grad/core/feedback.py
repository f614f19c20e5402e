"""The feedback record every phase speaks, and a parser for what critics actually write.

A critic (an LLM annotator, the generative reward model, a unit-test runner or a human) produces a
`Feedback`: a free-text critique plus exact quotes from the response marked good or poor. The canonical
text form, written by `format_feedback` and learned by the reward model, is the critique followed by a
JSON object on its own line::

    The summary omits that the author is a first-time novelist.
    {"good_spans": ["200 page unpublished novel"], "poor_spans": ["finding a good editor"]}

`parse_feedback` accepts far more than that canonical form, because LLMs drift: JSON inside prose or
```json fences, ``//`` and ``/* */`` comments, trailing commas, single quotes, Python literals, keys in other spellings (``Good spans``,
``goodSpans``, ``positive_spans``), the paper code's ``word_score_list`` form, and output truncated
mid-JSON. It never raises; on failure it returns a `ParseResult` whose ``error`` says what was wrong.

The protocol a critic implements (`FeedbackSource`) and the registry of critics live in
`text2grad.core.critics`.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Feedback",
    "ParseResult",
    "format_feedback",
    "parse_feedback",
]


@dataclass(frozen=True)
class Feedback:
    """One critique of one response.

    Attributes:
        critique: the free-text critique (may be empty).
        good_spans: quotes from the response that the critic praises (label +1).
        poor_spans: quotes from the response that the critic faults (label -1).
        raw: the text the critic wrote, kept for inspection and debugging.
        error: why this feedback is empty, when the critic failed (unparseable output, API error, ...).
            A failed feedback has no spans and therefore gives zero reward; callers count these.
    """

    critique: str = ""
    good_spans: tuple[str, ...] = ()
    poor_spans: tuple[str, ...] = ()
    raw: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failed(cls, error: str, raw: str = "") -> "Feedback":
        """An empty feedback that records why the critic failed."""
        return cls(raw=raw, error=error)

    def to_dict(self) -> dict[str, Any]:
        """The record fields written to annotation JSONL (``critique``, ``good_spans``, ``poor_spans``)."""
        return {"critique": self.critique, "good_spans": list(self.good_spans), "poor_spans": list(self.poor_spans)}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "Feedback":
        """Inverse of `to_dict`; also reads the paper's ``textual_feedback`` key for the critique."""
        critique = record.get("critique", record.get("textual_feedback", "")) or ""
        return cls(
            critique=str(critique),
            good_spans=tuple(str(s) for s in record.get("good_spans", ()) or ()),
            poor_spans=tuple(str(s) for s in record.get("poor_spans", ()) or ()),
        )


@dataclass(frozen=True)
class ParseResult:
    """The outcome of `parse_feedback`: a Feedback, or an error message (never both)."""

    feedback: Feedback
    error: str | None = None
    repaired: bool = False  # the JSON needed repair (trailing commas, quotes, truncation, ...)

    @property
    def ok(self) -> bool:
        return self.error is None


def format_feedback(feedback: Feedback) -> str:
    """Canonical text of a feedback: the critique, a newline, then one line of span JSON.

    This is the target ``z`` the reward model learns and the form `parse_feedback` reads back exactly.
    """
    spans = json.dumps(
        {"good_spans": list(feedback.good_spans), "poor_spans": list(feedback.poor_spans)}, ensure_ascii=False
    )
    critique = " ".join(feedback.critique.split())  # one line, so the JSON is always the last line
    return f"{critique}\n{spans}" if critique else spans


# --------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------

_GOOD_KEYS = {"goodspans", "goodspan", "good", "positivespans", "positive", "positivespan"}
_POOR_KEYS = {"poorspans", "poorspan", "poor", "badspans", "bad", "negativespans", "negative", "negativespan"}
_CRITIQUE_KEYS = {"textualfeedback", "critique", "feedback", "textfeedback", "comment", "explanation"}
_WORD_SCORE_KEYS = {"wordscorelist", "wordscores", "spanscores", "spanscorelist"}
_POSITIVE_LABELS = {"positive", "good", "pos", "+", "+1", "1"}
_NEGATIVE_LABELS = {"negative", "poor", "bad", "neg", "-", "-1"}
_FENCE = re.compile(r"```(?:json|JSON|python)?\s*\n?(.*?)(?:```|$)", re.DOTALL)
_CRITIQUE_PREFIX = re.compile(r"^\s*(?:#+\s*)?(?:\*\*)?\s*(?:critique|feedback|textual feedback)\s*(?:\*\*)?\s*:\s*", re.I)


def _norm_key(key: Any) -> str:
    return re.sub(r"[^a-z]", "", str(key).lower())


def _balanced_objects(text: str) -> list[tuple[int, int]]:
    """Character intervals of top-level ``{...}`` blocks, respecting JSON/Python string quoting.

    An unterminated final block runs to the end of the text (the truncated-output case).
    """
    blocks: list[tuple[int, int]] = []
    depth, start, quote, escaped = 0, -1, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'" and depth > 0:
            # An apostrophe inside a word (don't) is not a quote; only treat ' as a quote after a delimiter.
            if ch == "'" and i > 0 and text[i - 1].isalnum():
                continue
            quote = ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                blocks.append((start, i + 1))
    if depth > 0 and start >= 0:
        blocks.append((start, len(text)))
    return blocks


def _open_brackets(text: str) -> tuple[list[str], int]:
    """Closers still needed for ``text`` and the start of an unterminated string (-1 if none)."""
    stack: list[str] = []
    string_start, escaped = -1, False
    for i, ch in enumerate(text):
        if string_start >= 0:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                string_start = -1
            continue
        if ch == '"':
            string_start = i
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}" and stack:
            stack.pop()
    return stack, string_start


def _close_truncated(candidate: str) -> str:
    """Repair output cut off mid-JSON: drop an unfinished string (a cut quote is not a quote), a dangling
    key or comma, then close the open brackets."""
    stack, string_start = _open_brackets(candidate)
    if not stack and string_start < 0:
        return candidate
    text = candidate[:string_start] if string_start >= 0 else candidate
    while True:
        trimmed = re.sub(r"[,\s]+$", "", text)
        trimmed = re.sub(r'"(?:[^"\\]|\\.)*"\s*:\s*$', "", trimmed)  # a key with no value
        if trimmed == text:
            break
        text = trimmed
    stack, _ = _open_brackets(text)
    return text + "".join(reversed(stack))


_QUOTED_OR_COMMENT = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\\n]|\\.)*'|(//[^\n]*|/\*.*?\*/)""", re.DOTALL)


def _strip_comments(text: str) -> str:
    """Drop ``// line`` and ``/* block */`` comments, which LLMs often put in fenced JSON; ``//`` inside a quoted
    string (a URL quoted in a span) is text and stays."""
    return _QUOTED_OR_COMMENT.sub(lambda m: "" if m.group(1) else m.group(0), text)


def _repairs(candidate: str) -> list[str]:
    """Increasingly aggressive repairs of a JSON-ish object string."""
    fixed = re.sub(r",\s*([\]}])", r"\1", _strip_comments(candidate))  # comments, trailing commas
    out = [candidate, fixed]
    closed = _close_truncated(fixed)
    out.append(re.sub(r",\s*([\]}])", r"\1", closed))
    return out


_QUOTED_OR_JSON_WORD = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\b(null|true|false)\b""")
_PYTHON_WORD = {"null": "None", "true": "True", "false": "False"}


def _json_words_to_python(text: str) -> str:
    """JSON's bare ``null``/``true``/``false`` as Python literals; words inside quoted strings are left alone
    (a quote such as "returns null when true" must survive the Python-literal fallback unchanged)."""
    return _QUOTED_OR_JSON_WORD.sub(lambda m: _PYTHON_WORD[m.group(1)] if m.group(1) else m.group(0), text)


def _load_object(candidate: str) -> tuple[dict | None, bool]:
    """Parse one candidate as JSON, then repaired JSON, then a Python literal. Returns (object, repaired)."""
    for i, text in enumerate(_repairs(candidate)):
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError, ValueError):
            obj = None
            try:  # single quotes, True/False/None, tuples: Python literal syntax
                pyobj = ast.literal_eval(_json_words_to_python(text))
                obj = pyobj if isinstance(pyobj, dict) else None
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                obj = None
        if isinstance(obj, dict):
            strict_json = True
            try:
                json.loads(text)
            except (json.JSONDecodeError, RecursionError, ValueError):
                strict_json = False
            return obj, i > 0 or text != candidate or not strict_json
    return None, False


def _span_list(value: Any, key: str) -> tuple[list[str], str | None]:
    if value is None:
        return [], None
    if isinstance(value, str):
        return ([value] if value.strip() else []), None
    if not isinstance(value, (list, tuple)):
        return [], f"'{key}' must be a list of strings, got {type(value).__name__}"
    spans: list[str] = []
    for item in value:
        if isinstance(item, str):
            if item.strip():
                spans.append(item)
        elif isinstance(item, dict):  # {"span": "...", ...} or {"text": "..."}
            text = next((v for k, v in item.items() if _norm_key(k) in {"span", "text", "quote"}), None)
            if isinstance(text, str) and text.strip():
                spans.append(text)
        elif isinstance(item, (int, float)):
            spans.append(str(item))
        # other item types (nested lists, None) carry no quote and are skipped
    return spans, None


def _word_score_spans(value: Any) -> tuple[list[str], list[str]]:
    """The paper code's form: ``[[text, score], ...]`` or ``[{"word": text, "score": s}, ...]``.

    A positive score or label ("positive", "good") makes a good span, a negative one a poor span;
    zero/neutral items are dropped.
    """
    good, poor = [], []
    if isinstance(value, dict):
        value = list(value.items())
    if not isinstance(value, (list, tuple)):
        return good, poor
    for item in value:
        text, score = None, None
        if isinstance(item, (list, tuple)) and len(item) >= 2:
            text, score = item[0], item[1]
        elif isinstance(item, dict):
            for k, v in item.items():
                nk = _norm_key(k)
                if nk in {"word", "span", "text", "phrase"}:
                    text = v
                elif nk in {"score", "label", "value", "reward"}:
                    score = v
        if not isinstance(text, str) or not text.strip():
            continue
        sign = 0
        if isinstance(score, bool):
            sign = 0
        elif isinstance(score, (int, float)):
            sign = (score > 0) - (score < 0)
        elif isinstance(score, str):
            s = score.strip().lower()
            sign = 1 if s in _POSITIVE_LABELS else -1 if s in _NEGATIVE_LABELS else 0
            if sign == 0:
                try:
                    f = float(s)
                    sign = (f > 0) - (f < 0)
                except ValueError:
                    sign = 0
        if sign > 0:
            good.append(text)
        elif sign < 0:
            poor.append(text)
    return good, poor


def _feedback_from_object(obj: dict, prose: str, raw: str) -> tuple[Feedback | None, str | None]:
    good: list[str] = []
    poor: list[str] = []
    critique: str | None = None
    found_span_key = False
    for key, value in obj.items():
        nk = _norm_key(key)
        if nk in _GOOD_KEYS:
            spans, err = _span_list(value, str(key))
            if err:
                return None, err
            good.extend(spans)
            found_span_key = True
        elif nk in _POOR_KEYS:
            spans, err = _span_list(value, str(key))
            if err:
                return None, err
            poor.extend(spans)
            found_span_key = True
        elif nk in _WORD_SCORE_KEYS:
            g, p = _word_score_spans(value)
            good.extend(g)
            poor.extend(p)
            found_span_key = True
        elif nk in _CRITIQUE_KEYS and isinstance(value, str):
            critique = value
    if not found_span_key:
        return None, "JSON object has no span keys (expected 'good_spans' and 'poor_spans')"
    if critique is None:
        critique = _CRITIQUE_PREFIX.sub("", prose.strip())
    return Feedback(critique=" ".join(critique.split()), good_spans=tuple(good), poor_spans=tuple(poor), raw=raw), None


def parse_feedback(text: Any) -> ParseResult:
    """Parse a critic's output into a `Feedback`. Never raises.

    Looks at ```json fences first, then every balanced ``{...}`` block (the last one that carries span keys
    wins, because chain-of-thought output reasons first and answers last). Text before the JSON is the
    critique unless the JSON has its own critique key (``textual_feedback``, ``critique``, ``feedback``).
    On failure, ``result.error`` says why and ``result.feedback`` is an empty `Feedback.failed`.
    """
    if not isinstance(text, str):
        return ParseResult(Feedback.failed(f"expected a string, got {type(text).__name__}"), "not a string")
    try:
        return _parse(text)
    except Exception as exc:  # defensive: a parser bug must not crash a training loop
        msg = f"parser error: {type(exc).__name__}: {exc}"
        return ParseResult(Feedback.failed(msg, raw=text), msg)


def _parse(text: str) -> ParseResult:
    if not text.strip():
        return ParseResult(Feedback.failed("empty output", raw=text), "empty output")
    candidates: list[tuple[str, str]] = []  # (object text, prose before it)
    for m in _FENCE.finditer(text):
        body = m.group(1)
        for s, e in _balanced_objects(body):
            candidates.append((body[s:e], text[: m.start()]))
    for s, e in _balanced_objects(text):
        candidates.append((text[s:e], text[:s]))
    if not candidates:
        msg = "no JSON object found in the output"
        return ParseResult(Feedback.failed(msg, raw=text), msg)
    result, last_error = _first_feedback(reversed(candidates), text)
    if result is None:
        # A stray "{" in the prose (e.g. a critique saying "the { is never closed") swallows the real JSON into
        # one unbalanced block. Retry from each of the last "{" characters on its own.
        starts = [i for i, ch in enumerate(text) if ch == "{"][-64:]
        restarts = []
        for p in reversed(starts):
            blocks = _balanced_objects(text[p:])
            if blocks and blocks[0][0] == 0:
                restarts.append((text[p : p + blocks[0][1]], text[:p]))
        tried = {c for c, _ in candidates}
        result, _ = _first_feedback((c for c in restarts if c[0] not in tried), text)
    return result or ParseResult(Feedback.failed(last_error, raw=text), last_error)


def _first_feedback(candidates, text: str) -> tuple[ParseResult | None, str]:
    """The first (object text, prose) candidate that parses into a Feedback, and the last error seen."""
    last_error = "no JSON object could be parsed"
    for candidate, prose in candidates:
        obj, repaired = _load_object(candidate)
        if obj is None:
            last_error = f"invalid JSON: {candidate[:80]!r}"
            continue
        feedback, error = _feedback_from_object(obj, _FENCE.sub("", prose), text)
        if feedback is not None:
            return ParseResult(feedback, None, repaired), last_error
        last_error = error or last_error
    return None, last_error
