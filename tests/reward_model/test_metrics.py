"""Feedback metrics against hand-computed values, plus properties that must hold for any labels/spans."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from text2grad.core.feedback import Feedback, parse_feedback
from reward_model.metrics import (
    ClassScores,
    SpanMatchCounts,
    ValidityCounts,
    aggregate,
    class_scores,
    compare_feedback,
    confusion_matrix,
    evaluate_feedback,
    format_markdown,
    json_validity,
    span_match_counts,
    unmatched_span_rate,
)
from text2grad.core.spans import CharSpan, locate_spans, token_offsets

# --------------------------------------------------------------------------------------------------
# Token-level P/R/F1, hand-computed
# --------------------------------------------------------------------------------------------------

PRED = [1, 1, 0, -1, 0, 0]
REF = [1, 0, 0, -1, -1, 0]


def test_confusion_matrix_by_hand():
    # rows = reference (+1, -1, 0), columns = predicted (+1, -1, 0)
    expected = np.array([[1, 0, 0], [0, 1, 1], [1, 0, 2]])
    np.testing.assert_array_equal(confusion_matrix(PRED, REF), expected)


def test_class_scores_by_hand():
    scores = class_scores(confusion_matrix(PRED, REF))
    assert scores["positive"] == ClassScores(1, 0.5, 1.0, pytest.approx(2 / 3), 1, 1, 2)
    assert scores["negative"] == ClassScores(-1, 1.0, 0.5, pytest.approx(2 / 3), 1, 2, 1)
    neutral = scores["neutral"]
    assert (neutral.tp, neutral.support, neutral.predicted) == (2, 3, 3)
    assert neutral.precision == pytest.approx(2 / 3) and neutral.recall == pytest.approx(2 / 3)


def test_zero_division_is_configurable_and_counts_stay_visible():
    scores = class_scores(confusion_matrix([0, 0], [1, 0]))
    assert scores["positive"].precision == 0.0 and scores["positive"].predicted == 0
    assert scores["negative"].f1 == 0.0 and scores["negative"].support == 0
    ones = class_scores(confusion_matrix([0, 0], [1, 0]), zero_division=1.0)
    assert ones["positive"].precision == 1.0 and ones["positive"].recall == 0.0
    assert ones["positive"].f1 == 0.0  # harmonic mean of 1 and 0


def test_confusion_matrix_rejects_mismatched_or_bad_labels():
    with pytest.raises(ValueError, match="same tokens"):
        confusion_matrix([1, 0], [1])
    with pytest.raises(ValueError, match="must be \\+1, -1 or 0"):
        confusion_matrix([2, 0], [1, 0])
    np.testing.assert_array_equal(confusion_matrix([], []), np.zeros((3, 3)))


# --------------------------------------------------------------------------------------------------
# Span matching, hand-computed
# --------------------------------------------------------------------------------------------------


def _s(start, end, label):
    return CharSpan(start, end, label, f"q{start}")


def test_span_match_counts_by_hand():
    ref = [_s(0, 7, 1), _s(10, 15, -1), _s(20, 25, -1)]
    pred = [
        _s(0, 7, 1),  # exact
        _s(12, 18, -1),  # partial with (10, 15, -1)
        _s(20, 25, 1),  # same interval, other label: no match
        _s(30, 35, -1),  # nowhere
    ]
    counts = span_match_counts(pred, ref)
    assert counts == SpanMatchCounts(n_reference=3, n_predicted=4, exact=1, partial=1, predicted_overlapping=2)
    assert counts.exact_rate == pytest.approx(1 / 3)
    assert counts.match_rate == pytest.approx(2 / 3)
    assert counts.predicted_precision == pytest.approx(0.5)


def test_touching_spans_do_not_overlap_and_duplicates_count_once():
    assert span_match_counts([_s(5, 10, 1)], [_s(0, 5, 1)]).partial == 0
    counts = span_match_counts([_s(0, 5, 1), _s(0, 5, 1)], [_s(0, 5, 1), _s(0, 5, 1)])
    assert (counts.n_reference, counts.n_predicted, counts.exact) == (1, 1, 1)


def test_span_counts_add():
    a = SpanMatchCounts(3, 4, 1, 1, 2)
    b = SpanMatchCounts(1, 0, 0, 0, 0)
    assert a + b == SpanMatchCounts(4, 4, 1, 1, 2)


def test_unmatched_span_rate_by_hand():
    a = locate_spans("apples and pears", good_spans=["apples", "kiwis"], poor_spans=["pears"])
    b = locate_spans("nothing quoted here")
    assert unmatched_span_rate([a, b]) == pytest.approx(1 / 3)
    assert unmatched_span_rate([b]) == 0.0


# --------------------------------------------------------------------------------------------------
# JSON validity
# --------------------------------------------------------------------------------------------------


def test_json_validity_counts_strings_parse_results_and_feedback():
    outputs = [
        'Fine.\n{"good_spans": ["a"], "poor_spans": []}',
        'Meh.\n{"good_spans": ["a"], "poor_spans": [],}',  # trailing comma: valid after repair
        "no json at all",
    ]
    counts = json_validity(outputs)
    assert counts == ValidityCounts(total=3, valid=2, repaired=1)
    assert counts.rate == pytest.approx(2 / 3) and counts.strict_rate == pytest.approx(1 / 3)
    as_feedback = [parse_feedback(o).feedback for o in outputs]
    assert json_validity(as_feedback) == counts
    assert json_validity([parse_feedback(o) for o in outputs]) == counts
    assert json_validity([]).rate == 0.0
    with pytest.raises(TypeError, match="expected Feedback"):
        json_validity([42])  # type: ignore[list-item]


# --------------------------------------------------------------------------------------------------
# End to end with a real tokenizer
# --------------------------------------------------------------------------------------------------

RESPONSE = "The author wrote a 200 page unpublished novel and is looking for a good editor."


def test_compare_feedback_with_tokenizer(any_tokenizer):
    ref = Feedback("ok", good_spans=("200 page unpublished novel",))
    pred = Feedback("ok", good_spans=("200 page unpublished novel",), poor_spans=("good editor",))
    cmp = compare_feedback(pred, ref, RESPONSE, any_tokenizer)
    ids, _ = token_offsets(any_tokenizer, RESPONSE)
    assert len(cmp.predicted_labels) == len(cmp.reference_labels) == len(ids)
    metrics = aggregate([cmp])
    pos, neg = metrics.tokens["positive"], metrics.tokens["negative"]
    assert pos.precision == 1.0 and pos.recall == 1.0 and pos.support > 0
    assert neg.support == 0 and neg.predicted > 0 and neg.precision == 0.0
    assert metrics.spans.exact == 1 and metrics.spans.n_predicted == 2
    # every token is either correct or a neutral token predicted negative
    assert metrics.label_accuracy == pytest.approx(1 - neg.predicted / len(ids))


def test_failed_prediction_counts_as_all_neutral_and_invalid(bpe_tokenizer):
    ref = Feedback("ok", good_spans=("unpublished novel",), poor_spans=("good editor",))
    good_pred = ref
    failed = Feedback.failed("no JSON object found in the output", raw="blah")
    unmatched = Feedback("x", good_spans=("not in the text",), poor_spans=("good editor",))
    metrics, per_example = evaluate_feedback(
        [good_pred, failed, unmatched], [ref, ref, ref], [RESPONSE] * 3, bpe_tokenizer
    )
    assert metrics.validity == ValidityCounts(3, 2, 0)
    assert not per_example[1].predicted_ok and set(per_example[1].predicted_labels) == {0}
    pos = metrics.tokens["positive"]
    # the good span was found in example 0 only, out of three identical references
    assert pos.tp * 3 == pos.support and pos.precision == 1.0
    assert metrics.predicted_unmatched_span_rate == pytest.approx(1 / 4)  # 4 predicted quotes, 1 not found
    assert metrics.reference_unmatched_span_rate == 0.0
    report = metrics.to_dict()
    json.dumps(report)  # serializable
    assert report["json_validity_rate"] == pytest.approx(2 / 3)
    md = format_markdown(metrics)
    assert "| positive |" in md and "66.67%" in md
    with pytest.raises(ValueError, match="one prediction and one reference"):
        evaluate_feedback([ref], [ref, ref], [RESPONSE], bpe_tokenizer)


# --------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------

labels_strategy = st.lists(st.sampled_from([1, -1, 0]), min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_precision_and_recall_swap_when_sides_swap(data):
    ref = data.draw(labels_strategy)
    pred = data.draw(st.lists(st.sampled_from([1, -1, 0]), min_size=len(ref), max_size=len(ref)))
    cm = confusion_matrix(pred, ref)
    assert cm.sum() == len(ref)
    forward, backward = class_scores(cm), class_scores(confusion_matrix(ref, pred))
    for name in forward:
        assert forward[name].precision == pytest.approx(backward[name].recall)
        assert forward[name].recall == pytest.approx(backward[name].precision)
        assert 0.0 <= forward[name].f1 <= 1.0
    identical = class_scores(confusion_matrix(ref, ref))
    for s in identical.values():
        if s.support:
            assert s.precision == s.recall == s.f1 == 1.0


spans_strategy = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 10), st.sampled_from([1, -1])).map(
        lambda t: CharSpan(t[0], t[0] + t[1], t[2], "q")
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(spans_strategy, spans_strategy)
def test_span_match_invariants(pred, ref):
    counts = span_match_counts(pred, ref)
    assert counts.exact + counts.partial <= counts.n_reference
    assert counts.predicted_overlapping <= counts.n_predicted
    assert (counts.exact + counts.partial == 0) == (counts.predicted_overlapping == 0)
    self_match = span_match_counts(ref, ref)
    assert self_match.exact == self_match.n_reference and self_match.partial == 0


def test_reference_intervals_label_only_the_marked_occurrence():
    response = "Oslo is far. Oslo is cold."
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", response)]
    second = response.rindex("Oslo")
    predicted = Feedback("c", (), ("Oslo",))  # the critic quotes "Oslo": both places
    reference = Feedback("c", (), ("Oslo",))
    by_quote = compare_feedback(predicted, reference, response, offsets=words)
    exact = compare_feedback(predicted, reference, response, offsets=words,
                             reference_spans=[CharSpan(second, second + 4, -1, "Oslo")])
    assert by_quote.reference_labels == [-1, 0, 0, -1, 0, 0]
    assert exact.reference_labels == [0, 0, 0, -1, 0, 0]
    assert exact.predicted_labels == [-1, 0, 0, -1, 0, 0]  # one false positive now counts against the critic
