"""Annotation fails loudly and never touches a file the user did not name as an output: an unreachable server
stops the run naming its URL, skipped failures point at --retry_failures, an empty input is an error, the input
is never an output, a complete last line without its newline is kept, and the report's totals accumulate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.annotation.annotation_test_utils import qa_records, read_jsonl, write_jsonl
from tests.fake_openai import FakeOpenAIServer, Reply, quoting_handler, response_of

from annotation.cli import main
from annotation.runner import repair_torn_tail

FAST = ["--backoff_base_s", "0.01", "--backoff_max_s", "0.02", "--timeout_s", "5", "--progress_bar", "false"]


def _main(args: list[str]) -> int:
    return main(args)


def test_unreachable_server_stops_fast_naming_the_url(tmp_path, api_key, capsys):
    write_jsonl(tmp_path / "in.jsonl", qa_records(6))
    out = tmp_path / "out.jsonl"
    # port 9 (discard) has no listener here: every connection is refused
    rc = _main(["--dataset_path", str(tmp_path / "in.jsonl"), "--output", str(out), "--base_url", "http://127.0.0.1:9/v1",
                "--concurrency", "2", "--max_api_retries", "50", *FAST])
    err = capsys.readouterr().err
    assert rc == 1
    assert "error: stopped: cannot reach http://127.0.0.1:9/v1" in err and "connection attempts in a row failed" in err
    assert "is --base_url right?" in err
    report = json.loads(Path(str(out) + ".report.json").read_text())
    assert report["complete"] is False and report["fatal_error"].startswith("cannot reach http://127.0.0.1:9/v1")
    # no record is blamed for the outage: a rerun with the server up annotates all six
    assert read_jsonl(Path(str(out) + ".failures.jsonl")) == [] and read_jsonl(out) == []
    assert report["requests"] <= 7  # stopped at the 5th failed connection (+ those in flight), not 6 x 51 attempts


def test_a_rerun_that_skips_failed_records_says_so(tmp_path, run_cli, capsys, caplog):
    write_jsonl(tmp_path / "in.jsonl", qa_records(3))

    def handler(body, n):
        return Reply(content="no json") if "Answer 1:" in response_of(body) else quoting_handler(body, n)

    with FakeOpenAIServer(handler) as server:
        run_cli(server, tmp_path, "--max_retries", "0")
        capsys.readouterr()
        rc, report = run_cli(server, tmp_path)
    out = capsys.readouterr()
    assert rc == 0 and report["skipped_failed"] == 1
    assert "1 record(s) failed in an earlier run and were skipped" in out.out
    assert "--retry_failures true" in out.out and "pass --retry_failures true" in caplog.text  # summary and warning


def test_empty_input_is_an_error_and_writes_nothing(tmp_path, api_key, capsys):
    (tmp_path / "in.jsonl").write_text("")
    rc = _main(["--dataset_path", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"),
                "--base_url", "http://127.0.0.1:9/v1", *FAST])
    assert rc == 2 and "error:" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--output", "{input}"], "--output {input} is the input file"),
        (["--output", "{tmp}/out.jsonl", "--failures", "{input}"], "--failures {input} is the input file"),
        (["--output", "{tmp}/out.jsonl", "--report", "{tmp}/out.jsonl"], "--output and --report are the same file"),
        (["--output", "{tmp}"], "--output {tmp} is a directory; name a file"),
    ],
)
def test_paths_that_would_lose_data_are_refused_before_anything_is_written(tmp_path, api_key, capsys, extra, message):
    source = write_jsonl(tmp_path / "in.jsonl", qa_records(2))
    before = source.read_bytes()
    fill = lambda s: s.format(input=source, tmp=tmp_path)  # noqa: E731
    rc = _main(["--dataset_path", str(source), *[fill(a) for a in extra], "--base_url", "http://127.0.0.1:9/v1", *FAST])
    err = capsys.readouterr().err
    assert rc == 2 and f"error: {fill(message)}" in err
    assert source.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_tail_repair_keeps_a_complete_last_line_and_cuts_a_torn_one(tmp_path):
    complete = tmp_path / "complete.jsonl"
    complete.write_text('{"id": "a"}\n{"id": "b"}')  # valid record, newline missing
    assert repair_torn_tail(complete) is False
    assert complete.read_text() == '{"id": "a"}\n{"id": "b"}\n'
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"id": "a"}\n{"id": "b", "crit')
    assert repair_torn_tail(torn) is True and torn.read_text() == '{"id": "a"}\n'
    single = tmp_path / "single.jsonl"
    single.write_text('{"id": "only"}')
    assert repair_torn_tail(single) is False and single.read_text() == '{"id": "only"}\n'


def test_report_totals_accumulate_over_resumed_runs(tmp_path, run_cli):
    write_jsonl(tmp_path / "in.jsonl", qa_records(2))
    def ten_and_ten(body, n):  # every answer reports 10 prompt + 10 completion tokens
        reply = quoting_handler(body, n)
        reply.prompt_tokens = reply.completion_tokens = 10
        return reply

    with FakeOpenAIServer(ten_and_ten) as server:
        _, first = run_cli(server, tmp_path)
        write_jsonl(tmp_path / "in.jsonl", qa_records(5))  # three more records: the rerun does those
        _, second = run_cli(server, tmp_path)
        _, noop = run_cli(server, tmp_path)
    assert (first["tokens_in"], first["cumulative"]["tokens_in"]) == (20, 20)
    assert (second["tokens_in"], second["cumulative"]["tokens_in"]) == (30, 50)
    assert second["cumulative"]["requests"] == 5 and second["cumulative"]["done"] == 5
    assert second["cumulative"]["estimated_cost_usd"] == pytest.approx(first["estimated_cost_usd"] + second["estimated_cost_usd"])
    # a rerun with nothing left keeps the totals (its own numbers are zero)
    assert noop["tokens_in"] == 0 and noop["cumulative"]["tokens_in"] == 50 and noop["cumulative"]["runs"] == 3
