"""The Label Studio bridge: the config and tasks the command writes, and an export in Label Studio's documented JSON
layout read back as records (code point and UTF-16 offsets, cancelled annotations, unmatched text, resume)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from tests.apps.feedback_ui.fbui_testlib import ITEMS, read_records, write_items

from text2grad.apps.feedback_ui import main
from text2grad.apps.feedback_ui.agreement import token_labels_of_record

RESPONSE_A = ITEMS[0]["response"]  # "Alex 😀 moved to Oslo for a job. Oslo is cold."
SECOND_OSLO = RESPONSE_A.rindex("Oslo")
JOB = RESPONSE_A.index("for a job")


def _labels(start, end, text, label):
    return {"id": f"r{start}", "from_name": "span", "to_name": "response", "type": "labels", "origin": "manual",
            "value": {"start": start, "end": end, "text": text, "labels": [label]}}


def _export() -> list[dict]:
    """Two tasks as Label Studio exports them (Export > JSON) from a project set up with our config and tasks."""
    return [
        {
            "id": 11, "project": 2, "created_at": "2026-11-20T10:00:00.000000Z",
            "data": {"id": "a", "prompt": ITEMS[0]["prompt"], "response": RESPONSE_A},
            "annotations": [
                {
                    "id": 101, "completed_by": 3, "was_cancelled": False, "ground_truth": False, "lead_time": 41.5,
                    "created_at": "2026-11-20T10:05:00.000000Z", "updated_at": "2026-11-20T10:06:00.000000Z", "task": 11,
                    "result": [
                        _labels(SECOND_OSLO, SECOND_OSLO + 4, "Oslo", "poor"),  # code points (current versions)
                        _labels(JOB + 1, JOB + 10, "for a job", "good"),  # UTF-16 units (older versions): + 1 for the emoji
                        {"id": "t1", "from_name": "critique", "to_name": "response", "type": "textarea", "origin": "manual",
                         "value": {"text": ["Oslo is not cold in the post; the city is wrong."]}},
                    ],
                },
                {"id": 102, "completed_by": {"id": 4, "email": "bob@example.org"}, "was_cancelled": True, "result": [],
                 "created_at": "2026-11-20T10:07:00.000000Z", "task": 11},
            ],
            "predictions": [],
        },
        {
            "id": 12, "project": 2,
            "data": {"id": "c", "prompt": ITEMS[2]["prompt"], "response": ITEMS[2]["response"]},
            "annotations": [
                {
                    "id": 103, "completed_by": {"id": 4, "email": "bob@example.org"}, "was_cancelled": False,
                    "created_at": "2026-11-20T11:00:00.000000Z", "updated_at": "2026-11-20T11:00:30.000000Z",
                    "result": [
                        _labels(19, 31, "return a + b", "poor"),  # text that is not in the response
                        _labels(0, 14, "def add(a, b):", "good"),
                        {"from_name": "critique", "to_name": "response", "type": "textarea",
                         "value": {"text": ["Subtracts.", "Name is fine."]}},
                    ],
                },
            ],
        },
    ]


def test_the_written_config_labels_the_response_good_or_poor_and_asks_for_a_critique(tmp_path, capsys):
    data = write_items(tmp_path / "items.jsonl")
    assert main(["--dataset_path", str(data), "--label_studio_dir", str(tmp_path / "ls")]) == 0
    view = ET.fromstring((tmp_path / "ls" / "label_studio_config.xml").read_text())
    labels = view.find("Labels")
    assert labels.get("name") == "span" and labels.get("toName") == "response"
    assert [label.get("value") for label in labels.findall("Label")] == ["good", "poor"]
    texts = {t.get("name"): t for t in view.findall("Text")}
    assert texts["response"].get("value") == "$response" and texts["prompt"].get("value") == "$prompt"
    area = view.find("TextArea")
    assert area.get("name") == "critique" and area.get("toName") == "response"
    assert "pre-wrap" in view.find("Style").text  # offsets count every space only with pre-wrap
    tasks = json.loads((tmp_path / "ls" / "label_studio_tasks.json").read_text())
    assert tasks[0] == {"data": {"id": "a", "prompt": ITEMS[0]["prompt"], "response": RESPONSE_A}} and len(tasks) == 4
    assert "--import_label_studio" in capsys.readouterr().out


def test_an_export_becomes_records_and_a_second_import_adds_nothing(tmp_path, capsys):
    export = tmp_path / "export.json"
    export.write_text(json.dumps(_export(), ensure_ascii=False))
    output = tmp_path / "human.jsonl"
    assert main(["--import_label_studio", str(export), "--output", str(output), "--progress_bar", "false"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["records"], report["cancelled"], report["spans"], report["spans_relocated"], report["spans_unmatched"]) \
        == (2, 1, 4, 1, 1)
    a, c = read_records(output)
    assert (a["id"], a["annotator"], a["source"]) == ("a", "label-studio:3", "human")
    assert a["span_offsets"] == [
        {"start": JOB, "end": JOB + 9, "label": "good", "text": "for a job"},
        {"start": SECOND_OSLO, "end": SECOND_OSLO + 4, "label": "poor", "text": "Oslo"},
    ]
    assert (a["good_spans"], a["poor_spans"]) == (["for a job"], ["Oslo"])
    assert a["critique"] == "Oslo is not cold in the post; the city is wrong."
    assert (a["started_at"], a["submitted_at"]) == ("2026-11-20T10:05:00.000000Z", "2026-11-20T10:06:00.000000Z")
    assert a["meta"]["_annotation"]["critic"] == "label-studio" and a["meta"]["_annotation"]["lead_time_s"] == 41.5
    # the marked (second) Oslo, not the first one a quote would find
    assert token_labels_of_record(a)[:5] == [0, 0, 0, 0, 0] and -1 in token_labels_of_record(a)
    assert c["annotator"] == "label-studio:bob@example.org"
    assert c["unmatched_spans"] == {"good": [], "poor": ["return a + b"]} and c["good_spans"] == ["def add(a, b):"]
    assert c["critique"] == "Subtracts.\nName is fine."
    before = output.read_bytes()
    assert main(["--import_label_studio", str(export), "--output", str(output), "--progress_bar", "false"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["records"], again["already_there"]) == (0, 2) and output.read_bytes() == before


def test_a_file_that_is_not_an_export_is_refused_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tasks": []}))
    assert main(["--import_label_studio", str(bad), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "must be a list of tasks" in capsys.readouterr().err
    bad.write_text(json.dumps([{"id": 1, "data": {"text": "hello"}, "annotations": []}]))
    assert main(["--import_label_studio", str(bad), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "task data has no 'prompt' and 'response'" in capsys.readouterr().err


def _task(task_id, item, annotations):
    return {"id": task_id, "data": {"id": item["id"], "prompt": item["prompt"], "response": item["response"]},
            "annotations": annotations}


def _critique(text):
    return {"from_name": "critique", "to_name": "response", "type": "textarea", "value": {"text": [text]}}


def test_awkward_exports_import_what_is_sound_and_name_the_rest(tmp_path, capsys):
    """Malformed annotations, missing annotators, repeats, empty results, string labels and negative offsets."""
    oslo = RESPONSE_A.index("Oslo")
    export = tmp_path / "export.json"
    export.write_text(json.dumps([
        _task(1, ITEMS[0], [
            "not an annotation",  # a string where an annotation belongs
            {"id": 201, "completed_by": 8, "result": 7},  # an int result
            {"id": 202, "completed_by": 3, "updated_at": "2026-11-20T10:00:00Z", "result": [_critique("older")]},
            {"id": 203, "completed_by": 3, "updated_at": "2026-11-20T11:00:00Z", "result": [  # the same person, later
                _critique("newer"),
                {"type": "labels", "value": {"start": oslo, "end": oslo + 4, "text": "Oslo", "labels": "poor"}}]},
            {"id": 204, "result": [_critique("nobody signed this"),  # no completed_by
                                   {"type": "labels", "value": {"start": -5, "end": -1, "text": "cold", "labels": ["poor"]}}]},
            {"id": 205, "completed_by": 9, "result": []},  # an empty result: no critique
        ]),
        _task(2, ITEMS[3], [{"id": 206, "completed_by": 3, "result": [_critique("fine \ud83d")]}]),
    ]), encoding="utf-8")
    output = tmp_path / "out.jsonl"
    assert main(["--import_label_studio", str(export), "--output", str(output), "--progress_bar", "false"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["records"], report["malformed"], report["superseded"], report["without_critique"],
            report["without_annotator"], report["already_there"], report["repaired_text"]) == (3, 2, 1, 1, 1, 0, 1)
    assert any("annotation 0" in p and "str" in p for p in report["problems"])
    assert any("id 205" in p and "no critique" in p for p in report["problems"])
    assert "not imported" in captured.err
    records = {(r["id"], r["annotator"]): r for r in read_records(output)}
    latest = records[("a", "label-studio:3")]
    assert latest["critique"] == "newer" and latest["span_offsets"] == [
        {"start": oslo, "end": oslo + 4, "label": "poor", "text": "Oslo"}]  # labels: "poor" as a plain string
    unsigned = records[("a", "label-studio:annotation-204")]
    cold = RESPONSE_A.index("cold")
    assert unsigned["span_offsets"] == [{"start": cold, "end": cold + 4, "label": "poor", "text": "cold"}]
    assert records[("d", "label-studio:3")]["critique"] == "fine \ufffd"
    # importing again adds nothing, and says so
    assert main(["--import_label_studio", str(export), "--output", str(output), "--progress_bar", "false"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["records"], again["already_there"]) == (0, 3)


def test_a_json_min_export_is_named_as_such(tmp_path, capsys):
    flat = tmp_path / "min.json"
    flat.write_text(json.dumps([{"id": 11, "prompt": "p", "response": "r", "critique": "c", "annotator": 3,
                                 "annotation_id": 101, "span": [{"start": 0, "end": 1, "text": "r", "labels": ["poor"]}]}]))
    assert main(["--import_label_studio", str(flat), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "JSON-MIN" in capsys.readouterr().err
