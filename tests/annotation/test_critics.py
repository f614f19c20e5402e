"""Critics: the unit-test critic (real sandbox), custom FeedbackSource classes, and LLMCritic."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from tests.annotation.annotation_test_utils import SECRET_KEY, read_jsonl, write_jsonl
from tests.fake_openai import FakeOpenAIServer, Reply, quoting_handler

from annotation.cli import main
from annotation.code_critic import CodeTestCritic
from annotation.llm import LLMCritic
from text2grad.core.critics import extract_code
from text2grad.core.feedback import Feedback

REPO = Path(__file__).resolve().parents[2]

TESTS = """from solution import add, scale


def test_add():
    assert add(2, 3) == 5


def test_add_zero():
    assert add(0, 0) == 0


def test_scale():
    assert scale([1, 2], 3) == [3, 6]
"""

GOOD = """def add(a, b):
    return a + b


def scale(xs, k):
    return [x * k for x in xs]
"""


@pytest.fixture(scope="module")
def critic():
    return CodeTestCritic(timeout_s=4.0, memory_mb=512)


def _exact(feedback: Feedback, response: str) -> None:
    for span in feedback.good_spans + feedback.poor_spans:
        assert span in response, span


def test_passing_code_gets_good_spans_on_what_the_tests_exercise(critic):
    response = GOOD + "\n\ndef unused(x):\n    return x\n"
    fb, info = critic.critique(response, TESTS)
    assert info["verdict"] == "passed" and info["passed"] == ["test_add", "test_add_zero", "test_scale"]
    assert fb.ok and fb.poor_spans == ()
    assert fb.good_spans == ("def add(a, b):\n    return a + b", "def scale(xs, k):\n    return [x * k for x in xs]")
    assert "All 3 unit tests pass" in fb.critique and "`add`" in fb.critique
    _exact(fb, response)


def test_wrong_return_value_blames_the_return_line_and_keeps_passing_parts_good(critic):
    response = GOOD.replace("return a + b", "return a - b")
    fb, info = critic.critique(response, TESTS)
    assert info["verdict"] == "failed" and info["failed"] == ["test_add"]
    assert fb.poor_spans == ("return a - b",)
    assert fb.good_spans == ("def scale(xs, k):\n    return [x * k for x in xs]",)
    assert "1 of 3 unit tests fail" in fb.critique and "AssertionError" in fb.critique
    assert "assert add(2, 3) == 5" in fb.critique
    _exact(fb, response)


def test_exception_in_the_solution_quotes_the_raising_line(critic):
    response = "def helper(x):\n    return x[0]\n\n\ndef add(a, b):\n    return helper(a) + b\n\n\n" + GOOD.split("\n\n\n")[1]
    fb, _ = critic.critique(response, TESTS)
    assert fb.poor_spans == ("return x[0]",)  # the innermost solution line of the traceback
    assert "TypeError" in fb.critique and "`return x[0]`" in fb.critique
    assert fb.good_spans == ("def scale(xs, k):\n    return [x * k for x in xs]",)
    _exact(fb, response)


def test_syntax_error_quotes_the_line(critic):
    response = "def add(a, b)\n    return a + b\n"
    fb, info = critic.critique(response, TESTS)
    assert fb.poor_spans == ("def add(a, b)",) and "SyntaxError" in fb.critique
    assert info["failed"] == ["<collection>"]


def test_infinite_loop_is_a_timeout_that_quotes_where_it_hung(critic):
    response = "def add(a, b):\n    while a != b:\n        a = a\n    return a\n\n\n" + GOOD.split("\n\n\n")[1]
    fb, info = critic.critique(response, TESTS)
    assert info["verdict"] == "timeout"
    assert fb.poor_spans[0] in ("while a != b:", "a = a")
    assert "while a != b:" in fb.poor_spans
    assert "do not finish within 4 s" in fb.critique
    _exact(fb, response)


def test_code_inside_a_markdown_fence_is_extracted_and_quoted_exactly(critic):
    response = "Here you go:\n\n```python\n" + GOOD.replace("x * k", "x + k") + "```\nHope it helps."
    assert extract_code(response) == GOOD.replace("x * k", "x + k")
    assert extract_code("Sure:\n```py\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # cut off before ```
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"
    fb, _ = critic.critique(response, TESTS)
    assert fb.poor_spans == ("return [x + k for x in xs]",)
    assert fb.good_spans == ("def add(a, b):\n    return a + b",)
    _exact(fb, response)


def test_code_critic_built_from_the_critic_registry(critic):
    source = CodeTestCritic({"Q-add": TESTS}, timeout_s=4.0, max_workers=2)
    out = source.feedback(["Q-add", "Q-add", "unknown"], [GOOD, GOOD.replace("a + b", "a * b"), GOOD])
    assert len(out) == 3
    assert out[0].ok and out[0].poor_spans == ()
    assert out[1].poor_spans == ("return a * b",)
    assert not out[2].ok and "no unit tests" in out[2].error


def test_cli_with_code_tests_critic_on_kodcode_records(tmp_path, capsys):
    rows = [
        {"question_id": "k1", "question": "Write add and scale.", "solution": GOOD, "test": TESTS},
        {"question_id": "k2", "question": "Write add and scale.", "solution": GOOD.replace("a + b", "b - a"), "test": TESTS},
    ]
    write_jsonl(tmp_path / "kc.jsonl", rows)
    rc = main(["--config", str(REPO / "configs/kodcode/annotation.yaml"), "--critic", "code_tests", "--dataset_path", str(tmp_path / "kc.jsonl"),
               "--output", str(tmp_path / "out.jsonl"), "--progress_bar", "false", "--test_timeout_s", "4"])
    assert rc == 0
    out = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    assert sorted(out) == ["k1", "k2"]
    assert out["k1"]["poor_spans"] == [] and len(out["k1"]["good_spans"]) == 2
    assert out["k2"]["poor_spans"] == ["return b - a"] and out["k2"]["source"] == "code_tests"
    assert out["k2"]["meta"]["_annotation"]["verdict"] == "failed"
    report = json.loads((tmp_path / "out.jsonl.report.json").read_text())
    assert report["done"] == 2 and report["requests"] == 0 and report["estimated_cost_usd"] == 0


class ShoutCritic:
    """A FeedbackSource for the --critic module:Class test: praises the first word, faults words in CAPS."""

    def __init__(self, marker: str = "!") -> None:
        self.marker = marker

    def feedback(self, prompts, responses):
        out = []
        for response in responses:
            words = response.split()
            if not words:
                out.append(Feedback.failed("empty response"))
                continue
            caps = [w for w in words if w.isupper() and len(w) > 1]
            out.append(Feedback(critique=f"Shouting{self.marker}", good_spans=(words[0],), poor_spans=tuple(caps)))
        return out


def test_cli_with_a_custom_critic_class(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "p", "response": "Hello THERE friend"},
                                        {"id": "b", "prompt": "p", "response": ""}])
    rc = main(["--critic", f"{__name__}:ShoutCritic", "--critic_kwargs", '{"marker": "?"}',
               "--dataset_path", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl"), "--progress_bar", "false"])
    assert rc == 0
    (rec,) = read_jsonl(tmp_path / "o.jsonl")
    assert (rec["critique"], rec["good_spans"], rec["poor_spans"], rec["source"]) == ("Shouting?", ["Hello"], ["THERE"], "ShoutCritic")
    (failure,) = read_jsonl(tmp_path / "o.jsonl.failures.jsonl")
    assert failure["id"] == "b" and failure["reason"] == "critic_failed" and failure["error"] == "empty response"


def test_unknown_critic_class_is_a_clear_error(tmp_path, capsys):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "p", "response": "r"}])
    rc = main(["--critic", f"{__name__}:NoSuchCritic", "--dataset_path", str(tmp_path / "in.jsonl"),
               "--output", str(tmp_path / "o.jsonl"), "--progress_bar", "false"])
    assert rc == 2 and "no attribute 'NoSuchCritic'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# LLMCritic: the synchronous FeedbackSource for the policy phase
# --------------------------------------------------------------------------------------------------


def _prompt_response(i: int) -> tuple[str, str]:
    return f"Question {i}?", f"First line {i}.\nLast line {i}."


def test_llm_critic_returns_one_feedback_per_pair_in_order(api_key):
    pairs = [_prompt_response(i) for i in range(5)]
    with FakeOpenAIServer(quoting_handler) as server:
        with LLMCritic(base_url=server.base_url, dataset="ultrafeedback", concurrency=3) as critic:
            out = critic.feedback([p for p, _ in pairs], [r for _, r in pairs])
            again = critic.feedback([pairs[0][0]], [pairs[0][1]])  # the loop thread is reused
    assert [f.good_spans for f in out] == [(f"First line {i}.",) for i in range(5)]
    assert [f.poor_spans for f in out] == [(f"Last line {i}.",) for i in range(5)]
    assert again[0].good_spans == ("First line 0.",)
    assert critic.meter.requests == 6


def test_llm_critic_never_raises_and_reports_failures(api_key):
    def handler(body, n):
        return Reply(status=500) if "First line 1." in body["messages"][-1]["content"] else quoting_handler(body, n)

    with FakeOpenAIServer(handler) as server:
        with LLMCritic(base_url=server.base_url, max_api_retries=1, backoff_base_s=0.01) as critic:
            out = critic.feedback(*zip(*[_prompt_response(i) for i in range(3)]))
    assert out[0].ok and out[2].ok
    assert not out[1].ok and "HTTP 500" in out[1].error and "gave up after 2 attempts" in out[1].error


def test_llm_critic_works_from_threads_and_inside_a_running_event_loop(api_key):
    with FakeOpenAIServer(quoting_handler) as server:
        with LLMCritic(base_url=server.base_url) as critic:
            results: dict[int, list[Feedback]] = {}

            def work(i: int) -> None:
                p, r = _prompt_response(i)
                results[i] = critic.feedback([p], [r])

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)

            async def inside_a_loop() -> tuple[list[Feedback], list[Feedback]]:
                p, r = _prompt_response(9)
                blocking = critic.feedback([p], [r])  # sync call while this thread runs a loop
                awaited = await critic.afeedback([p], [r])
                return blocking, awaited

            blocking, awaited = asyncio.run(inside_a_loop())
    assert sorted(results) == [0, 1, 2, 3]
    assert all(results[i][0].good_spans == (f"First line {i}.",) for i in range(4))
    assert blocking[0].good_spans == awaited[0].good_spans == ("First line 9.",)


def test_llm_critic_budget_and_key_masking(api_key):
    with FakeOpenAIServer(lambda b, n: Reply(status=400, content=f"echo {SECRET_KEY}")) as server:
        # free-form requests: with the span schema a 400 is resent once without it, which the budget would stop
        with LLMCritic(base_url=server.base_url, max_requests=1, structured_output="off") as critic:
            out = critic.feedback(["a", "b"], ["x", "y"])
    errors = sorted(f.error for f in out)
    assert any("max_requests=1" in e for e in errors) and any("HTTP 400" in e for e in errors)
    assert all(SECRET_KEY not in e for e in errors)
    assert len(server.requests) == 1
