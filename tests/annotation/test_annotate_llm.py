"""The LLM annotation run end to end: the real openai client talks to a scripted loopback server."""

from __future__ import annotations

import json
import threading
import time

import datasets
import pytest
from tests.annotation.annotation_test_utils import SECRET_KEY, qa_records, read_jsonl, write_jsonl
from tests.fake_openai import FakeOpenAIServer, Reply, quoting_handler, response_of

from annotation.cli import main
from annotation.templates import builtin_template


def _answer(good, poor, critique="Critique text.", reasoning=True) -> str:
    body = json.dumps({"critique": critique, "good_spans": good, "poor_spans": poor})
    return ("Reasoning: step one, step two.\n" + body) if reasoning else body


def test_good_answers_become_records_and_report(tmp_path, run_cli):
    records = qa_records(6)
    write_jsonl(tmp_path / "in.jsonl", records)
    with FakeOpenAIServer(quoting_handler) as server:
        rc, report = run_cli(server, tmp_path, "--concurrency", "3")
    assert rc == 0 and not server.errors
    out = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(r["id"] for r in out) == [f"r{i}" for i in range(6)]
    by_id = {r["id"]: r for r in out}
    for rec in records:
        got = by_id[rec["id"]]
        assert set(got) == {"id", "prompt", "response", "critique", "good_spans", "poor_spans", "unmatched_spans", "source", "meta"}
        assert got["prompt"] == rec["prompt"] and got["response"] == rec["response"]
        assert got["good_spans"] == [rec["response"].splitlines()[0]]
        assert got["poor_spans"] == [rec["response"].splitlines()[-1]]
        assert all(s in rec["response"] for s in got["good_spans"] + got["poor_spans"])
        assert got["unmatched_spans"] == {"good": [], "poor": []}
        assert got["critique"] == "The opening is on point; the ending is weak."
        assert got["source"] == "llm:gpt-4o"
        assert got["meta"]["extra"] == rec["extra"]  # original fields are kept
        assert got["meta"]["_annotation"]["parse_retries"] == 0
    # every request carried the dataset template and the model settings
    assert len(server.requests) == 6
    body = server.requests[0]
    assert body["model"] == "gpt-4o" and body["temperature"] == 0.0 and body["seed"] == 0
    assert "step by step" in body["messages"][-1]["content"]  # CoT template is the default
    # the report: counts, tokens (as the server reported them) and cost at gpt-4o prices
    tokens_in = sum(quoting_handler(b, 0).prompt_tokens for b in server.requests)
    tokens_out = sum(quoting_handler(b, 0).completion_tokens for b in server.requests)
    assert report["done"] == 6 and report["failed"] == 0 and report["retried"] == 0 and report["complete"]
    assert report["requests"] == 6 and report["api_retries"] == 0
    assert (report["tokens_in"], report["tokens_out"]) == (tokens_in, tokens_out)
    assert report["estimated_cost_usd"] == pytest.approx(tokens_in * 0.0025 / 1000 + tokens_out * 0.01 / 1000)
    assert report["spans_total"] == 12 and report["unmatched_span_rate"] == 0.0
    assert report["output_records"] == 6
    assert not (tmp_path / "out.jsonl.failures.jsonl").read_text()


def test_malformed_json_is_retried_with_the_error_then_written_to_failures(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(3))

    def handler(body, n):
        response = response_of(body)
        if "Answer 0:" in response:  # never parseable
            return Reply(content="Reasoning: fine.\n{\"good_spans\": [unquoted words, \"poor_spans\": ")
        if "Answer 1:" in response and len(body["messages"]) == 2:  # bad the first time only
            return Reply(content="I think the answer is fine, no JSON here.")
        return quoting_handler(body, n)

    with FakeOpenAIServer(handler) as server:
        rc, report = run_cli(server, tmp_path, "--max_retries", "2", "--concurrency", "1")
    assert rc == 0
    out = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    failures = read_jsonl(tmp_path / "out.jsonl.failures.jsonl")
    assert sorted(out) == ["r1", "r2"]
    assert [f["id"] for f in failures] == ["r0"]
    assert failures[0]["reason"] == "unparseable" and "3 attempts" in failures[0]["error"]
    assert "unquoted words" in failures[0]["raw"]
    assert out["r1"]["meta"]["_annotation"]["parse_retries"] == 1
    # the retry showed the model its answer and what was wrong with it
    retry = next(b for b in server.requests if "Answer 1:" in response_of(b) and len(b["messages"]) > 2)
    assert retry["messages"][-2] == {"role": "assistant", "content": "I think the answer is fine, no JSON here."}
    assert "could not be used" in retry["messages"][-1]["content"]
    assert "no JSON object" in retry["messages"][-1]["content"]
    assert len(server.requests) == 3 + 2 + 1
    assert (report["done"], report["failed"], report["retried"], report["parse_retries"]) == (2, 1, 2, 3)
    assert report["failure_reasons"] == {"unparseable": 1}


def test_spans_not_in_the_response_are_dropped_and_counted(tmp_path, run_cli):
    rec = {"id": "a", "prompt": "Say hi.", "response": "Hello \u201cworld\u201d, said the  Robot."}
    write_jsonl(tmp_path / "in.jsonl", [rec])
    answer = _answer(
        good=["Hello", "\"world\", said the robot", "Hello"],  # exact; normalized (quotes, spaces, case); repeat
        poor=["an invented quote", "Robot."],
    )
    with FakeOpenAIServer(lambda b, n: answer) as server:
        rc, report = run_cli(server, tmp_path)
    assert rc == 0
    (got,) = read_jsonl(tmp_path / "out.jsonl")
    assert got["good_spans"] == ["Hello", "\u201cworld\u201d, said the  Robot"]  # stored as the response's own text
    assert got["poor_spans"] == ["Robot."]
    assert got["unmatched_spans"] == {"good": [], "poor": ["an invented quote"]}
    assert all(s in rec["response"] for s in got["good_spans"] + got["poor_spans"])
    assert report["spans_total"] == 4 and report["spans_unmatched"] == 1 and report["spans_normalized"] == 1
    assert report["unmatched_span_rate"] == pytest.approx(0.25)


def test_429_retry_after_is_honoured(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(1))
    arrivals: list[float] = []

    def handler(body, n):
        arrivals.append(time.monotonic())
        if n == 0:
            return Reply(status=429, headers={"Retry-After": "0.5"}, content="rate limited")
        return quoting_handler(body, n)

    with FakeOpenAIServer(handler) as server:
        rc, report = run_cli(server, tmp_path)  # backoff alone would wait ~0.01 s
    assert rc == 0 and len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 0.5
    assert report["done"] == 1 and report["api_retries"] == 1 and report["requests"] == 2


def test_5xx_dropped_connections_and_timeouts_are_retried(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(1))
    script = [Reply(status=500), Reply(drop=True), Reply(status=503, headers={"Retry-After": "0"}),
              Reply(body="<html>502 Bad Gateway</html>"),  # a 200 whose body is not JSON
              Reply(content=_answer(["Answer 0"], []), delay_s=1.5)]

    def handler(body, n):
        return script[n] if n < len(script) else Reply(content=_answer(["water it sparingly"], []))

    with FakeOpenAIServer(handler) as server:
        rc, report = run_cli(server, tmp_path, "--timeout_s", "0.4")
    assert rc == 0 and len(server.requests) == 6
    (got,) = read_jsonl(tmp_path / "out.jsonl")
    assert got["good_spans"] == ["water it sparingly"]  # the answer after the slow one, not the slow one
    assert report["api_retries"] == 5 and report["done"] == 1


def test_exhausted_api_retries_and_4xx_fail_only_that_record(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(3))

    def handler(body, n):
        response = response_of(body)
        if "Answer 0:" in response:
            return Reply(status=500, content="upstream broke")
        if "Answer 1:" in response:
            return Reply(status=400, content="context length exceeded")
        return quoting_handler(body, n)

    with FakeOpenAIServer(handler) as server:
        # free-form requests: with the span schema a 400 is first resent once without it (test_structured_output.py)
        rc, report = run_cli(server, tmp_path, "--max_api_retries", "2", "--concurrency", "1", "--structured_output", "off")
    assert rc == 0
    failures = {f["id"]: f for f in read_jsonl(tmp_path / "out.jsonl.failures.jsonl")}
    assert sorted(failures) == ["r0", "r1"]
    assert failures["r0"]["reason"] == "api_error" and "HTTP 500" in failures["r0"]["error"]
    assert "gave up after 3 attempts" in failures["r0"]["error"]
    assert "HTTP 400" in failures["r1"]["error"] and "context length" in failures["r1"]["error"]
    assert [r["id"] for r in read_jsonl(tmp_path / "out.jsonl")] == ["r2"]
    assert sum("Answer 0:" in response_of(b) for b in server.requests) == 3  # 1 + 2 retries
    assert sum("Answer 1:" in response_of(b) for b in server.requests) == 1  # 400 is not retried
    assert report["failed"] == 2 and report["failure_reasons"] == {"api_error": 2}


def test_rejected_key_stops_the_run_and_the_key_never_leaks(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(4))

    def handler(body, n):  # a hostile server that echoes the key back
        return Reply(status=401, content=f"Incorrect API key provided: {SECRET_KEY}")

    with FakeOpenAIServer(handler) as server:
        rc, report = run_cli(server, tmp_path, "--concurrency", "1")
    assert server.request_headers[0]["authorization"] == f"Bearer {SECRET_KEY}"  # the key was really sent
    assert rc == 1 and len(server.requests) == 1  # fatal: no point trying the other records
    assert report["fatal_error"] and "HTTP 401" in report["fatal_error"]
    assert report["not_finished"] == 4 and not report["complete"]
    captured = capsys.readouterr()
    texts = [captured.out, captured.err] + [p.read_text() for p in tmp_path.iterdir() if p.is_file()]
    assert all(SECRET_KEY not in t for t in texts)
    assert all(SECRET_KEY[8:] not in t for t in texts)  # not even its tail
    assert "HTTP 401" in captured.out


def test_key_is_masked_in_failure_records(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(2))
    with FakeOpenAIServer(lambda b, n: Reply(status=400, content=f"bad request from key {SECRET_KEY}")) as server:
        rc, report = run_cli(server, tmp_path)
    assert rc == 0 and report["failed"] == 2
    failures = (tmp_path / "out.jsonl.failures.jsonl").read_text()
    assert "***" in failures and SECRET_KEY not in failures
    assert SECRET_KEY not in json.dumps(report) and SECRET_KEY not in capsys.readouterr().out


def test_key_echoed_in_successful_replies_reaches_no_file(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(2))

    def handler(body, n):  # a server that puts the caller's key into 200 answers
        response = response_of(body)
        if "Answer 0:" in response:  # unparseable: its raw text goes to the failures file
            return Reply(content=f"Debug echo: authorization Bearer {SECRET_KEY} -- no JSON today")
        reasoning = f"Reasoning: the key {SECRET_KEY} was used.\n"  # parseable: raw goes to meta._annotation
        answer = {"critique": f"Fine ({SECRET_KEY}).", "good_spans": [response.splitlines()[0]], "poor_spans": []}
        return Reply(content=reasoning + json.dumps(answer))

    with FakeOpenAIServer(handler) as server:
        rc, report = run_cli(server, tmp_path, "--max_retries", "0", "--concurrency", "1")
    assert rc == 0 and not server.errors and len(server.requests) == 2
    assert report["done"] == 1 and report["failed"] == 1
    failure = read_jsonl(tmp_path / "out.jsonl.failures.jsonl")[0]
    assert failure["id"] == "r0" and failure["raw"] == "Debug echo: authorization Bearer *** -- no JSON today"
    record = read_jsonl(tmp_path / "out.jsonl")[0]
    assert record["id"] == "r1" and record["good_spans"] == ["Answer 1: water it sparingly."]
    assert record["meta"]["_annotation"]["raw"].startswith("Reasoning: the key *** was used.")
    assert record["critique"] == "Fine (***)."
    captured = capsys.readouterr()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"out.jsonl", "out.jsonl.failures.jsonl", "out.jsonl.report.json"}
    texts = [captured.out, captured.err] + [p.read_text() for p in files]
    assert all(SECRET_KEY not in t and SECRET_KEY[8:] not in t for t in texts)


def test_max_requests_stops_cleanly_and_a_rerun_finishes(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(20))
    with FakeOpenAIServer(quoting_handler) as server:
        rc, report = run_cli(server, tmp_path, "--max_requests", "5", "--concurrency", "3")
        assert rc == 0 and len(server.requests) == 5
        assert report["done"] == 5 and report["not_finished"] == 15 and not report["complete"]
        assert "max_requests=5" in report["stopped"]
        rc, report = run_cli(server, tmp_path, "--concurrency", "3")
    assert rc == 0 and report["complete"] and report["skipped_done"] == 5 and report["done"] == 15
    ids = [r["id"] for r in read_jsonl(tmp_path / "out.jsonl")]
    assert sorted(ids) == sorted(f"r{i}" for i in range(20)) and len(ids) == 20
    assert len(server.requests) == 20


def test_max_cost_stops_before_the_budget_is_exceeded(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(10))

    def handler(body, n):  # $0.01 per request at the prices below
        return Reply(content=_answer([], []), prompt_tokens=1000, completion_tokens=0)

    with FakeOpenAIServer(handler) as server:
        rc, report = run_cli(
            server, tmp_path, "--max_cost_usd", "0.035", "--price_per_1k_input", "0.01", "--concurrency", "1"
        )
    assert rc == 0 and len(server.requests) == 3
    assert report["estimated_cost_usd"] == pytest.approx(0.03) and report["estimated_cost_usd"] <= 0.035
    assert report["done"] == 3 and "max_cost_usd" in report["stopped"]


def test_max_cost_works_when_the_server_reports_no_usage(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(10))
    content = _answer([], [])
    with FakeOpenAIServer(lambda b, n: Reply(content=content, usage=False)) as server:
        rc, report = run_cli(
            server, tmp_path, "--max_cost_usd", "1.5", "--price_per_1k_input", "1.0",
            "--price_per_1k_output", "1.0", "--concurrency", "1",
        )
    assert rc == 0 and not server.errors
    # tokens are estimated at ceil(characters / 4), per message and for the answer
    per_request = [sum(-(-len(m["content"]) // 4) for m in b["messages"]) for b in server.requests]
    answer_tokens = -(-len(content) // 4)
    assert report["tokens_in"] == sum(per_request) and report["tokens_out"] == answer_tokens * len(per_request)
    cost = (sum(per_request) + answer_tokens * len(per_request)) / 1000
    assert report["estimated_cost_usd"] == pytest.approx(cost) and cost <= 1.5
    # the budget stopped the run cleanly: some records done, the rest left for a rerun
    assert "max_cost_usd" in report["stopped"] and 0 < report["done"] < 10
    assert report["done"] == report["requests"] == len(server.requests) and report["failed"] == 0
    assert report["not_finished"] == 10 - report["done"]
    assert report["tokens_estimated_requests"] == len(server.requests)
    assert f"tokens were estimated (~4 characters per token) for {len(server.requests)} request(s)" in capsys.readouterr().out


def test_reported_usage_is_not_marked_as_estimated(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(2))
    with FakeOpenAIServer(lambda b, n: Reply(content=_answer([], []), prompt_tokens=7, completion_tokens=3)) as server:
        rc, report = run_cli(server, tmp_path)
    assert rc == 0 and len(server.requests) == 2
    assert (report["tokens_in"], report["tokens_out"], report["tokens_estimated_requests"]) == (14, 6, 0)
    assert "estimated (~4 characters" not in capsys.readouterr().out


def test_rerun_skips_done_records_and_repairs_a_torn_last_line(tmp_path, run_cli):
    records = qa_records(5)
    write_jsonl(tmp_path / "in.jsonl", records)
    with FakeOpenAIServer(quoting_handler) as server:
        rc, _ = run_cli(server, tmp_path, "--limit", "2")
        assert rc == 0 and len(server.requests) == 2
        out = tmp_path / "out.jsonl"
        # a crash in the middle of writing r2's line
        with out.open("a") as fh:
            fh.write('{"id": "r2", "prompt": "Question 2: how do I wa')
        rc, report = run_cli(server, tmp_path)
    assert rc == 0
    lines = out.read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]  # every line parses: the torn one is gone
    assert sorted(ids) == [f"r{i}" for i in range(5)]
    assert len(server.requests) == 5  # r0, r1 were not asked again; r2 was redone
    assert report["skipped_done"] == 2 and report["done"] == 3


def test_failed_records_are_skipped_on_rerun_unless_retry_failures(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(3))
    broken = {"on": True}

    def handler(body, n):
        if broken["on"] and "Answer 1:" in response_of(body):
            return Reply(content="no json")
        return quoting_handler(body, n)

    with FakeOpenAIServer(handler) as server:
        run_cli(server, tmp_path, "--max_retries", "0")
        assert [f["id"] for f in read_jsonl(tmp_path / "out.jsonl.failures.jsonl")] == ["r1"]
        n_before = len(server.requests)
        rc, report = run_cli(server, tmp_path)
        assert len(server.requests) == n_before and report["skipped_failed"] == 1 and report["to_annotate"] == 0
        broken["on"] = False
        rc, report = run_cli(server, tmp_path, "--retry_failures", "true")
    assert rc == 0 and report["done"] == 1
    assert read_jsonl(tmp_path / "out.jsonl.failures.jsonl") == []
    assert sorted(r["id"] for r in read_jsonl(tmp_path / "out.jsonl")) == ["r0", "r1", "r2"]


def test_requests_run_concurrently_up_to_the_limit(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(12))
    lock = threading.Lock()
    active, peak = [0], [0]

    def slow(body, n):  # the handler runs in the server's per-connection thread; sleeping here is latency
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return quoting_handler(body, n)

    with FakeOpenAIServer(slow) as server:
        rc, report = run_cli(server, tmp_path, "--concurrency", "4")
    assert rc == 0 and report["done"] == 12
    assert 3 <= peak[0] <= 4  # overlapping requests, never more than --concurrency


def test_nocot_flag_selects_the_direct_prompt(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(1))
    with FakeOpenAIServer(lambda b, n: _answer(["water it sparingly"], [], reasoning=False)) as server:
        rc, _ = run_cli(server, tmp_path, "--cot", "false", "--model", "my-local-model", "--temperature", "0.5")
    assert rc == 0
    body = server.requests[0]
    user = body["messages"][-1]["content"]
    assert "step by step" not in user and "no reasoning, explanation or critique" in user and "Answer 0: water it sparingly." in user
    assert body["model"] == "my-local-model" and body["temperature"] == 0.5
    (got,) = read_jsonl(tmp_path / "out.jsonl")
    assert got["source"] == "llm:my-local-model" and got["good_spans"] == ["water it sparingly"]


def test_human_feedback_is_the_critique_and_the_llm_grounds_it(tmp_path, run_cli):
    post = "I moved to Berlin two months ago and want a dog, but my partner worries about money."
    rec = {"id": "s1", "post": post, "generated_summary_for_feedback": "Poster moved to Oslo and wants a dog.",
           "feedback": "The summary gets the city wrong (Berlin, not Oslo) and omits the partner's worry."}
    write_jsonl(tmp_path / "in.jsonl", [rec])
    with FakeOpenAIServer(lambda b, n: "The feedback points at the city.\n"
                          + json.dumps({"good_spans": ["wants a dog"], "poor_spans": ["Oslo"]})) as server:
        rc, report = run_cli(server, tmp_path, "--dataset", "slf5k", "--critic", "human")
    assert rc == 0
    user = server.requests[0]["messages"][-1]["content"]
    assert rec["feedback"] in user and post in user and "<human_feedback>" in user
    (got,) = read_jsonl(tmp_path / "out.jsonl")
    assert got["critique"] == rec["feedback"]
    assert got["prompt"] == post and got["response"] == rec["generated_summary_for_feedback"]
    assert (got["good_spans"], got["poor_spans"]) == (["wants a dog"], ["Oslo"])
    assert got["source"] == "human+llm:gpt-4o" and got["meta"]["feedback"] == rec["feedback"]


def test_each_dataset_has_cot_and_nocot_templates_that_render():
    record = {"prompt": "PROMPT-TEXT", "response": "RESPONSE-TEXT", "feedback": "FEEDBACK-TEXT", "id": "x"}
    seen = set()
    for dataset in ("slf5k", "ultrafeedback", "kodcode"):
        for cot in (True, False):
            messages = builtin_template(dataset, cot=cot).messages(record)
            user = messages[-1]["content"]
            assert messages[0]["role"] == "system" and "PROMPT-TEXT" in user
            assert "<response>\nRESPONSE-TEXT\n</response>" in user
            assert ("step by step" in user) == cot
            assert '"good_spans"' in user and '"poor_spans"' in user  # doubled braces rendered as JSON
            seen.add(user)
    assert len(seen) == 6
    human = builtin_template("slf5k", human=True).messages(record)[-1]["content"]
    assert "FEEDBACK-TEXT" in human


def test_custom_prompt_template_file(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(1))
    (tmp_path / "t.yaml").write_text("user: |-\n  CUSTOM {prompt} <response>\n  {response}\n  </response> {{\"k\": 1}}\n")
    with FakeOpenAIServer(quoting_handler) as server:
        rc, _ = run_cli(server, tmp_path, "--prompt_template", str(tmp_path / "t.yaml"))
    assert rc == 0
    messages = server.requests[0]["messages"]
    assert len(messages) == 1 and messages[0]["content"].startswith("CUSTOM Question 0") and '{"k": 1}' in messages[0]["content"]


def test_json_and_saved_dataset_inputs_with_field_mapping(tmp_path, run_cli):
    rows = [{"uid": f"u{i}", "instruction": f"Q{i}", "answer": f"Line one {i}.\nLine two {i}."} for i in range(3)]
    (tmp_path / "in.json").write_text(json.dumps(rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    mapping = json.dumps({"prompt": "instruction", "response": "answer"})
    with FakeOpenAIServer(quoting_handler) as server:
        for name, src in (("json", tmp_path / "in.json"), ("ds", tmp_path / "ds")):
            rc, report = run_cli(server, tmp_path, "--field_map", mapping, input_path=src, output=tmp_path / f"{name}.jsonl")
            assert rc == 0 and report["done"] == 3
    a, b = read_jsonl(tmp_path / "json.jsonl"), read_jsonl(tmp_path / "ds.jsonl")
    assert sorted(r["id"] for r in a) == ["u0", "u1", "u2"]
    strip = lambda rs: sorted((r["id"], r["prompt"], r["response"], tuple(r["good_spans"])) for r in rs)  # noqa: E731
    assert strip(a) == strip(b)
    meta = {r["id"]: r for r in a}["u1"]["meta"]
    assert meta.pop("_annotation")["template"] == "ultrafeedback_cot.yaml"
    assert meta == rows[1]  # the original fields, under their own names


def test_chat_message_lists_become_text(tmp_path, run_cli):
    chosen = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello there.\nBye now."}]
    write_jsonl(tmp_path / "in.jsonl", [{"prompt_id": "p1", "prompt": "Hi?", "chosen": chosen}])
    with FakeOpenAIServer(quoting_handler) as server:
        rc, _ = run_cli(server, tmp_path, "--field_map", '{"response": "chosen"}')
    assert rc == 0
    (got,) = read_jsonl(tmp_path / "out.jsonl")
    assert got["id"] == "p1" and got["response"] == "Hello there.\nBye now." and got["good_spans"] == ["Hello there."]


def test_missing_field_is_a_clear_error(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "ok", "prompt": "p", "response": "r"}, {"id": "bad-7", "prompt": "p"}])
    with FakeOpenAIServer(quoting_handler) as server:
        rc, _ = run_cli(server, tmp_path)
    err = capsys.readouterr().err
    assert rc == 2 and "bad-7" in err and "'response'" in err and "field_map" in err
    assert server.requests == []


def test_duplicate_ids_are_refused(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "x", "prompt": "p", "response": "r"}, {"id": "x", "prompt": "q", "response": "s"}])
    with FakeOpenAIServer(quoting_handler) as server:
        rc, _ = run_cli(server, tmp_path)
    assert rc == 2 and "share the id 'x'" in capsys.readouterr().err


def test_no_key_and_no_base_url_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    write_jsonl(tmp_path / "in.jsonl", qa_records(1))
    rc = main(["--dataset_path", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl"), "--progress_bar", "false"])
    assert rc == 2 and "OPENAI_API_KEY" in capsys.readouterr().err


def test_azure_openai_deployment_url_and_key_header(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", SECRET_KEY)
    write_jsonl(tmp_path / "in.jsonl", qa_records(1))
    with FakeOpenAIServer(quoting_handler) as server:
        endpoint = server.base_url[: -len("/v1")]
        rc = main(["--dataset_path", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl"), "--progress_bar", "false",
                   "--azure", "true", "--azure_endpoint", endpoint, "--azure_api_version", "2024-06-01",
                   "--model", "my-gpt4o-deployment"])
    assert rc == 0
    assert server.paths[0].startswith("/openai/deployments/my-gpt4o-deployment/chat/completions")
    assert "api-version=2024-06-01" in server.paths[0]
    assert server.request_headers[0]["api-key"] == SECRET_KEY
    assert SECRET_KEY not in capsys.readouterr().out
    assert len(read_jsonl(tmp_path / "o.jsonl")) == 1


def test_progress_bar_shows_rate(tmp_path, api_key, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(3))
    with FakeOpenAIServer(quoting_handler) as server:
        rc = main(["--dataset_path", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl"),
                   "--base_url", server.base_url])
    err = capsys.readouterr().err
    assert rc == 0 and "annotate" in err and "3/3" in err and "rec/s" in err


def test_template_placeholder_the_records_lack_fails_before_any_request(tmp_path, run_cli, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(2))
    (tmp_path / "t.yaml").write_text("user: 'Title: {title}\n<response>\n{response}\n</response>'\n")
    with FakeOpenAIServer(quoting_handler) as server:
        rc, _ = run_cli(server, tmp_path, "--prompt_template", str(tmp_path / "t.yaml"))
    err = capsys.readouterr().err
    assert rc == 2 and "['title']" in err and "r0" in err
    assert server.requests == []
