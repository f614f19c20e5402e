"""Loading records from JSONL / JSON / datasets directories, with clear errors."""

import json

import datasets
import pytest

from tests.concurrent_writers import write_at_once
from text2grad.core.data import DataError, append_jsonl, iter_jsonl, load_records, record_id, render_template, write_jsonl


def test_jsonl_json_and_field_map(tmp_path):
    recs = [{"id": "a", "post": "p1", "summary": "s1"}, {"id": "b", "post": "p2", "summary": "s2"}]
    write_jsonl(tmp_path / "d.jsonl", recs)
    (tmp_path / "d.json").write_text(json.dumps({"data": recs}))
    for path in ("d.jsonl", "d.json"):
        out = load_records(tmp_path / path, field_map={"prompt": "post", "response": "summary"}, required=("prompt", "response"))
        assert [r["prompt"] for r in out] == ["p1", "p2"] and out[1]["response"] == "s2"
    assert len(load_records(tmp_path / "d.jsonl", limit=1)) == 1


def test_writers_of_the_same_file_at_once_neither_fail_nor_tear_it(tmp_path):
    # two study processes on one task instance both write its data files; each must land whole
    path = tmp_path / "d.jsonl"
    versions = [[{"writer": w, "line": i, "text": "x" * 200} for i in range(50)] for w in range(4)]
    assert write_at_once(lambda records: write_jsonl(path, records), versions, times=100) == []
    assert list(iter_jsonl(path)) in versions
    assert [p.name for p in tmp_path.iterdir()] == ["d.jsonl"]


def test_missing_field_error_names_record_and_field(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"id": "ok", "prompt": "x"}, {"id": "rec-7", "text": "y"}])
    with pytest.raises(DataError, match=r"rec-7.*\['prompt'\]"):
        load_records(tmp_path / "d.jsonl", required=("prompt",))


def test_bad_line_and_torn_last_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": 1}\n{"id": 2\n{"id": 3}\n')
    with pytest.raises(DataError, match=":2: not valid JSON"):
        list(iter_jsonl(p))
    p.write_text('{"id": 1}\n{"id": 2, "x": "tru')  # a crash mid-append
    assert [r["id"] for r in iter_jsonl(p)] == [1]


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_records(tmp_path / "nope.jsonl")


def test_datasets_directory(tmp_path):
    datasets.Dataset.from_list([{"prompt": "q", "response": "r"}]).save_to_disk(str(tmp_path / "ds"))
    assert load_records(tmp_path / "ds") == [{"prompt": "q", "response": "r"}]


def test_append_and_template(tmp_path):
    with (tmp_path / "o.jsonl").open("a") as fh:
        append_jsonl(fh, {"id": "x", "v": "ü"})
    assert list(iter_jsonl(tmp_path / "o.jsonl")) == [{"id": "x", "v": "ü"}]
    assert render_template("POST: {post}\nTL;DR:", {"post": "hi"}) == "POST: hi\nTL;DR:"
    with pytest.raises(DataError, match=r"\['post'\]"):
        render_template("{post}", {"id": "r1", "text": "x"})
    assert record_id({"task_id": "HumanEval/0"}, 3) == "HumanEval/0" and record_id({}, 3) == "3"


def test_conversation_fields_render_as_their_last_message():
    # UltraFeedback-binarized style: chosen / rejected are whole conversations ending with the reply
    record = {
        "prompt": "Name a prime.",
        "chosen": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"}],
        "rejected": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "9"}],
    }
    assert render_template("{prompt} -> {chosen} / {rejected}", record) == "Name a prime. -> 7 / 9"
    assert render_template("{x}", {"x": [1, 2]}) == "[1, 2]"  # other lists are left as they are
    assert render_template("{x}", {"x": []}) == "[]"

