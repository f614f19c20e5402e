"""Structured outputs in annotation: the span JSON schema is sent as ``response_format`` to servers that take it,
and a server that refuses it (HTTP 400) gets free-form requests, parsed and repaired as before, with no record
lost. The real server's side (vLLM honouring the schema) is tested in tests/test_critics_behind_a_server.py."""

from __future__ import annotations

import json

from tests.annotation.annotation_test_utils import qa_records, read_jsonl, write_jsonl
from tests.fake_openai import FakeOpenAIServer, Reply, quoting_handler

from annotation.annotation_config import AnnotationConfig
from annotation.llm import feedback_schema


def test_the_schema_lists_the_critique_and_both_span_lists_with_reasoning_first_under_cot():
    cot = feedback_schema(reasoning=True)["json_schema"]["schema"]
    assert list(cot["properties"]) == ["reasoning", "critique", "good_spans", "poor_spans"]
    assert cot["required"] == list(cot["properties"]) and cot["additionalProperties"] is False
    assert cot["properties"]["good_spans"] == {"type": "array", "items": {"type": "string"}, "maxItems": 3}
    assert list(feedback_schema(reasoning=False)["json_schema"]["schema"]["properties"]) == [
        "critique", "good_spans", "poor_spans"]


def test_auto_sends_the_schema_to_a_local_server_only():
    assert AnnotationConfig(base_url="http://127.0.0.1:8000/v1").wants_structured_output
    assert not AnnotationConfig().wants_structured_output  # the OpenAI API keeps the paper's free-form prompt
    assert AnnotationConfig(structured_output="json_schema").wants_structured_output
    assert not AnnotationConfig(base_url="http://127.0.0.1:8000/v1", structured_output="off").wants_structured_output


def test_the_schema_travels_with_every_request(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(3))
    with FakeOpenAIServer(quoting_handler) as server:
        rc, report = run_cli(server, tmp_path, "--cot", "false")
    assert rc == 0 and report["done"] == 3 and report["structured_output"] == "json_schema"
    assert all(b["response_format"] == feedback_schema(reasoning=False) for b in server.requests)


def test_a_server_that_refuses_the_schema_gets_free_form_requests_and_loses_no_record(tmp_path, run_cli):
    def handler(body, n):
        if "response_format" in body:
            return Reply(status=400, content="response_format json_schema is not supported by this server")
        return quoting_handler(body, n)

    write_jsonl(tmp_path / "in.jsonl", qa_records(4))
    with FakeOpenAIServer(handler) as server:
        rc, report = run_cli(server, tmp_path, "--concurrency", "1")
    assert rc == 0 and report["done"] == 4 and report["failed"] == 0
    assert report["structured_output"].startswith("refused: HTTP 400") and "not supported" in report["structured_output"]
    # one refused request, then the free-form one; every later request is free-form from the start
    assert ["response_format" in b for b in server.requests] == [True] + [False] * 4
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 4


def test_a_400_that_is_not_about_the_schema_fails_only_its_record(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(2))
    with FakeOpenAIServer(lambda body, n: Reply(status=400, content="prompt is too long")) as server:
        rc, report = run_cli(server, tmp_path, "--concurrency", "1")
    assert rc == 0 and report["failed"] == 2 and report["failure_reasons"] == {"api_error": 2}
    assert report["structured_output"] == "json_schema"  # the schema was not the problem: still sent
    failures = [json.loads(line) for line in (tmp_path / "out.jsonl.failures.jsonl").read_text().splitlines()]
    assert all("prompt is too long" in f["error"] for f in failures)
