"""The pieces of the retry policy, the budget and the resume logic, one at a time."""

from __future__ import annotations

import email.utils
import random
import time

import pytest

from annotation.llm import (
    BudgetExhausted,
    UsageMeter,
    backoff_delay,
    estimate_tokens,
    mask_secrets,
    retry_after_seconds,
)
from annotation.runner import repair_torn_tail


def test_retry_after_forms():
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after": "0.25"}) == 0.25
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5  # ms wins
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_seconds({"retry-after": date}) <= 31
    assert retry_after_seconds({"retry-after": "-5"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None and retry_after_seconds(None) is None


def test_backoff_is_exponential_capped_and_jittered():
    rng = random.Random(0)
    for attempt in range(8):
        cap = min(10.0, 0.5 * 2 ** attempt)
        waits = [backoff_delay(attempt, 0.5, 10.0, rng) for _ in range(200)]
        assert all(cap / 2 <= w <= cap for w in waits)
        assert max(waits) - min(waits) > cap / 4  # really jittered
    assert backoff_delay(30, 1.0, 60.0, rng) <= 60.0


def test_mask_secrets():
    key = "sk-proj-abcdefghijklmnop1234"
    assert mask_secrets(f"bad key {key}!", [key]) == "bad key ***!"
    assert "abcdefghijklmnop" not in mask_secrets("Incorrect API key provided: sk-proj-abcdefghijklmnop9999", [])
    assert mask_secrets("azure-key-XYZ123 failed", ["azure-key-XYZ123"]) == "*** failed"
    assert mask_secrets("nothing secret", [None, ""]) == "nothing secret"


def test_request_budget():
    meter = UsageMeter(max_requests=2)
    meter.acquire(); meter.release(10, 5)  # noqa: E702
    meter.acquire()
    with pytest.raises(BudgetExhausted, match="max_requests=2"):
        meter.acquire()
    meter.release()
    assert meter.requests == 2 and meter.prompt_tokens == 10 and meter.completion_tokens == 5


def test_cost_budget_reserves_requests_in_flight():
    meter = UsageMeter(max_cost_usd=0.045, price_per_1k_input=0.01, price_per_1k_output=0.0)
    meter.acquire(); meter.release(1000, 0)  # $0.01 spent, average $0.01  # noqa: E702
    meter.acquire(); meter.acquire(); meter.acquire()  # spent + 3 reserved = 0.04 <= 0.045  # noqa: E702
    with pytest.raises(BudgetExhausted, match="max_cost_usd"):
        meter.acquire()  # a 4th in flight would make 0.05 > 0.045
    assert meter.requests == 4 and meter.cost_usd == pytest.approx(0.01)
    with pytest.raises(BudgetExhausted):  # once exhausted, it stays exhausted
        meter.release(0, 0) or meter.acquire()


def test_failed_requests_do_not_lower_the_average_cost():
    meter = UsageMeter(max_cost_usd=0.025, price_per_1k_input=0.01, price_per_1k_output=0.0)
    meter.acquire(); meter.release(1000, 0)  # one billed request: $0.01  # noqa: E702
    for _ in range(3):  # three failed requests cost nothing and must not count as $0 samples
        meter.acquire(); meter.release()  # noqa: E702
    meter.acquire()  # spent 0.01 + 1 reserved at 0.01 = 0.02 <= 0.025
    with pytest.raises(BudgetExhausted, match="max_cost_usd"):
        meter.acquire()  # 0.01 + 2 * 0.01 = 0.03 > 0.025 (averaging over all 4 would have allowed it)
    assert meter.billed == 1 and meter.finished == 4


def test_estimated_tokens_are_counted_and_marked():
    assert [estimate_tokens(t) for t in ("", "abcd", "abcde", "x" * 400)] == [0, 1, 2, 100]
    meter = UsageMeter(price_per_1k_input=0.01, price_per_1k_output=0.02)
    meter.acquire(); meter.release(10, 5)  # noqa: E702
    meter.acquire(); meter.release(100, 50, estimated=True)  # noqa: E702
    assert (meter.prompt_tokens, meter.completion_tokens, meter.estimated, meter.billed) == (110, 55, 1, 2)
    assert meter.cost_usd == pytest.approx((110 * 0.01 + 55 * 0.02) / 1000)


def test_repair_torn_tail(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "pro')
    assert repair_torn_tail(path) is True
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'
    assert repair_torn_tail(path) is False
    path.write_text('{"id": "only", "half')
    assert repair_torn_tail(path) and path.read_text() == ""
    assert repair_torn_tail(tmp_path / "missing.jsonl") is False
