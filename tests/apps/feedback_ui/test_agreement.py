"""Agreement between annotators: token-level span F1, checked against hand-computed values."""

from __future__ import annotations

import pytest

from text2grad.apps.feedback_ui.agreement import (
    agreement_summary,
    format_agreement,
    format_suggestions,
    span_f1,
    suggestion_summary,
    token_labels_of_record,
)

RESPONSE = "the cat sat on the mat"  # words 0..5


def _record(annotator, poor=(), good=(), offsets=None, item="x"):
    record = {"id": item, "response": RESPONSE, "annotator": annotator, "poor_spans": list(poor), "good_spans": list(good)}
    if offsets is not None:
        record["span_offsets"] = offsets
    return record


def test_span_f1_by_hand():
    alice = [0, -1, -1, 0, 0, 1]  # poor: cat sat; good: mat
    bob = [0, 0, -1, -1, 0, 0]  # poor: sat on
    assert span_f1(alice, bob, -1) == (2, 4)  # 2*|{sat}| / (2 + 2) = 0.5
    assert span_f1(alice, bob, 1) == (0, 1)  # alice's mat, bob nothing: 0
    assert span_f1(alice, bob, None) == (2, 5)  # same non-zero label: {sat}; 2 / (3 + 2) = 0.4
    assert span_f1([0, 0], [0, 0], -1) == (0, 0)  # nobody marked anything: undefined, no weight
    with pytest.raises(ValueError, match="not the same response"):
        span_f1([0], [0, 0], 1)


def test_token_labels_use_the_exact_offsets_when_a_record_has_them():
    # "the" occurs twice: the quote labels both, the offsets only the one that was marked
    by_quote = token_labels_of_record(_record("a", poor=["the"]))
    by_offsets = token_labels_of_record(_record("a", offsets=[{"start": 15, "end": 18, "label": "poor", "text": "the"}]))
    assert by_quote == [-1, 0, 0, 0, -1, 0]
    assert by_offsets == [0, 0, 0, 0, -1, 0]


def test_summary_micro_and_macro_over_pairs_and_single_items_are_not_scored():
    records = [
        _record("alice", poor=["cat sat"], good=["mat"]),
        _record("bob", poor=["sat on"]),
        _record("carol", poor=["cat sat"], good=["mat"]),
        _record("alice", poor=["cat"], item="only-alice"),
    ]
    summary = agreement_summary(records)
    assert (summary["items"], summary["shared_items"]) == (2, 1)
    assert summary["annotators"] == ["alice", "bob", "carol"]
    # pairs: alice-bob poor (2, 4), alice-carol (4, 4), bob-carol (2, 4) -> micro 8/12, macro (0.5 + 1 + 0.5)/3
    assert summary["overall"]["poor"]["micro_f1"] == pytest.approx(8 / 12)
    assert summary["overall"]["poor"]["macro_f1"] == pytest.approx(2 / 3)
    # good: alice-bob (0, 1), alice-carol (2, 2), bob-carol (0, 1) -> micro 2/4
    assert summary["overall"]["good"]["micro_f1"] == pytest.approx(0.5)
    pairs = {tuple(p["annotators"]): p for p in summary["pairs"]}
    assert pairs[("alice", "carol")]["any"]["micro_f1"] == 1.0
    assert pairs[("alice", "bob")]["any"]["micro_f1"] == pytest.approx(0.4)
    text = format_agreement(summary)
    assert "poor: 0.667 / 0.667" in text and "alice vs bob: poor 0.500, good 0.000, any 0.400" in text


def test_no_shared_item_says_how_to_get_some():
    summary = agreement_summary([_record("alice", poor=["cat"])])
    assert summary["shared_items"] == 0 and summary["overall"]["poor"]["micro_f1"] is None
    assert "--annotations_per_item 2" in format_agreement(summary)


def test_suggestion_summary_counts_kept_removed_and_added_spans_per_critic():
    def rec(critic, n_suggested, kept, removed, added, edited):
        return {"id": "x", "suggestion": {"critic": critic, "critique": "c", "spans": [{}] * n_suggested},
                "changes": {"kept": kept, "removed": removed, "added": added, "critique_edited": edited}}

    summary = suggestion_summary([rec("llm:a", 3, 2, 1, 1, True), rec("llm:a", 1, 1, 0, 0, False),
                                  rec("rm", 2, 0, 2, 2, True), {"id": "y"}])
    assert summary["llm:a"] == {"records": 2, "suggested": 4, "kept": 3, "removed": 1, "added": 1, "critique_edited": 1,
                                "kept_rate": 0.75, "recall": 0.75, "edited_rate": 0.5}
    assert summary["rm"]["kept_rate"] == 0.0 and summary["rm"]["recall"] == 0.0 and summary["rm"]["edited_rate"] == 1.0
    assert "llm:a: 2 records, 4 spans suggested: 3 kept, 1 removed, 1 added; kept rate 0.750" in format_suggestions(summary)
    assert format_suggestions({}) == ""
