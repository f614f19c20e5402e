"""Marked offsets to annotation records: UTF-16 to code points, exact-text checks, whitespace, overlaps, layout."""

from __future__ import annotations

import pytest

from annotation.critics import CriticResult
from annotation.runner import build_record
from text2grad.apps.feedback_ui.records import (
    MarkedSpan,
    SpanError,
    codepoint_offsets,
    human_record,
    lone_surrogates,
    repair_text,
    spans_from_offsets,
)
from text2grad.core.feedback import Feedback

EMOJI = "\U0001F600"  # one code point, two UTF-16 code units


def test_codepoint_offsets_skip_the_middle_of_a_surrogate_pair():
    assert codepoint_offsets(f"a{EMOJI}b") == {0: 0, 1: 1, 3: 2, 4: 3}
    assert codepoint_offsets("") == {0: 0}


def test_utf16_offsets_after_an_emoji_become_python_offsets():
    response = f"I {EMOJI} Oslo"
    # the browser counts the emoji as 2 units: "Oslo" starts at 5 there, at 4 in Python
    (span,) = spans_from_offsets(response, [{"start": 5, "end": 9, "label": "poor", "text": "Oslo"}])
    assert span == MarkedSpan(4, 8, "poor", "Oslo") and response[4:8] == "Oslo"
    (span,) = spans_from_offsets(response, [{"start": 4, "end": 8, "label": "good"}], unit="codepoint")
    assert span.text == "Oslo"


@pytest.mark.parametrize("span, message", [
    ({"start": 3, "end": 5, "label": "poor"}, "split a character"),  # 3 is inside the emoji's surrogate pair
    ({"start": 0, "end": 99, "label": "poor"}, "outside the response"),
    ({"start": 5, "end": 9, "label": "bad"}, "label must be 'good' or 'poor'"),
    ({"start": True, "end": 9, "label": "poor"}, "must be integers"),
    ({"start": 5, "end": 9, "label": "poor", "text": "Osl0"}, "reload the page"),
    ({"start": 6, "end": 6, "label": "poor"}, "non-empty range"),
])
def test_spans_that_do_not_fit_the_response_are_refused_with_the_reason(span, message):
    with pytest.raises(SpanError, match=message):
        spans_from_offsets(f"I {EMOJI} Oslo", [span])


def test_whitespace_around_a_selection_is_trimmed_and_blank_selections_vanish():
    response = "one  two\nthree"
    spans = spans_from_offsets(response, [{"start": 3, "end": 9, "label": "good"}, {"start": 3, "end": 5, "label": "poor"}],
                               unit="codepoint")
    assert spans == [MarkedSpan(5, 8, "good", "two")]


def test_overlapping_spans_are_refused_unless_allowed():
    marks = [{"start": 0, "end": 7, "label": "good"}, {"start": 4, "end": 11, "label": "poor"}]
    with pytest.raises(SpanError, match="overlap"):
        spans_from_offsets("alpha beta gamma", marks, unit="codepoint")
    kept = spans_from_offsets("alpha beta gamma", marks, unit="codepoint", allow_overlap=True)
    assert [(s.start, s.end, s.label) for s in kept] == [(0, 7, "good"), (4, 10, "poor")]  # trailing space trimmed


def test_a_human_record_has_the_llm_records_keys_plus_who_and_when():
    item = {"id": "x1", "prompt": "Summarize.", "response": "Oslo, then Oslo again.", "meta": {"post_id": 7}}
    spans = spans_from_offsets(item["response"], [{"start": 11, "end": 15, "label": "poor"}], unit="codepoint")
    record = human_record(item, "  The second Oslo is wrong.  ", spans, "alice", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z")
    llm = build_record(item, CriticResult(Feedback("c", (), ("Oslo",)), 0, {"model": "m"}), "llm:m")
    assert set(record) == set(llm) | {"annotator", "started_at", "submitted_at", "span_offsets"}
    assert record["source"] == "human" and record["annotator"] == "alice"
    assert record["critique"] == "The second Oslo is wrong."
    assert record["poor_spans"] == ["Oslo"] and record["good_spans"] == []
    # the quote alone would point at the first Oslo; the offsets keep the one that was marked
    assert record["span_offsets"] == [{"start": 11, "end": 15, "label": "poor", "text": "Oslo"}]
    assert record["meta"]["post_id"] == 7 and record["meta"]["_annotation"]["critic"] == "feedback-ui"
    assert record["meta"]["_annotation"]["annotator"] == "alice"


def test_trimming_uses_the_pages_whitespace_so_a_shown_mark_is_the_stored_mark():
    # JavaScript's \s does not match U+0085 (NEL) or U+001C..U+001F, so the page shows them inside the mark
    response = "x \x85NEL\x1c y"
    (span,) = spans_from_offsets(response, [{"start": 2, "end": 7, "label": "poor"}], unit="codepoint")
    assert span.text == "\x85NEL\x1c"
    (span,) = spans_from_offsets("a\u3000word\u00a0b", [{"start": 1, "end": 7, "label": "good"}], unit="codepoint")
    assert span.text == "word"  # ideographic and no-break spaces are \s in JavaScript too


@pytest.mark.parametrize("response, start, end", [
    ("cafe\u0301 bar", 0, 4),  # "cafe" without the combining acute accent on its e
    ("hi \U0001F44D\U0001F3FD ok", 3, 4),  # a thumbs-up without its skin tone
    ("\U0001F469\u200d\U0001F4BB dev", 0, 1),  # a woman without the rest of "woman technologist"
])
def test_a_span_that_cuts_a_character_cluster_is_refused(response, start, end):
    with pytest.raises(SpanError, match="cut a character in two"):
        spans_from_offsets(response, [{"start": start, "end": end, "label": "poor"}], unit="codepoint")


def test_a_joiner_between_letters_does_not_glue_them():
    (span,) = spans_from_offsets("ab\u200dcd", [{"start": 3, "end": 5, "label": "good"}], unit="codepoint")
    assert span.text == "cd"


def test_unpaired_surrogates_are_counted_and_repaired_everywhere():
    assert lone_surrogates("ok \U0001F600") == 0 and lone_surrogates("cut \ud83d") == 1
    fixed, count = repair_text({"response": "cut \ud83d", "meta": {"k\udc00": ["\ud83d\ud83d"]}, "n": 3})
    assert count == 4 and fixed == {"response": "cut \ufffd", "meta": {"k\ufffd": ["\ufffd\ufffd"]}, "n": 3}
