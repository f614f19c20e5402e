"""The fake OpenAI server itself: the real openai client must see what the script says."""

from __future__ import annotations

import concurrent.futures
import time

import openai
import pytest

from tests.fake_openai import FakeOpenAIServer, Reply


def _client(server: FakeOpenAIServer, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0, **kw)


def _ask(client: openai.OpenAI, text: str = "hi") -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": text}])


def test_answers_with_content_and_usage():
    with FakeOpenAIServer(lambda body, n: Reply(content=f"answer {n}", prompt_tokens=7, completion_tokens=3)) as server:
        client = _client(server)
        first, second = _ask(client, "a"), _ask(client, "b")
    assert first.choices[0].message.content == "answer 0"
    assert second.choices[0].message.content == "answer 1"
    assert (first.usage.prompt_tokens, first.usage.completion_tokens, first.usage.total_tokens) == (7, 3, 10)
    assert [r["messages"][0]["content"] for r in server.requests] == ["a", "b"]
    assert server.request_headers[0]["authorization"] == "Bearer test-key"
    assert server.requests[0]["model"] == "gpt-4o"


def test_plain_string_reply_is_content():
    with FakeOpenAIServer(lambda body, n: "just text") as server:
        assert _ask(_client(server)).choices[0].message.content == "just text"


def test_status_codes_and_retry_after_header():
    def handler(body, n):
        return Reply(status=429, headers={"Retry-After": "3"}, content="slow down") if n == 0 else Reply(status=500)

    with FakeOpenAIServer(handler) as server:
        client = _client(server)
        with pytest.raises(openai.RateLimitError) as rate:
            _ask(client)
        with pytest.raises(openai.InternalServerError):
            _ask(client)
    assert rate.value.status_code == 429
    assert rate.value.response.headers["retry-after"] == "3"
    assert "slow down" in str(rate.value)


def test_dropped_connection_and_slow_reply():
    def handler(body, n):
        return Reply(drop=True) if n == 0 else Reply(content="late", delay_s=1.0)

    with FakeOpenAIServer(handler) as server:
        client = _client(server, timeout=0.3)
        with pytest.raises(openai.APIConnectionError) as dropped:
            _ask(client)
        assert not isinstance(dropped.value, openai.APITimeoutError)
        with pytest.raises(openai.APITimeoutError):
            _ask(client)
    assert len(server.requests) == 2


def test_concurrent_requests_overlap():
    arrivals: list[float] = []

    def handler(body, n):
        arrivals.append(time.monotonic())
        return Reply(content="ok", delay_s=1.0)

    with FakeOpenAIServer(handler) as server:
        client = _client(server)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda i: _ask(client, str(i)), range(4)))
    assert all(r.choices[0].message.content == "ok" for r in results)
    # all four arrived before the first answer went out: the server handles them at the same time
    assert len(arrivals) == 4 and max(arrivals) - min(arrivals) < 1.0


def test_handler_exception_becomes_500_and_is_recorded():
    def handler(body, n):
        raise KeyError("script bug")

    with FakeOpenAIServer(handler) as server:
        with pytest.raises(openai.InternalServerError):
            _ask(_client(server))
    assert len(server.errors) == 1 and "script bug" in server.errors[0]
