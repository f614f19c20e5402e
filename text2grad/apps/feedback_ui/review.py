"""Review and adjudication: a reviewer sees the items two or more people annotated side by side, with the places
where their marks disagree, and writes one adjudicated record per item.

Adjudicated records go to their own file, ``<output>.adjudicated.jsonl`` (append-only, fsync'd like every record),
so the annotators' records stay one per (item, person) for `--agreement`, and training can use either file:
the adjudicated one where a reviewer decided, the annotators' elsewhere. An adjudicated record has the layout of
every feedback-ui record (``source: "human"``, ``annotator`` the reviewer) plus ``meta.adjudicated_from``: the
annotators whose records it settles. Adjudicating an item again appends a newer record; the last one counts.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from annotation.runner import _Appender, repair_torn_tail
from text2grad.apps.feedback_ui.records import MarkedSpan, human_record, spans_from_offsets, utc_now
from text2grad.apps.feedback_ui.store import FeedbackStore, FeedbackUIError, record_annotator
from text2grad.core.data import iter_jsonl
from text2grad.core.spans import CharSpan, char_labels

__all__ = ["ReviewQueue", "char_label_array", "disagreements"]

LABELS = {"good": 1, "poor": -1}


def char_label_array(response: str, span_offsets: Any) -> np.ndarray:
    """+1 / -1 / 0 per code point of ``response`` from a record's ``span_offsets`` (shape (len(response),))."""
    spans = [CharSpan(int(s["start"]), int(s["end"]), LABELS[s["label"]], "") for s in span_offsets or ()
             if isinstance(s, Mapping) and s.get("label") in LABELS]
    return char_labels(len(response), spans)


def disagreements(response: str, records: list[Mapping[str, Any]]) -> list[list[int]]:
    """``[[start, end], ...]`` (code points): the stretches where the records' marks do not all give the same label
    (whitespace between two disagreeing words included; leading and trailing whitespace left out)."""
    if len(records) < 2 or not response:
        return []
    labels = np.stack([char_label_array(response, r.get("span_offsets")) for r in records])
    differs = (labels != labels[0]).any(axis=0)
    out: list[list[int]] = []
    for index in np.flatnonzero(differs):
        if response[index].isspace():
            continue
        if out and all(response[k].isspace() for k in range(out[-1][1], index)):
            out[-1][1] = int(index) + 1
        else:
            out.append([int(index), int(index) + 1])
    return out


class ReviewQueue:
    """Items with two or more annotations, and the adjudicated records of ``store``'s output (thread-safe)."""

    def __init__(self, store: FeedbackStore, path: Path) -> None:
        self.store = store
        self.path = Path(path)
        self._lock = threading.Lock()
        repair_torn_tail(self.path)
        self.adjudicated: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            for record in iter_jsonl(self.path):
                if "id" in record:
                    self.adjudicated[str(record["id"])] = record
        self.shown_at: dict[tuple[str, str], str] = {}
        self._out = _Appender(self.path, sync_each=True)

    def close(self) -> None:
        with self._lock:
            self._out.close()

    def annotations(self, item_id: str) -> list[dict[str, Any]]:
        """The annotators' records of an item, in annotator order."""
        with self.store._lock:
            found = [r for (i, _), r in self.store.records.items() if i == item_id]
        return sorted(found, key=record_annotator)

    def pending(self) -> list[str]:
        """Items with two or more annotations and no adjudicated record yet, in file order."""
        return [i for i in self.store.by_id if i not in self.adjudicated and len(self.annotations(i)) >= 2]

    def progress(self) -> dict[str, int]:
        shared = [i for i in self.store.by_id if len(self.annotations(i)) >= 2]
        return {"shared": len(shared), "adjudicated": sum(1 for i in shared if i in self.adjudicated)}

    def next_item(self, reviewer: str, after: str | None = None) -> dict[str, Any] | None:
        """The next item to adjudicate (after ``after`` in file order when given, wrapping around), or None."""
        pending = self.pending()
        if not pending:
            return None
        order = self.store.order
        later = [i for i in pending if after is not None and after in order and order[i] > order[after]]
        return self.view(reviewer, (later or pending)[0])

    def view(self, reviewer: str, item_id: str) -> dict[str, Any]:
        item = self.store._known(item_id)
        records = self.annotations(item_id)
        response = str(item["response"])
        key = (item_id, reviewer)
        if key not in self.shown_at:
            self.shown_at[key] = utc_now()
        # the draft starts from what everyone agrees on: the reviewer decides the rest
        agreed = char_label_array(response, records[0].get("span_offsets")) if records else np.zeros(len(response))
        for record in records[1:]:
            agreed = np.where(char_label_array(response, record.get("span_offsets")) == agreed, agreed, 0)
        return {
            "id": item_id,
            "prompt": str(item["prompt"]),
            "response": response,
            "annotations": [{"annotator": record_annotator(r), "critique": r.get("critique", ""),
                             "span_offsets": r.get("span_offsets") or []} for r in records],
            "disagreements": disagreements(response, records),
            "agreed_spans": _runs(response, agreed),
            "adjudicated": self.adjudicated.get(item_id),
            "progress": self.progress(),
        }

    def submit(self, reviewer: str, item_id: str, critique: Any, spans: Any) -> dict[str, Any]:
        """Write the adjudicated record of ``item_id`` and return it."""
        item = self.store._known(item_id)
        if not isinstance(critique, str) or not critique.strip():
            raise FeedbackUIError(400, "write the adjudicated critique before submitting")
        if len(critique) > self.store.max_critique_chars:
            raise FeedbackUIError(413, f"the critique is over {self.store.max_critique_chars} characters")
        if not isinstance(spans, list) or not all(isinstance(s, dict) for s in spans):
            raise FeedbackUIError(400, "spans must be a list of {start, end, label} objects")
        records = self.annotations(item_id)
        if len(records) < 2:
            raise FeedbackUIError(409, f"item {item_id!r} has {len(records)} annotation(s); review needs two or more")
        try:
            marked: list[MarkedSpan] = spans_from_offsets(str(item["response"]), spans, unit="utf16")
        except ValueError as exc:
            raise FeedbackUIError(400, str(exc)) from None
        now = utc_now()
        record = human_record(item, critique, marked, reviewer, self.shown_at.get((item_id, reviewer), now), now,
                              via="feedback-ui review")
        record["meta"]["adjudicated_from"] = [record_annotator(r) for r in records]
        with self._lock:
            self._out.append(record)
            self.adjudicated[item_id] = record
        return record


def _runs(response: str, labels: np.ndarray) -> list[dict[str, Any]]:
    """Maximal runs of one non-zero label as ``[{"start", "end", "label", "text"}]`` (code points), trimmed of
    surrounding whitespace."""
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(labels):
        value = int(labels[index])
        end = index + 1
        while end < len(labels) and int(labels[end]) == value:
            end += 1
        if value != 0:
            start, stop = index, end
            while start < stop and response[start].isspace():
                start += 1
            while stop > start and response[stop - 1].isspace():
                stop -= 1
            if start < stop:
                name = "good" if value > 0 else "poor"
                out.append({"start": start, "end": stop, "label": name, "text": response[start:stop]})
        index = end
    return out
