"""The reward model's ``backend="openai"`` client against the scripted OpenAI-compatible server (no vLLM): what it
sends, its retries and backoff on 429/5xx and dropped connections, the failures that are not retried, bounded
concurrency, the start-up check, and a failed request becoming a failed Feedback that PPO counts. The same
backend against vLLM's real server: tests/test_critics_behind_a_server.py."""

from __future__ import annotations

import threading
import time

import pytest
from tests.fake_openai import FakeOpenAIServer, Reply

from reward_model.inference import GenerativeRewardModel
from reward_model.remote import RemoteCompletions, RemoteError

FAST = dict(max_retries=2, backoff_base_s=0.01, backoff_max_s=0.05)
ANSWER = 'Clear.\n{"good_spans": ["cat"], "poor_spans": []}'


def test_token_ids_go_to_the_completions_endpoint_greedy_with_the_token_limit():
    with FakeOpenAIServer(lambda body, n: ANSWER) as server:
        out = RemoteCompletions(server.base_url, "critic").generate([[1, 2, 3], [4, 5]], 17)
    assert [o.text for o in out] == [ANSWER, ANSWER] and all(o.finished and o.error is None for o in out)
    assert all(p.startswith("/v1/completions") for p in server.paths)
    bodies = sorted(server.requests, key=lambda b: len(b["prompt"]), reverse=True)
    assert [b["prompt"] for b in bodies] == [[1, 2, 3], [4, 5]]
    assert all(b["model"] == "critic" and b["max_tokens"] == 17 and b["temperature"] == 0.0 and b["top_p"] == 1.0
               and b["return_token_ids"] is True for b in bodies)


def test_429_5xx_and_dropped_connections_are_retried_with_the_servers_wait():
    script = [Reply(status=429, headers={"Retry-After": "0.2"}), Reply(status=503), Reply(drop=True)]

    def handler(body, n):
        return script[n] if n < len(script) else ANSWER

    with FakeOpenAIServer(handler) as server:
        # the cap on a wait must be above the server's 0.2 s, or Retry-After is (rightly) cut to the cap
        client = RemoteCompletions(server.base_url, "critic", **{**FAST, "max_retries": 3, "backoff_max_s": 1.0})
        start = time.perf_counter()
        (out,) = client.generate([[1, 2]], 8)
    assert out.text == ANSWER and out.attempts == 4 and client.retries == 3
    assert time.perf_counter() - start >= 0.2  # Retry-After was honoured


def test_retries_run_out_into_a_failed_output_and_other_4xx_fail_at_once():
    with FakeOpenAIServer(lambda body, n: Reply(status=500, content="engine crashed")) as server:
        client = RemoteCompletions(server.base_url, "critic", **FAST)
        (out,) = client.generate([[1]], 8)
    assert out.error is not None and "HTTP 500" in out.error and "engine crashed" in out.error
    assert "gave up after 3 attempts" in out.error and client.failed_requests == 1
    with FakeOpenAIServer(lambda body, n: Reply(status=400, content="prompt too long")) as server:
        client = RemoteCompletions(server.base_url, "critic", **FAST)
        (out,) = client.generate([[1]], 8)
    assert "HTTP 400" in out.error and "prompt too long" in out.error and out.attempts == 1 and client.retries == 0


def test_requests_in_flight_never_exceed_the_concurrency():
    lock, active, peak = threading.Lock(), [0], [0]

    def handler(body, n):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.1)
        with lock:
            active[0] -= 1
        return ANSWER

    with FakeOpenAIServer(handler) as server:
        out = RemoteCompletions(server.base_url, "critic", concurrency=3).generate([[k] for k in range(10)], 4)
    assert len(out) == 10 and all(o.error is None for o in out)
    assert 2 <= peak[0] <= 3


def test_the_start_up_check_names_a_missing_model_and_an_unreachable_server():
    with FakeOpenAIServer(lambda body, n: ANSWER) as server:  # it serves "fake-model"
        assert RemoteCompletions(server.base_url, "fake-model").check() == ["fake-model"]
        with pytest.raises(RemoteError, match=r"does not serve a model named 'critic'; it serves \['fake-model'\]"):
            RemoteCompletions(server.base_url, "critic").check()
        url = server.base_url
    with pytest.raises(RemoteError, match="cannot reach the critic server"):
        RemoteCompletions(url, "fake-model", timeout_s=2).check()
    with pytest.raises(ValueError, match="needs base_url"):
        RemoteCompletions("", "m")
    with pytest.raises(ValueError, match="needs model"):
        RemoteCompletions("http://x/v1", "")


def test_a_failed_request_is_a_failed_feedback_for_its_pair_only(rm_world):
    def handler(body, n):
        return Reply(status=400, content="bad pair") if n % 2 else ANSWER

    with FakeOpenAIServer(handler) as server:
        rm = GenerativeRewardModel.from_pretrained(str(rm_world / "base"), backend="openai", base_url=server.base_url,
                                                   model="fake-model", server_kwargs=FAST, max_new_tokens=8)
        prompts = [f"prompt {k}" for k in range(6)]
        feedback = rm.feedback(prompts, ["the cat"] * 6)
        sent = {tuple(b["prompt"]) for b in server.requests}
    failed = [not f.ok for f in feedback]
    assert len(sent) == 6 and sum(failed) == 3  # every other request failed; each pair got its own answer
    assert all("HTTP 400" in f.error for f in feedback if not f.ok)
    assert all(f.good_spans == ("cat",) for f in feedback if f.ok)
    assert rm.stats.request_errors == sum(failed) == rm.stats.malformed and rm.stats.requests == 6
