"""The Label Studio bridge: a labelling config and tasks out, a JSON export back in as annotation records.

Teams that already annotate in Label Studio set up a project with `labelling_config` (the response shown as
text with ``good``/``poor`` Labels over it, the prompt above it, a TextArea for the critique), import the tasks
`write_label_studio_files` writes, and export the project as JSON ("JSON" in Label Studio's export dialog).
`records_from_export` reads that export: one record per (task, annotator), the latest annotation of each
person, in the same layout as a feedback-ui submission (``source: "human"``, ``meta._annotation.critic: "label-studio"``).

Export layout read (Label Studio's documented JSON export): a list of tasks ``{"id", "data": {...},
"annotations": [{"result": [...], "completed_by": ..., "created_at", "updated_at", "was_cancelled"}]}``;
a span is a result ``{"type": "labels", "from_name", "to_name", "value": {"start", "end", "text",
"labels": [...]}}`` and the critique ``{"type": "textarea", "value": {"text": [...]}}``.

Offsets: Label Studio versions differ in what ``start``/``end`` count (code points in current versions,
UTF-16 code units in older ones, which disagree after an emoji), so each span is placed by the first reading
under which the response's slice equals the exported ``text``: code points, then UTF-16, then the occurrence of
``text`` nearest the exported start. A span whose text is nowhere in the response is kept under
``unmatched_spans`` and counted, as the annotate command does with an LLM's unmatched quotes.
"""

from __future__ import annotations

import json
import xml.sax.saxutils as xml_escape
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from text2grad.apps.feedback_ui.records import (
    MarkedSpan,
    SpanError,
    codepoint_offsets,
    human_record,
    repair_text,
    spans_from_offsets,
)
from text2grad.core.data import DataError

__all__ = [
    "LABELS_NAME",
    "CRITIQUE_NAME",
    "RESPONSE_NAME",
    "ImportReport",
    "labelling_config",
    "tasks_for",
    "write_label_studio_files",
    "records_from_export",
]

LABELS_NAME, CRITIQUE_NAME, RESPONSE_NAME, PROMPT_NAME = "span", "critique", "response", "prompt"
CONFIG_FILE, TASKS_FILE = "label_studio_config.xml", "label_studio_tasks.json"


def labelling_config() -> str:
    """The Label Studio labelling config (XML) whose exports `records_from_export` reads."""
    names = {k: xml_escape.quoteattr(v) for k, v in
             {"labels": LABELS_NAME, "critique": CRITIQUE_NAME, "response": RESPONSE_NAME, "prompt": PROMPT_NAME}.items()}
    return "\n".join([
        "<View>",
        # (an XML comment may not contain two hyphens in a row, so it names the option without its dashes)
        "  <!-- Written by text2grad feedback-ui; its import_label_studio option reads this project's JSON export -->",
        # Without pre-wrap Label Studio trims spaces when it shows the text and counts offsets on the trimmed text.
        "  <Style>.htx-text { white-space: pre-wrap; }</Style>",
        '  <Header value="Prompt"/>',
        f'  <Text name={names["prompt"]} value="$prompt" selectionEnabled="false"/>',
        '  <Header value="Response: select text, then press a label"/>',
        f'  <Labels name={names["labels"]} toName={names["response"]}>',
        '    <Label value="good" background="#2e7d32" hotkey="g"/>',
        '    <Label value="poor" background="#c62828" hotkey="p"/>',
        "  </Labels>",
        f'  <Text name={names["response"]} value="$response" saveTextResult="yes" granularity="symbol"/>',
        '  <Header value="Critique"/>',
        f'  <TextArea name={names["critique"]} toName={names["response"]} editable="true" maxSubmissions="1" rows="4" '
        'placeholder="What is good or poor in the response, and why?" required="true"/>',
        "</View>",
        "",
    ])


def tasks_for(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Label Studio tasks (``[{"data": {...}}]``, its import format) for mapped input records."""
    return [{"data": {"id": str(item["id"]), "prompt": str(item["prompt"]), "response": str(item["response"])}}
            for item in items]


def write_label_studio_files(items: Sequence[Mapping[str, Any]], folder: Path) -> tuple[Path, Path]:
    """Write the labelling config and the tasks into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    config, tasks = folder / CONFIG_FILE, folder / TASKS_FILE
    config.write_text(labelling_config(), encoding="utf-8")
    tasks.write_text(json.dumps(tasks_for(items), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return config, tasks


class ImportReport:
    """Counts of one import, printed at the end; ``problems`` names each annotation that was not imported and why."""

    def __init__(self) -> None:
        self.tasks = 0
        self.annotations = 0
        self.records = 0
        self.already_there = 0
        self.cancelled = 0
        self.superseded = 0
        self.without_critique = 0
        self.malformed = 0
        self.without_annotator = 0
        self.repaired_text = 0
        self.spans = 0
        self.spans_relocated = 0
        self.spans_unmatched = 0
        self.problems: list[str] = []

    def refuse(self, counter: str, where: str, why: str) -> None:
        setattr(self, counter, getattr(self, counter) + 1)
        self.problems.append(f"{where}: {why}")

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _annotator(annotation: Mapping[str, Any]) -> str | None:
    """Label Studio names the annotator by user id (an int), or by a user object in some exports; None if neither."""
    who = annotation.get("completed_by")
    if isinstance(who, Mapping):
        who = who.get("email") or who.get("username") or who.get("id")
    return f"label-studio:{who}" if who not in (None, "") else None


def _when(annotation: Mapping[str, Any]) -> str:
    return str(annotation.get("updated_at") or annotation.get("created_at") or "")


def _place(response: str, value: Mapping[str, Any]) -> tuple[int, int] | None:
    """Code point interval of an exported span (see the module doc), or None when its text is not in the response."""
    start, end, text = value.get("start"), value.get("end"), value.get("text")
    numeric = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)) and 0 <= start < end
    if text is not None and not isinstance(text, str):
        text = str(text)
    if text is None:
        return (start, end) if numeric and 0 <= start < end <= len(response) else None
    if numeric:
        if response[start:end] == text:
            return start, end
        table = codepoint_offsets(response)
        if start in table and end in table and response[table[start]:table[end]] == text:
            return table[start], table[end]
    if not text:
        return None
    hits, position = [], response.find(text)
    while position >= 0:
        hits.append(position)
        position = response.find(text, position + 1)
    if not hits:
        return None
    nearest = min(hits, key=lambda p: abs(p - start)) if numeric else hits[0]
    return nearest, nearest + len(text)


def _item_of(task: Mapping[str, Any], where: str) -> dict[str, Any]:
    data = task.get("data")
    if not isinstance(data, Mapping) or "response" not in data or "prompt" not in data:
        raise DataError(f"{where}: task data has no 'prompt' and 'response' (it has {sorted(data or {})}); export a "
                        "project whose tasks came from `text2grad feedback-ui --label_studio_dir`")
    item_id = data.get("id", task.get("id"))
    meta = {k: v for k, v in data.items() if k not in ("id", "prompt", "response")}
    meta["label_studio_task"] = task.get("id")
    return {"id": str(item_id), "prompt": str(data["prompt"]), "response": str(data["response"]), "meta": meta}


def _looks_like_json_min(tasks: list[Any]) -> bool:
    """Label Studio's JSON-MIN export: flat rows (the task's data and each control's value side by side)."""
    first = tasks[0] if tasks else None
    return isinstance(first, Mapping) and "data" not in first and "annotations" not in first and (
        "response" in first or "annotation_id" in first or "annotator" in first)


def records_from_export(path: Path, done: set[tuple[str, str]], report: ImportReport) -> Iterator[dict[str, Any]]:
    """Records from a Label Studio JSON export, skipping (item id, annotator) pairs in ``done`` (the output's).

    Per task and annotator the latest annotation counts (earlier ones are ``superseded``); one without an annotator
    is named by its annotation id. Cancelled annotations, those without a critique and malformed ones are not
    imported: each is counted and named in ``report.problems``; none stops the import. The whole export is read
    before the first record is yielded, so a file that is not an export (DataError naming the task) writes nothing.
    """
    try:
        tasks = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"Label Studio export {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is not JSON ({exc}); export the project as 'JSON' in Label Studio") from None
    if not isinstance(tasks, list):
        raise DataError(f"{path} must be a list of tasks (Label Studio's JSON export), got {type(tasks).__name__}")
    if _looks_like_json_min(tasks):
        raise DataError(f"{path} is Label Studio's JSON-MIN export (one flat row per annotation, without the span "
                        "offsets' context); export the project again choosing 'JSON', not 'JSON-MIN'")
    records = []
    for n, task in enumerate(tasks):
        where = f"task {n} (id {task.get('id') if isinstance(task, Mapping) else '?'})"
        if not isinstance(task, Mapping):
            raise DataError(f"{path}: {where} is a {type(task).__name__}, expected an object")
        report.tasks += 1
        item, repaired = repair_text(_item_of(task, f"{path}: {where}"))
        report.repaired_text += repaired
        latest: dict[str, tuple[Mapping[str, Any], str]] = {}
        annotations = task.get("annotations") or []
        if not isinstance(annotations, list):
            report.refuse("malformed", where, f"'annotations' is a {type(annotations).__name__}, not a list")
            continue
        for k, annotation in enumerate(annotations):
            report.annotations += 1
            here = f"{where}, annotation {k}"
            if not isinstance(annotation, Mapping):
                report.refuse("malformed", here, f"is a {type(annotation).__name__}, not an object")
                continue
            here = f"{where}, annotation {k} (id {annotation.get('id')})"
            if annotation.get("was_cancelled"):
                report.cancelled += 1
                continue
            annotator = _annotator(annotation)
            if annotator is None:
                report.without_annotator += 1
                annotator = f"label-studio:annotation-{annotation.get('id', f'{n}.{k}')}"
            earlier = latest.get(annotator)
            if earlier is not None:
                report.superseded += 1
                if _when(annotation) < _when(earlier[0]):
                    continue
            latest[annotator] = (annotation, here)
        for annotator, (annotation, here) in latest.items():
            if (item["id"], annotator) in done:
                report.already_there += 1
                continue
            record = _record(item, annotation, annotator, report, here)
            if record is not None:
                done.add((item["id"], annotator))
                records.append(record)
    for record in records:
        report.records += 1
        yield record


def _record(item: Mapping[str, Any], annotation: Mapping[str, Any], annotator: str, report: ImportReport,
            where: str) -> dict[str, Any] | None:
    """The record of one annotation, or None (counted in ``report``) when it cannot be one."""
    response = item["response"]
    results = annotation.get("result") or []
    if not isinstance(results, list):
        report.refuse("malformed", where, f"'result' is a {type(results).__name__}, not a list")
        return None
    critiques: list[str] = []
    offsets: list[dict[str, Any]] = []
    unmatched: dict[str, list[str]] = {"good": [], "poor": []}
    spans_before = (report.spans, report.spans_relocated, report.spans_unmatched)
    for result in results:
        if not isinstance(result, Mapping) or not isinstance(result.get("value") or {}, Mapping):
            report.refuse("malformed", where, f"a result is {json.dumps(result)[:60]}, not a Label Studio result")
            report.spans, report.spans_relocated, report.spans_unmatched = spans_before
            return None
        value, repaired = repair_text(dict(result.get("value") or {}))
        report.repaired_text += repaired
        if result.get("type") == "textarea":
            texts = value.get("text") or []
            critiques += [texts] if isinstance(texts, str) else [str(t) for t in texts]
        elif result.get("type") == "labels":
            labels = value.get("labels") or ()
            for label in [labels] if isinstance(labels, str) else labels:
                if label not in ("good", "poor"):
                    continue
                report.spans += 1
                placed = _place(response, value)
                if placed is None:
                    report.spans_unmatched += 1
                    unmatched[label].append(str(value.get("text", "")))
                    continue
                if (placed[0], placed[1]) != (value.get("start"), value.get("end")):
                    report.spans_relocated += 1
                offsets.append({"start": placed[0], "end": placed[1], "label": label})
    critique = "\n".join(c.strip() for c in critiques if c.strip())
    if not critique:
        report.refuse("without_critique", where, "has no critique (the feedback page refuses those too); write one "
                                                 "in Label Studio and export again")
        report.spans, report.spans_relocated, report.spans_unmatched = spans_before
        return None
    try:
        spans: list[MarkedSpan] = spans_from_offsets(response, offsets, unit="codepoint", allow_overlap=True,
                                                     check_clusters=False)
    except SpanError as exc:
        report.refuse("malformed", where, f"{exc}; fix the annotation in Label Studio and export again")
        report.spans, report.spans_relocated, report.spans_unmatched = spans_before
        return None
    started = str(annotation.get("created_at") or "")
    submitted = _when(annotation)
    extra = {"label_studio_annotation": annotation.get("id"), "lead_time_s": annotation.get("lead_time")}
    record = human_record(item, critique, spans, annotator, started, submitted, via="label-studio",
                          extra={k: v for k, v in extra.items() if v is not None})
    record["unmatched_spans"] = unmatched
    return record
