"""The command: --help, refusals before anything is served, one server per file, kill -9 loses nothing, --agreement."""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.apps.feedback_ui.fbui_testlib import ITEMS, REPO, Server, read_records, write_items
from tests.test_cli_conventions import CONFIGS

from text2grad.apps.cli import main as text2grad
import text2grad.apps.feedback_ui.cli as feedback_ui
from text2grad.apps.feedback_ui import main
from text2grad.core.config import parse_config


def _call(server: Server, path: str, body: dict, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json", **({"X-Access-Token": token} if token else {})}
    request = urllib.request.Request(server.base + path, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def test_help_documents_the_command(capsys):
    with pytest.raises(SystemExit) as done:
        text2grad(["feedback-ui", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: text2grad feedback-ui")
    for flag in ("--dataset_path", "--output", "--annotator", "--annotations_per_item", "--lease_minutes", "--host",
                 "--access_token", "--agreement", "--label_studio_dir", "--import_label_studio"):
        assert flag in out, flag
    text2grad(["--help"])
    assert "feedback-ui" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--output", "{data}"], "is the input file"),
    (["--output", "{tmp}"], "is a directory"),
    (["--output", "{tmp}/o.jsonl", "--agreement", "true", "--label_studio_dir", "{tmp}/ls"], "separate jobs"),
    (["--output", "{tmp}/o.jsonl", "--annotator", "al ice"], "is not a valid id"),
    (["--output", "{tmp}/o.jsonl", "--access_token", "short"], "at least 16 characters"),
    (["--output", "{tmp}/o.jsonl", "--annotations_per_item", "0"], "annotations_per_item must be > 0"),
    (["--output", "{tmp}/o.jsonl", "--dataset_path", "{tmp}/no_response.jsonl"], "lacks field(s) ['response']"),
])
def test_bad_input_is_refused_before_anything_is_served(tmp_path, capsys, monkeypatch, args, message):
    def serve_forever(*unused):
        raise AssertionError("the command started serving instead of refusing its input")

    monkeypatch.setattr(feedback_ui, "serve", serve_forever)
    data = write_items(tmp_path / "items.jsonl")
    write_items(tmp_path / "no_response.jsonl", [{"id": "1", "prompt": "p", "answer": "r"}])
    argv = ["--dataset_path", str(data), "--port", "0"] + [a.format(data=data, tmp=tmp_path) for a in args]
    try:
        rc = main(argv)
    except SystemExit as exc:  # the parser's own refusals
        rc = exc.code
    assert rc == 2 and message in capsys.readouterr().err


def test_a_second_server_on_the_same_file_is_refused_and_kill_9_loses_no_submission(tmp_path, capsys):
    data = write_items(tmp_path / "items.jsonl")
    output = tmp_path / "out.jsonl"
    args = ("--dataset_path", str(data), "--output", str(output))
    server = Server(*args)
    try:
        assert main([*args, "--port", "0"]) == 2
        assert "is in use by feedback-ui" in capsys.readouterr().err
        assert _call(server, "/api/next", {"annotator": "alice"})["item"]["id"] == "a"
        start = len(ITEMS[0]["response"][: ITEMS[0]["response"].index("Oslo")].encode("utf-16-le")) // 2
        saved = _call(server, "/api/submit", {"annotator": "alice", "id": "a", "critique": "Wrong city.",
                                               "spans": [{"start": start, "end": start + 4, "label": "poor", "text": "Oslo"}]})
        assert saved["saved"] and saved["record"]["span_offsets"][0]["start"] == ITEMS[0]["response"].index("Oslo")
    finally:
        server.kill()  # SIGKILL right after the answer: no shutdown code runs
    assert [r["id"] for r in read_records(output)] == ["a"]
    again = Server(*args)
    try:
        assert _call(again, "/api/next", {"annotator": "alice"})["item"]["id"] == "b"
    finally:
        assert again.stop() in (0, 130)


def test_text_that_cannot_be_written_is_repaired_at_load_and_the_record_named(tmp_path, capsys):
    """Half an emoji (valid JSON "\\ud83d") once made every /api/next answer 500 and --label_studio_dir crash."""
    data = tmp_path / "items.jsonl"
    data.write_text('{"id": "cut", "prompt": "p", "response": "an emoji cut in half: \\ud83d"}\n'
                    '{"id": "empty", "prompt": "p", "response": ""}\n', encoding="utf-8")
    assert main(["--dataset_path", str(data), "--label_studio_dir", str(tmp_path / "ls")]) == 0
    err = capsys.readouterr().err
    assert "record 0 (id 'cut'): unpaired surrogate(s) (1 in response) replaced by U+FFFD" in err
    assert "record 1 (id 'empty') has an empty response" in err
    tasks = json.loads((tmp_path / "ls" / "label_studio_tasks.json").read_text(encoding="utf-8"))
    assert tasks[0]["data"]["response"] == "an emoji cut in half: \ufffd"
    output = tmp_path / "out.jsonl"
    server = Server("--dataset_path", str(data), "--output", str(output))
    try:
        assert "record 0 (id 'cut')" in server.output
        item = _call(server, "/api/next", {"annotator": "alice"})["item"]
        assert item["response"] == "an emoji cut in half: \ufffd"
        _call(server, "/api/submit", {"annotator": "alice", "id": "cut", "critique": "cut", "spans": []})
    finally:
        assert server.stop() in (0, 130)
    assert read_records(output)[0]["response"] == "an emoji cut in half: \ufffd"


def test_annotators_get_a_token_each_kept_private_and_reused_on_restart(tmp_path):
    data = write_items(tmp_path / "items.jsonl")
    people = tmp_path / "people.txt"
    people.write_text("alice\n# a comment\nbob\n")
    output = tmp_path / "out.jsonl"
    tokens_file = tmp_path / "out.jsonl.tokens.json"
    server = Server("--dataset_path", str(data), "--output", str(output), "--annotators", "alice,bob")
    try:
        assert "each person's own address is in" in server.output and "?token=" not in server.output
        tokens = json.loads(tokens_file.read_text())["annotators"]
        assert (tokens_file.stat().st_mode & 0o777) == 0o600 and sorted(tokens) == ["alice", "bob"]
        assert tokens["alice"]["address"] == f"{server.base}/?token={tokens['alice']['token']}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            _call(server, "/api/next", {"annotator": "alice"})  # on loopback too: the id needs its token
        assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as impersonating:
            _call(server, "/api/next", {"annotator": "alice"}, tokens["bob"]["token"])
        assert impersonating.value.code == 403
        assert _call(server, "/api/next", {}, tokens["bob"]["token"])["item"]["id"] == "a"
    finally:
        server.stop()
    again = Server("--dataset_path", str(data), "--output", str(output), "--annotators", str(people))
    try:
        kept = json.loads(tokens_file.read_text())["annotators"]
        assert {who: t["token"] for who, t in kept.items()} == {who: t["token"] for who, t in tokens.items()}
    finally:
        again.stop()


def test_agreement_reports_token_f1_of_double_annotated_items(tmp_path, capsys):
    response = ITEMS[3]["response"]  # "Check local listings and compare prices."
    base = {"id": "d", "prompt": ITEMS[3]["prompt"], "response": response, "source": "human"}
    records = [
        {**base, "annotator": "alice", "good_spans": ["compare prices"], "poor_spans": []},
        {**base, "annotator": "bob", "good_spans": ["compare prices"], "poor_spans": ["Check"]},
    ]
    output = tmp_path / "out.jsonl"
    output.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["--output", str(output), "--agreement", "true"]) == 0
    out = capsys.readouterr().out
    assert "annotated by two or more people: 1" in out and "alice vs bob: poor 0.000, good 1.000" in out
    summary = json.loads((tmp_path / "out.jsonl.agreement.json").read_text())
    assert summary["overall"]["any"]["micro_f1"] == pytest.approx(2 * 2 / (2 + 3))


def _readme_commands() -> list[list[str]]:
    """The ``text2grad <command> ...`` lines of the package README (continuation lines joined), as argv lists."""
    text = (REPO / "text2grad" / "apps" / "feedback_ui" / "README.md").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(line.strip(), comments=True) for line in joined.splitlines() if line.strip().startswith("text2grad ")]


def test_every_command_in_the_readme_parses(monkeypatch):
    """The loop's commands exist and take these flags and values (nothing runs: each is parsed with its config)."""
    monkeypatch.chdir(REPO)  # the YAML paths are relative to the repository root
    commands = _readme_commands()
    assert [c[1] for c in commands[:4]] == ["eval-summarization", "feedback-ui", "train-rm", "train-policy"]
    for argv in commands:
        cfg = parse_config(CONFIGS[argv[1]], argv[2:])
        assert isinstance(cfg, CONFIGS[argv[1]]), argv


def test_kill_9_while_revisions_are_in_flight_keeps_one_whole_record_per_person(tmp_path):
    """Revising rewrites the file (new file, fsync, rename) while others append: a kill at any moment must leave
    every acknowledged revision (or a newer one that was in flight) and exactly one line per (item, person)."""
    data = write_items(tmp_path / "items.jsonl")
    output = tmp_path / "out.jsonl"
    args = ("--dataset_path", str(data), "--output", str(output), "--annotations_per_item", "3")
    server = Server(*args)
    people = ["ann", "ben", "cat"]
    acked: dict[tuple[str, str], int] = {}
    attempted: dict[tuple[str, str], int] = {}
    stop = threading.Event()

    def work(who: str) -> None:
        try:
            done = []
            for _ in ITEMS:
                item = _call(server, "/api/next", {"annotator": who})["item"]
                if item is None:
                    break
                attempted[(item["id"], who)] = 0
                _call(server, "/api/submit", {"annotator": who, "id": item["id"], "critique": f"{who} v0", "spans": []})
                acked[(item["id"], who)] = 0
                done.append(item["id"])
            version = 0
            while not stop.is_set():
                version += 1
                for item_id in done:
                    attempted[(item_id, who)] = version
                    _call(server, "/api/submit", {"annotator": who, "id": item_id, "critique": f"{who} v{version}",
                                                  "spans": []})
                    acked[(item_id, who)] = version
        except (OSError, ValueError):  # the server was killed under us
            pass

    threads = [threading.Thread(target=work, args=(who,)) for who in people]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while sum(v >= 2 for v in acked.values()) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.kill()  # mid-flight: the threads are revising as fast as the server answers
    stop.set()
    for thread in threads:
        thread.join(10)
    assert sum(v >= 2 for v in acked.values()) >= 6, "the revisions did not get going before the kill"
    again = Server(*args)  # the restart cuts a torn line, if any
    try:
        records = read_records(output)
        keys = [(r["id"], r["annotator"]) for r in records]
        assert len(keys) == len(set(keys))  # one line per (item, person)
        assert set(acked) <= set(keys)  # nothing acknowledged was lost
        for record in records:
            key = (record["id"], record["annotator"])
            version = int(record["critique"].rsplit("v", 1)[1])
            assert acked.get(key, 0) <= version <= attempted[key], (key, version, acked.get(key), attempted[key])
        resumed = _call(again, "/api/next", {"annotator": "ann"})
        assert resumed["progress"]["yours"] == sum(1 for _, who in keys if who == "ann")
    finally:
        assert again.stop() in (0, 130)
