"""The feedback parser: what LLMs and the reward model actually write."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from text2grad.core.feedback import Feedback, format_feedback, parse_feedback


def test_canonical_round_trip():
    fb = Feedback("Omits the deadline.", ("200 page novel",), ("a good editor", 'said "hi"'))
    parsed = parse_feedback(format_feedback(fb))
    assert parsed.ok and not parsed.repaired
    assert parsed.feedback.critique == fb.critique
    assert parsed.feedback.good_spans == fb.good_spans
    assert parsed.feedback.poor_spans == fb.poor_spans


def test_multiline_critique_is_flattened_so_json_stays_last_line():
    text = format_feedback(Feedback("line one\nline two", ("a",), ()))
    assert text.splitlines()[0] == "line one line two"
    assert json.loads(text.splitlines()[-1]) == {"good_spans": ["a"], "poor_spans": []}


def test_json_inside_prose_and_fences():
    text = (
        "Let me think step by step. The summary is short.\n"
        "Critique: it omits the deadline.\n```json\n"
        '{"good_spans": ["the plan"], "poor_spans": ["next year"]}\n```\nDone.'
    )
    r = parse_feedback(text)
    assert r.ok
    assert r.feedback.good_spans == ("the plan",)
    assert r.feedback.poor_spans == ("next year",)
    assert "omits the deadline" in r.feedback.critique


def test_key_spellings():
    for good_key, poor_key in [("Good spans", "Poor spans"), ("goodSpans", "poorSpans"), ("GOOD_SPANS", "bad_spans"),
                               ("positive_spans", "negative_spans")]:
        r = parse_feedback(json.dumps({good_key: ["x"], poor_key: ["y"]}))
        assert r.ok, (good_key, r.error)
        assert (r.feedback.good_spans, r.feedback.poor_spans) == (("x",), ("y",))


def test_trailing_commas_and_single_quotes_are_repaired():
    r = parse_feedback("{'good_spans': ['a', 'b',], 'poor_spans': ['c',],}")
    assert r.ok and r.repaired
    assert r.feedback.good_spans == ("a", "b") and r.feedback.poor_spans == ("c",)


def test_json_words_inside_quotes_survive_the_python_literal_fallback():
    # single quotes force the Python-literal path, which must turn only *bare* null/true/false into Python
    r = parse_feedback("{'good_spans': ['returns null when true', \"it's false\"], 'poor_spans': [], 'done': true, 'x': null}")
    assert r.ok and r.repaired
    assert r.feedback.good_spans == ("returns null when true", "it's false")


def test_apostrophes_in_double_quoted_spans_survive():
    r = parse_feedback('{"good_spans": ["don\'t stop"], "poor_spans": ["it\'s late"]}')
    assert r.ok
    assert r.feedback.good_spans == ("don't stop",) and r.feedback.poor_spans == ("it's late",)


def test_textual_feedback_key_is_the_critique():
    r = parse_feedback('Reasoning first. {"textual_feedback": "Too vague.", "good_spans": [], "poor_spans": ["stuff"]}')
    assert r.feedback.critique == "Too vague."
    assert r.feedback.poor_spans == ("stuff",)


def test_word_score_list_form():
    text = json.dumps({"textual_feedback": "ok", "word_score_list": [["great start", 1], ["wrong city", -1],
                                                                   ["filler", 0], ["nice", "positive"],
                                                                   {"word": "bad end", "score": "negative"}]})
    r = parse_feedback(text)
    assert r.ok
    assert r.feedback.good_spans == ("great start", "nice")
    assert r.feedback.poor_spans == ("wrong city", "bad end")


def test_missing_keys_is_an_error():
    r = parse_feedback('{"critique": "fine"}')
    assert not r.ok and "span keys" in r.error
    assert r.feedback.error == r.error and r.feedback.good_spans == ()


def test_one_missing_span_key_means_empty_list():
    r = parse_feedback('{"good_spans": ["a"]}')
    assert r.ok and r.feedback.poor_spans == ()


def test_non_string_items():
    r = parse_feedback('{"good_spans": ["a", 3, null, ["nested"], {"span": "quoted"}], "poor_spans": "single"}')
    assert r.ok
    assert r.feedback.good_spans == ("a", "3", "quoted")
    assert r.feedback.poor_spans == ("single",)


def test_span_value_of_wrong_type_is_a_precise_error():
    r = parse_feedback('{"good_spans": 12, "poor_spans": []}')
    assert not r.ok and "'good_spans' must be a list" in r.error


def test_truncated_output_keeps_complete_quotes_only():
    r = parse_feedback('Critique: bad.\n{"good_spans": ["alpha", "beta"], "poor_spans": ["gam')
    assert r.ok and r.repaired
    assert r.feedback.good_spans == ("alpha", "beta")
    assert r.feedback.poor_spans == ()  # "gam" was cut off mid-quote: not a quote


def test_truncated_after_key():
    r = parse_feedback('{"good_spans": ["alpha"], "poor_spans":')
    assert r.ok and r.feedback.good_spans == ("alpha",) and r.feedback.poor_spans == ()


def test_last_object_with_span_keys_wins():
    text = 'Example format: {"good_spans": ["EXAMPLE"], "poor_spans": []}\nAnswer: {"good_spans": ["real"], "poor_spans": []}'
    assert parse_feedback(text).feedback.good_spans == ("real",)


def test_no_json_and_empty_and_non_string():
    assert parse_feedback("I think it is fine.").error == "no JSON object found in the output"
    assert parse_feedback("").error == "empty output"
    assert not parse_feedback(None).ok  # type: ignore[arg-type]


def test_from_dict_and_to_dict():
    fb = Feedback.from_dict({"textual_feedback": "c", "good_spans": ["g"], "poor_spans": None})
    assert fb.to_dict() == {"critique": "c", "good_spans": ["g"], "poor_spans": []}


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text):
    r = parse_feedback(text)
    assert r.ok == (r.error is None)
    assert isinstance(r.feedback, Feedback)


json_fragments = st.lists(
    st.sampled_from(['{', '}', '[', ']', '"', "'", ',', ':', 'good_spans', 'poor_spans', 'x', ' ', '\\', '```json\n', 'null']),
    max_size=40,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(json_fragments)
def test_never_raises_on_json_like_garbage(text):
    r = parse_feedback(text)
    assert r.ok == (r.error is None)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1), st.lists(st.text(min_size=1).filter(str.strip), max_size=3),
       st.lists(st.text(min_size=1).filter(str.strip), max_size=3))
def test_round_trip_property(critique, good, poor):
    fb = Feedback(critique, tuple(good), tuple(poor))
    r = parse_feedback(format_feedback(fb))
    assert r.ok
    assert r.feedback.good_spans == fb.good_spans and r.feedback.poor_spans == fb.poor_spans


def test_stray_brace_in_the_critique_does_not_hide_the_json():
    text = format_feedback(Feedback("The { is never closed.", ("def f():",), ("return {",)))
    r = parse_feedback(text)
    assert r.ok, r.error
    assert r.feedback.good_spans == ("def f():",) and r.feedback.poor_spans == ("return {",)
    assert r.feedback.critique == "The { is never closed."
