"""The store behind the page: leases between people, resume, skips and back, revisions, torn lines, one server per file."""

from __future__ import annotations

import json

import pytest

from tests.apps.feedback_ui.fbui_testlib import ITEMS, read_records

import text2grad.apps.feedback_ui.store as store_module
from text2grad.apps.feedback_ui.store import FeedbackStore, FeedbackUIError, check_output_paths


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _span(quote: str, item_id: str = "c", label: str = "poor") -> dict:
    response = next(i["response"] for i in ITEMS if i["id"] == item_id)
    start = len(response[: response.index(quote)].encode("utf-16-le")) // 2
    return {"start": start, "end": start + len(quote.encode("utf-16-le")) // 2, "label": label, "text": quote}


@pytest.fixture
def make(tmp_path):
    opened = []

    def build(per_item: int = 1, lease_s: float = 60.0, clock=None) -> FeedbackStore:
        store = FeedbackStore(ITEMS, tmp_path / "out.jsonl", tmp_path / "out.jsonl.skipped.jsonl", per_item, lease_s,
                              clock=clock or Clock())
        opened.append(store)
        return store

    yield build
    for store in opened:
        store.close()


def test_an_item_is_never_handed_to_two_people_at_once_and_a_lapsed_lease_frees_it(make):
    clock = Clock()
    store = make(lease_s=60, clock=clock)
    assert store.next_item("alice")["id"] == "a"
    assert store.next_item("bob")["id"] == "b"  # a is held for alice
    assert store.next_item("alice")["id"] == "a"  # asking again (a reload) gives alice the item she holds
    clock.now += 61  # alice walked away; bob's page kept renewing his lease
    assert store.renew("bob", "b")
    assert store.next_item("carol")["id"] == "a"
    # alice comes back and submits a, but carol holds it now and one annotation per item is asked for
    with pytest.raises(FeedbackUIError, match="completed by other annotators") as refused:
        store.submit("carol", "a", "ok", [])
        store.submit("alice", "a", "late", [])
    assert refused.value.status == 409
    assert [r["annotator"] for r in read_records(store.output)] == ["carol"]


def test_double_annotation_hands_each_item_to_two_different_people(make):
    store = make(per_item=2)
    assert [store.next_item(who)["id"] for who in ("alice", "bob", "carol")] == ["a", "a", "b"]
    store.submit("alice", "a", "first", [])
    store.submit("bob", "a", "second", [])
    assert store.next_item("alice")["id"] == "b"  # b: carol holds one place, alice takes the other
    assert store.next_item("dave")["id"] == "c"
    assert store.progress("alice") == {"total": 4, "yours": 1, "skipped": 0, "complete": 1, "per_item": 2}


def test_restart_resumes_each_person_remembers_skips_and_back_walks_their_history(make, tmp_path):
    store = make()
    assert store.next_item("alice")["id"] == "a"
    store.submit("alice", "a", "Wrong city.", [_span("Oslo", "a")])
    store.skip("alice", "b")
    store.submit("alice", "c", "Subtracts.", [_span("return a - b")])
    store.close()
    again = make()
    view = again.next_item("alice")
    assert view["id"] == "d" and view["progress"] == {"total": 4, "yours": 2, "skipped": 1, "complete": 2, "per_item": 1}
    assert again.history("alice") == ["a", "b", "c"]
    back = again.previous("alice", "d")
    assert back["id"] == "c" and back["status"] == "submitted" and back["record"]["critique"] == "Subtracts."
    assert again.previous("alice", "c")["status"] == "skipped"
    assert again.previous("alice", "a") is None
    # a skipped item can be done later: the submission supersedes the skip
    again.submit("alice", "b", "Echoes markup.", [])
    assert again.progress("alice")["skipped"] == 0 and again.progress("alice")["yours"] == 3
    assert [e["id"] for e in read_records(tmp_path / "out.jsonl.skipped.jsonl")] == ["b"]  # append-only


def test_revising_a_submission_replaces_that_record_only(make, tmp_path):
    store = make()
    store.next_item("alice")
    store.submit("alice", "a", "first try", [])
    store.next_item("bob")
    store.submit("bob", "b", "bob's", [])
    lines_before = (tmp_path / "out.jsonl").read_text().splitlines()
    revised = store.submit("alice", "a", "second try", [_span("Oslo", "a")])
    lines_after = (tmp_path / "out.jsonl").read_text().splitlines()
    assert revised["revised"] is True and len(lines_after) == 2
    assert lines_after[1] == lines_before[1]  # bob's line, byte for byte
    assert json.loads(lines_after[0])["critique"] == "second try"
    store.next_item("carol")
    store.submit("carol", "c", "after the revision, appends still land in the file", [])
    assert [r["annotator"] for r in read_records(tmp_path / "out.jsonl")] == ["alice", "bob", "carol"]


def test_a_line_torn_by_a_kill_is_cut_and_the_rest_is_kept(make, tmp_path):
    store = make()
    store.next_item("alice")
    store.submit("alice", "a", "kept", [])
    store.close()
    with (tmp_path / "out.jsonl").open("a") as fh:
        fh.write('{"id": "b", "annotator": "alice", "critique": "half')  # the write a kill -9 interrupted
    again = make()
    assert [r["id"] for r in read_records(tmp_path / "out.jsonl")] == ["a"]
    assert again.next_item("alice")["id"] == "b"  # the torn record is simply redone


def test_bad_submissions_are_refused_and_nothing_is_written(make, tmp_path):
    store = make()
    store.next_item("alice")
    for critique, spans, message in [
        ("", [], "write a critique"),
        (7, [], "critique must be text"),
        ("ok", "Oslo", "spans must be a list"),
        ("ok", [{"start": 0, "end": 4, "label": "poor", "text": "Alix"}], "reload the page"),
    ]:
        with pytest.raises(FeedbackUIError, match=message) as refused:
            store.submit("alice", "a", critique, spans)
        assert refused.value.status == 400
    with pytest.raises(FeedbackUIError, match="no item with id") as missing:
        store.submit("alice", "zz", "ok", [])
    assert missing.value.status == 404
    assert not (tmp_path / "out.jsonl").read_text()


def test_one_server_per_output_file(make, tmp_path):
    first = make()
    with pytest.raises(FeedbackUIError, match="is in use by feedback-ui"):
        make()
    first.close()
    make()  # free again once the first one stopped


def test_the_input_is_never_an_output(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text("")
    with pytest.raises(FeedbackUIError, match="is the input file"):
        check_output_paths(str(data), str(data), tmp_path / "other")
    with pytest.raises(FeedbackUIError, match="is a directory"):
        check_output_paths(str(data), str(tmp_path), tmp_path / "other")


def test_a_refusal_says_held_when_the_item_is_only_held_and_completed_when_it_is(make):
    clock = Clock()
    store = make(lease_s=60, clock=clock)
    assert store.next_item("alice")["id"] == "a"
    clock.now += 61
    assert store.next_item("bob")["id"] == "a"  # alice's lease lapsed; bob holds a now, nobody completed it
    with pytest.raises(FeedbackUIError, match="is held by another annotator") as held:
        store.submit("alice", "a", "late", [])
    assert held.value.status == 409 and "completed" not in str(held.value)
    store.submit("bob", "a", "done", [])
    with pytest.raises(FeedbackUIError, match="was completed by other annotators"):
        store.submit("alice", "a", "later", [])


def test_started_at_is_the_first_display_not_the_last_lease(make, monkeypatch):
    times = iter(["2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z", "2026-01-01T00:09:00Z", "2026-01-01T00:10:00Z"])
    monkeypatch.setattr(store_module, "utc_now", lambda: next(times))
    store = make()
    store.next_item("alice")
    store.next_item("alice")  # a reload re-leases the same item
    store.previous("alice", None)  # nothing before: no display
    store.next_item("alice")
    record = store.submit("alice", "a", "ok", [])
    assert (record["started_at"], record["submitted_at"]) == ("2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z")
    assert store.next_item("alice")["id"] == "b"  # first shown at 00:09
    store.close()
    again = make()  # a restart keeps the first display time
    record = again.submit("alice", "b", "ok", [])
    assert (record["started_at"], record["submitted_at"]) == ("2026-01-01T00:09:00Z", "2026-01-01T00:10:00Z")


def test_critiques_and_marks_have_limits(make):
    store = make()
    store.next_item("alice")
    with pytest.raises(FeedbackUIError, match="at most 20000") as long:
        store.submit("alice", "a", "x" * 20001, [])
    assert long.value.status == 413
    with pytest.raises(FeedbackUIError, match="at most 500"):
        store.submit("alice", "a", "ok", [{"start": 0, "end": 1, "label": "good"}] * 501)


def test_a_suggested_critique_is_offered_and_the_record_keeps_what_changed(tmp_path):
    response = ITEMS[0]["response"]  # "Alex 😀 moved to Oslo for a job. Oslo is cold."
    cold, job = response.index("cold"), response.index("for a job")
    llm_record = {**ITEMS[0], "critique": "The city is wrong.", "good_spans": ["for a job"], "poor_spans": ["Oslo"],
                  "source": "llm:critic-7b"}
    store = FeedbackStore([llm_record], tmp_path / "out.jsonl", tmp_path / "skipped.jsonl")
    try:
        view = store.next_item("alice")
        suggestion = view["suggestion"]
        first, second = response.index("Oslo"), response.rindex("Oslo")
        assert suggestion["critic"] == "llm:critic-7b" and suggestion["critique"] == "The city is wrong."
        assert [(s["start"], s["label"]) for s in suggestion["spans"]] == [(first, "poor"), (job, "good"), (second, "poor")]
        # alice keeps the first Oslo and "for a job", removes the second Oslo, adds "cold" and edits the critique
        units = lambda i: len(response[:i].encode("utf-16-le")) // 2  # noqa: E731
        spans = [{"start": units(first), "end": units(first) + 4, "label": "poor"},
                 {"start": units(job), "end": units(job) + 9, "label": "good"},
                 {"start": units(cold), "end": units(cold) + 4, "label": "poor"}]
        record = store.submit("alice", "a", "The city is wrong; Oslo is not cold either.", spans)
    finally:
        store.close()
    assert record["suggestion"] == suggestion
    assert record["changes"] == {"kept": 2, "removed": 1, "added": 1, "critique_edited": True}
    assert read_records(tmp_path / "out.jsonl")[0]["changes"]["removed"] == 1
