"""The pairwise and single-answer judge against the loopback OpenAI-compatible server."""

from __future__ import annotations

import logging
import sys
import threading
import time
import types

import pytest
from tests.fake_openai import FakeOpenAIServer, Reply

from text2grad.apps.evaluation.judge import (
    JudgeConfig,
    PairwiseItem,
    PairwiseJudgment,
    SingleItem,
    candidate_position,
    grade_summary,
    judge_pairwise,
    judge_single,
    length_controlled_win_rate,
    load_prompt,
    parse_pairwise_verdict,
    parse_rating,
    win_rate_summary,
)

TEMPLATE = load_prompt("alpaca_eval_pairwise")


def _shown(body: dict) -> tuple[str, str]:
    """The two outputs as the judge saw them (A, B)."""
    user = body["messages"][-1]["content"]
    a = user.split("[Response A]\n", 1)[1].split("\n\n[Response B]", 1)[0]
    b = user.split("[Response B]\n", 1)[1].split("\n\nFirst explain", 1)[0]
    return a, b


def _cfg(server, **kw) -> JudgeConfig:
    return JudgeConfig(model="judge-x", base_url=server.base_url, backoff_base_s=0.01, backoff_max_s=0.2, **kw)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Summary A is more faithful.\nVerdict: A", "A"),
        ("**Verdict:** Response B", "B"),
        ("Both are fine.\nverdict = tie", "tie"),
        ("I first thought Verdict: A, but on reflection\nVerdict: B", "B"),
        ("[[A]]", "A"),
        ("Final verdict: [[C]]", "tie"),
        ("  b. ", "B"),
        ("Tie", "tie"),
        ("Verdict: Both are equally good", None),
        # "a" the article is not Assistant A: tie words are read first, letters only when they stand alone
        ("The verdict is a tie.", "tie"),
        ("Verdict: a tie", "tie"),
        ("After weighing both, the verdict is a draw between them.", "tie"),
        ("Verdict: a", "A"),
        ("The verdict is a close call.\n[[B]]", "B"),
        ("Assistant A is better", "A"),
        ("Response B is better.", "B"),
        ("[[B]]", "B"),
        ("Both are equally good: tie", "tie"),
        ("Assistant A is better at tone, but B is more accurate.\n\nFinal verdict: [[B]]", "B"),
        ("A is better in some ways, B in others.", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_pairwise_verdict(text, expected):
    assert parse_pairwise_verdict(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("Good answer.\nRating: [[7]]", 7.0), ("Rating: [[8.5]]", 8.5), ("[[3]]", 3.0), ("Rating: 6/10", 6.0),
     ("Rating: [[11]]", None), ("I would give it a seven.", None), ("Rating: [[2]] ... revised Rating: [[4]]", 4.0)],
)
def test_parse_rating(text, expected):
    assert parse_rating(text) == expected


def test_candidate_position_is_seeded_per_item_and_balanced():
    ids = [f"item-{i}" for i in range(400)]
    first = [candidate_position(i, seed=0) for i in ids]
    assert first == [candidate_position(i, seed=0) for i in ids]  # reproducible
    assert first[:50] == [candidate_position(i, seed=0) for i in ids[:50]]  # independent of the set of items
    assert first != [candidate_position(i, seed=1) for i in ids]
    assert 150 < first.count("A") < 250  # a fair coin


def test_pairwise_order_is_randomized_recorded_and_mapped_back():
    """The judge prefers whichever output says GOOD, wherever it is shown: the candidate wins exactly when it is GOOD."""

    def handler(body, n):
        a, b = _shown(body)
        if "GOOD" in a and "GOOD" in b:
            return "Equal.\nVerdict: tie"
        return "Reasoning.\nVerdict: A" if "GOOD" in a else "Reasoning.\nVerdict: B"

    kinds = ["win", "loss", "tie", "win", "win", "loss", "win", "tie", "win", "loss", "win", "win"]
    items = []
    for i, kind in enumerate(kinds):
        cand = "GOOD answer" if kind in ("win", "tie") else "weak answer"
        base = "GOOD baseline" if kind in ("loss", "tie") else "weak baseline"
        items.append(PairwiseItem(f"q{i}", f"instruction {i}", cand, base))
    with FakeOpenAIServer(handler) as server:
        judgments = judge_pairwise(items, _cfg(server), TEMPLATE, seed=3, progress_bar=False)
        bodies = list(server.requests)
        assert not server.errors
    assert [j.outcome for j in judgments] == kinds
    positions = [j.candidate_position for j in judgments]
    assert positions == [candidate_position(f"q{i}", 3) for i in range(len(kinds))]
    assert {"A", "B"} <= set(positions)  # both orders occurred
    for item, j in zip(items, judgments):  # the recorded position is where the candidate really was shown
        body = next(b for b in bodies if f"instruction {item.id[1:]}\n" in b["messages"][-1]["content"])
        shown_a, shown_b = _shown(body)
        assert (shown_a if j.candidate_position == "A" else shown_b) == item.candidate
        assert body["model"] == "judge-x" and body["temperature"] == 0.0
    summary = win_rate_summary(judgments)
    assert (summary["wins"], summary["losses"], summary["ties"]) == (7, 3, 2)
    assert summary["win_rate"] == pytest.approx((7 + 0.5 * 2) / 12)
    assert summary["unparseable"] == summary["failed"] == 0


def test_retries_on_429_5xx_and_dropped_connections_then_succeeds(caplog):
    script = {0: Reply(status=429, headers={"Retry-After": "0.05"}, content="slow down"), 1: Reply(status=503), 2: Reply(drop=True)}
    seen: list[float] = []

    def handler(body, n):
        seen.append(time.monotonic())
        return script.get(n, Reply(content="Verdict: A"))

    item = PairwiseItem("only", "instr", "c", "b")
    with FakeOpenAIServer(handler) as server, caplog.at_level(logging.WARNING):
        (j,) = judge_pairwise([item], _cfg(server, max_retries=4), TEMPLATE, progress_bar=False)
    assert len(seen) == 4 and j.error is None and j.verdict == "A"
    assert seen[1] - seen[0] >= 0.05  # Retry-After honoured
    assert "429" in caplog.text and "503" in caplog.text


def test_non_retryable_errors_and_exhausted_retries_are_counted_not_raised():
    def handler(body, n):
        a, _ = _shown(body)
        if "bad-request" in a or "bad-request" in _shown(body)[1]:
            return Reply(status=400, content="context too long")
        if "overloaded" in a or "overloaded" in _shown(body)[1]:
            return Reply(status=500)
        if "rambling" in a or "rambling" in _shown(body)[1]:
            return "I cannot decide, both have merits."
        return "Verdict: tie"

    items = [PairwiseItem("1", "i", "bad-request", "x"), PairwiseItem("2", "i", "overloaded", "x"),
             PairwiseItem("3", "i", "rambling", "x"), PairwiseItem("4", "i", "fine", "x")]
    with FakeOpenAIServer(handler) as server:
        judgments = judge_pairwise(items, _cfg(server, max_retries=2), TEMPLATE, progress_bar=False)
        bodies = [b["messages"][-1]["content"] for b in server.requests]
    assert sum("bad-request" in b for b in bodies) == 1  # a 400 is not retried
    assert sum("overloaded" in b for b in bodies) == 3  # 1 try + 2 retries
    assert "HTTP 400" in judgments[0].error and "HTTP 500" in judgments[1].error
    assert judgments[2].error is None and judgments[2].verdict is None and judgments[2].judge_output.startswith("I cannot")
    summary = win_rate_summary(judgments)
    assert (summary["failed"], summary["unparseable"], summary["n_valid"], summary["ties"]) == (2, 1, 1, 1)
    assert summary["win_rate"] == 0.5


def test_concurrency_is_bounded():
    lock, state = threading.Lock(), {"now": 0, "peak": 0}

    def handler(body, n):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.15)
        with lock:
            state["now"] -= 1
        return "Verdict: B"

    items = [PairwiseItem(str(i), "i", "c", "b") for i in range(9)]
    with FakeOpenAIServer(handler) as server:
        start = time.monotonic()
        judgments = judge_pairwise(items, _cfg(server, concurrency=3), TEMPLATE, progress_bar=False)
        elapsed = time.monotonic() - start
    assert state["peak"] == 3
    assert elapsed >= 0.4  # 9 requests, 3 at a time, 0.15 s each
    assert all(j.verdict == "B" for j in judgments)


def test_api_key_comes_from_env_and_is_never_logged(monkeypatch, caplog):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-secret-123")
    with FakeOpenAIServer(lambda body, n: Reply(status=429) if n == 0 else Reply(content="Verdict: A")) as server, caplog.at_level(logging.DEBUG):
        judge_pairwise([PairwiseItem("1", "i", "c", "b")], _cfg(server, api_key_env="MY_JUDGE_KEY"), TEMPLATE, progress_bar=False)
        assert server.request_headers[0]["authorization"] == "Bearer sk-secret-123"
    assert "sk-secret-123" not in caplog.text
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        judge_pairwise([PairwiseItem("1", "i", "c", "b")], JudgeConfig(model="gpt-4o"), TEMPLATE, progress_bar=False)


def test_single_grading_mt_bench_style():
    def handler(body, n):
        user = body["messages"][-1]["content"]
        last_answer = user.rsplit("### Assistant:\n", 1)[1].split("\n\nFirst give", 1)[0]
        if "Reference answer" in user:
            assert "REF-42" in user
        return "no rating here" if "???" in last_answer else f"Fine.\nRating: [[{len(last_answer.split())}]]"

    def convo(*turns):
        msgs = []
        for q, a in turns:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        return tuple(msgs)

    items = [
        SingleItem("m1", convo(("q1", "one two three")), category="writing", turn=1),
        SingleItem("m1", convo(("q1", "one two three"), ("q2", "a b c d e f g")), category="writing", turn=2),
        SingleItem("m2", convo(("q", "x y y y y")), reference="REF-42", category="math", turn=1),
        SingleItem("m2", convo(("q", "x y y y y"), ("q2", "???")), category="math", turn=2),
    ]
    with FakeOpenAIServer(handler) as server:
        grades = judge_single(items, _cfg(server), load_prompt("mt_bench_single"), progress_bar=False)
        assert not server.errors
    assert [g.score for g in grades] == [3.0, 7.0, 5.0, None]
    summary = grade_summary(grades)
    assert summary["score"] == pytest.approx(5.0) and summary["unparseable"] == 1
    assert summary["per_turn"] == {"1": 4.0, "2": 7.0}
    assert summary["per_category"] == {"math": 5.0, "writing": 5.0}


def _judgments(outcomes):
    return [PairwiseJudgment(str(i), "A", "A", o, "Verdict: A") for i, o in enumerate(outcomes)]


def test_length_controlled_without_package_says_raw(monkeypatch):
    monkeypatch.setitem(sys.modules, "alpaca_eval", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "alpaca_eval.metrics", None)
    monkeypatch.setitem(sys.modules, "alpaca_eval.metrics.glm_winrate", None)
    value, note = length_controlled_win_rate(_judgments(["win"]), [PairwiseItem("0", "i", "c", "b")])
    assert value is None and "not installed" in note and "raw" in note


def test_length_controlled_passes_alpaca_eval_encoding(monkeypatch):
    """alpaca-eval encodes preference 1 = output_1 (baseline) wins, 2 = output_2 wins, 1.5 = tie; LC comes back in percent."""
    received = {}

    def get_length_controlled_winrate(annotations, save_weights_dir="auto", is_warn_extreme_changes=True, **kw):
        received["annotations"], received["save_weights_dir"] = annotations, save_weights_dir
        return {"win_rate": 50.0, "length_controlled_winrate": 41.5}

    module = types.ModuleType("alpaca_eval.metrics.glm_winrate")
    module.get_length_controlled_winrate = get_length_controlled_winrate
    monkeypatch.setitem(sys.modules, "alpaca_eval", types.ModuleType("alpaca_eval"))
    monkeypatch.setitem(sys.modules, "alpaca_eval.metrics", types.ModuleType("alpaca_eval.metrics"))
    monkeypatch.setitem(sys.modules, "alpaca_eval.metrics.glm_winrate", module)
    items = [PairwiseItem(str(i), f"i{i}", f"cand{i}", f"base{i}") for i in range(4)]
    value, note = length_controlled_win_rate(_judgments(["win", "loss", "tie", None]), items, indices=[10, 11, 12, 13])
    assert value == pytest.approx(0.415) and "alpaca-eval" in note
    ann = received["annotations"]
    assert [a["preference"] for a in ann] == [2.0, 1.0, 1.5, None]
    assert [a["index"] for a in ann] == [10, 11, 12, 13]
    assert ann[0]["output_1"] == "base0" and ann[0]["output_2"] == "cand0"
    assert received["save_weights_dir"] is None  # never write into the installed package


def test_swap_judges_every_item_in_both_orders_and_exposes_position_bias():
    """A judge that always answers A: without the candidate's merit mattering, both orders of every item are asked,
    the candidate wins exactly its first-position judgments, and the first/second split shows the bias."""
    items = [PairwiseItem(f"q{i}", f"instruction {i}", f"candidate {i}", f"baseline {i}") for i in range(3)]
    with FakeOpenAIServer(lambda body, n: "Verdict: A") as server:
        judgments = judge_pairwise(items, _cfg(server), TEMPLATE, progress_bar=False, swap=True)
        bodies = list(server.requests)
    assert [(j.id, j.candidate_position) for j in judgments] == [(f"q{i}", p) for i in range(3) for p in ("A", "B")]
    for item in items:  # each item was shown once with the candidate first and once with it second
        shown = [_shown(b) for b in bodies if f"instruction {item.id[1:]}\n" in b["messages"][-1]["content"]]
        assert sorted(shown) == sorted([(item.candidate, item.baseline), (item.baseline, item.candidate)])
    assert [j.outcome for j in judgments] == ["win", "loss"] * 3
    summary = win_rate_summary(judgments)
    assert summary["win_rate"] == 0.5 and summary["n_items"] == 6
    assert (summary["candidate_first_win_rate"], summary["candidate_second_win_rate"]) == (1.0, 0.0)
    assert summary["a_preferred_rate"] == 1.0
