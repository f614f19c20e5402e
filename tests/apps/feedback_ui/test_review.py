"""Review and adjudication: the queue of items two people annotated, their disagreements, the adjudicated record,
the reviewer's token, and attention-check scores."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from tests.apps.feedback_ui.fbui_testlib import ITEMS, read_records

from text2grad.apps.feedback_ui.agreement import attention_summary, format_attention
from text2grad.apps.feedback_ui.records import suggestion_of
from text2grad.apps.feedback_ui.review import ReviewQueue, disagreements
from text2grad.apps.feedback_ui.server import create_app
from text2grad.apps.feedback_ui.store import FeedbackStore

RESPONSE_D = ITEMS[3]["response"]  # "Check local listings and compare prices."


def _units(quote: str, label: str) -> dict:
    start = RESPONSE_D.index(quote)
    return {"start": start, "end": start + len(quote), "label": label}


@pytest.fixture
def queue(tmp_path):
    store = FeedbackStore(ITEMS, tmp_path / "out.jsonl", tmp_path / "skipped.jsonl", annotations_per_item=2)
    for who in ("alice", "bob"):
        assert store.next_item(who)["id"] == "a"
    store.submit("alice", "a", "fine", [])
    store.submit("bob", "a", "fine too", [])
    store.submit("alice", "d", "Useful.", [_units("compare prices", "good")])
    store.submit("bob", "d", "Vague.", [_units("compare prices", "good"), _units("Check local listings", "poor")])
    review = ReviewQueue(store, tmp_path / "out.jsonl.adjudicated.jsonl")
    yield review
    review.close()
    store.close()


def test_disagreements_are_the_stretches_where_marks_differ():
    a = {"span_offsets": [_units("compare prices", "good")]}
    b = {"span_offsets": [_units("compare prices", "good"), _units("Check local listings", "poor")]}
    assert disagreements(RESPONSE_D, [a, b]) == [[0, len("Check local listings")]]
    assert disagreements(RESPONSE_D, [a, a]) == [] and disagreements(RESPONSE_D, [a]) == []


def test_the_reviewer_sees_both_annotations_and_writes_the_adjudicated_record(queue, tmp_path):
    assert queue.pending() == ["a", "d"]
    view = queue.next_item("carol", after="a")
    assert view["id"] == "d" and [a["annotator"] for a in view["annotations"]] == ["alice", "bob"]
    assert view["disagreements"] == [[0, 20]]
    assert view["agreed_spans"] == [{**_units("compare prices", "good"), "text": "compare prices"}]
    record = queue.submit("carol", "d", "Useful but vague about where.", [_units("compare prices", "good"),
                                                                          _units("local listings", "poor")])
    assert record["source"] == "human" and record["annotator"] == "carol"
    assert record["meta"]["adjudicated_from"] == ["alice", "bob"]
    assert record["poor_spans"] == ["local listings"] and record["meta"]["_annotation"]["critic"] == "feedback-ui review"
    assert queue.pending() == ["a"] and queue.progress() == {"shared": 2, "adjudicated": 1}
    assert [r["id"] for r in read_records(tmp_path / "out.jsonl.adjudicated.jsonl")] == ["d"]
    assert len(read_records(tmp_path / "out.jsonl")) == 4  # the annotators' records are untouched


def test_the_review_api_needs_a_reviewers_own_token(queue):
    app = create_app(queue.store, annotator_tokens={"alice": "alice-token-0123456789abc"}, review=queue,
                     reviewer_tokens={"carol": "carol-token-0123456789abc"})
    client = TestClient(app, base_url="http://127.0.0.1:8765")
    assert client.post("/api/review/next", json={}).status_code == 401
    assert client.post("/api/review/next", json={}, headers={"x-access-token": "alice-token-0123456789abc"}).status_code == 401
    carol = {"x-access-token": "carol-token-0123456789abc"}
    answer = client.post("/api/review/next", json={}, headers=carol).json()
    assert answer["reviewer"] == "carol" and answer["item"]["id"] == "a"
    # and a reviewer token does not annotate
    assert client.post("/api/next", json={"annotator": "carol"}, headers=carol).status_code == 401
    assert client.get("/review").status_code == 200


def test_attention_checks_score_each_annotator_against_the_known_answer():
    check = {**ITEMS[3], "attention_check": True, "good_spans": ["compare prices"], "poor_spans": []}
    assert suggestion_of(check) is None  # the answer is not shown as a suggestion
    meta = {"attention_check": True, "good_spans": ["compare prices"], "poor_spans": []}
    records = [
        {"id": "d", "response": RESPONSE_D, "annotator": "alice", "meta": meta, "span_offsets": [_units("compare prices", "good")]},
        {"id": "d", "response": RESPONSE_D, "annotator": "bob", "meta": meta,
         "span_offsets": [_units("compare", "good"), _units("Check", "poor")]},
        {"id": "a", "response": "x", "annotator": "bob", "meta": {}},  # not a check
    ]
    summary = attention_summary(records)
    # words: Check local listings and compare prices. -> answer marks words 4-5 good; bob: 4 good, 0 poor
    assert summary["alice"] == {"checks": 1, "mean_f1": 1.0, "min_f1": 1.0}
    assert summary["bob"]["mean_f1"] == pytest.approx(2 * 1 / (2 + 2))
    assert "bob: 1 checks, mean 0.500" in format_attention(summary)
