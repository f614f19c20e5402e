"""Who gets which item, and the record file: the state behind the feedback page.

`FeedbackStore` holds the input items, the records already in the output, each person's skips and the
leases. Guarantees, the annotate command's:

- **Append-only and crash-safe.** A submission is one ``os.write`` of one complete JSON line to the output
  opened with O_APPEND, fsync'd before the page hears "saved" (`annotation.runner._Appender` with
  ``sync_each``), so a server killed at any moment loses at most the submission being written. A torn last
  line from such a kill is cut on the next start (`annotation.runner.repair_torn_tail`). The one exception is a
  person revising their own earlier submission: that record is replaced in place by writing a new file and
  renaming it over the old one (atomic, like the annotate command's ``--retry_failures``), so the output keeps
  one record per (item, person) and a crash leaves the old file or the new one, never a mix.
- **Resumable.** Records and skips are read back on start; each person continues with their next item.
- **The input is never written** (the output and the skip file must be other files).
- **One item, one person at a time.** Handing an item out takes a lease (``lease_minutes``, renewed while the
  page is open); an item is offered to someone else only while its records plus live leases held by others
  are fewer than ``annotations_per_item``. Leases live in memory: a restart frees them, which only means
  an item may be offered again. One server serves one output: a second one on the same file is refused
  (an exclusive lock on ``<output>.lock``).
"""

from __future__ import annotations

import calendar
import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from annotation.runner import _Appender, repair_torn_tail
from text2grad.apps.feedback_ui.records import (
    MarkedSpan,
    human_record,
    lone_surrogates,
    span_changes,
    spans_from_offsets,
    suggestion_of,
    utc_now,
)
from text2grad.core.data import iter_jsonl

__all__ = ["FeedbackStore", "FeedbackUIError", "acquire_output_lock", "check_output_paths", "record_annotator"]


class FeedbackUIError(Exception):
    """A request the store refuses; ``status`` is the HTTP status the page gets with the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def record_annotator(record: Mapping[str, Any]) -> str:
    """Who wrote a record: its annotator, else its source (an LLM's records in the same file count as one critic)."""
    return str(record.get("annotator") or record.get("source") or "unknown")


def check_output_paths(dataset_path: str, output: str, skipped: Path) -> None:
    """Refuse paths that would lose data: the input is never written, and the outputs are files."""
    if not dataset_path or not output:
        raise FeedbackUIError(400, "both --dataset_path and --output are required")
    source = Path(dataset_path).resolve()
    for flag, path in (("--output", Path(output)), ("the skip file", skipped)):
        if path.is_dir():
            raise FeedbackUIError(400, f"{flag} {path} is a directory; name a file, e.g. {path / 'human_feedback.jsonl'}")
        if path.resolve() == source:
            raise FeedbackUIError(400, f"{flag} {path} is the input file: feedback-ui never writes its input; choose another --output")


def acquire_output_lock(output: Path):
    """Hold ``<output>.lock`` exclusively for this process (released when the returned file is closed or the
    process ends, however it ends); `FeedbackUIError` 409 when another server or import holds it."""
    path = Path(str(output) + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise FeedbackUIError(
            409, f"{output} is in use by {holder}; open that server's address instead, or stop it first"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"feedback-ui (pid {os.getpid()})")
    handle.flush()
    return handle


class FeedbackStore:
    """Items, records, skips and leases of one output file (thread-safe: the web server calls it from a pool)."""

    def __init__(
        self,
        items: Sequence[Mapping[str, Any]],
        output: Path,
        skipped_path: Path,
        annotations_per_item: int = 1,
        lease_s: float = 1800.0,
        require_critique: bool = True,
        clock: Callable[[], float] = time.time,
        max_critique_chars: int = 20000,
        max_spans: int = 500,
    ) -> None:
        self.items = list(items)
        self.by_id = {str(item["id"]): item for item in self.items}
        self.order = {item_id: n for n, item_id in enumerate(self.by_id)}
        # Critiques the input already carries (an LLM's, the reward model's): shown as editable drafts.
        self.suggestions = {item_id: suggestion_of(item) for item_id, item in self.by_id.items()}
        self.output, self.skipped_path = Path(output), Path(skipped_path)
        self.per_item = annotations_per_item
        self.lease_s = lease_s
        self.require_critique = require_critique
        self.max_critique_chars = max_critique_chars
        self.max_spans = max_spans
        self.clock = clock
        self._lock = threading.RLock()
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = acquire_output_lock(self.output)
        repair_torn_tail(self.output)
        repair_torn_tail(self.skipped_path)
        # When each person first saw each item: the record's started_at. Kept across restarts in its own file;
        # re-leasing, reloading and "back" do not reset it.
        self.shown_path = self.output.with_name(self.output.name + ".shown.jsonl")
        repair_torn_tail(self.shown_path)
        self.shown_at: dict[tuple[str, str], str] = {}
        # (item id, annotator) -> record; and the time each person last submitted or skipped each item (for "back")
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.done_by: dict[str, set[str]] = {}
        self.skipped: dict[str, set[str]] = {}
        self.touched: dict[str, dict[str, int]] = {}  # annotator -> {item id: sequence number of their last action}
        self._sequence = 0
        self._load()
        self.leases: dict[str, dict[str, float]] = {}  # item id -> {annotator: expiry}
        self._out = _Appender(self.output, sync_each=True)
        self._skips = _Appender(self.skipped_path, sync_each=True)
        self._shown = _Appender(self.shown_path)  # not fsync'd per line: a lost display time costs nothing else

    # ------------------------------------------------------------------------------------------------
    # Start-up and shut-down
    # ------------------------------------------------------------------------------------------------

    def _load(self) -> None:
        events: list[tuple[float, int, str, str]] = []  # (when, file order, annotator, item id): "back" order
        if self.output.is_file():
            for n, record in enumerate(iter_jsonl(self.output)):
                if "id" not in record:
                    continue
                item_id, annotator = str(record["id"]), record_annotator(record)
                self.records[(item_id, annotator)] = record
                self.done_by.setdefault(item_id, set()).add(annotator)
                events.append((_timestamp(record.get("submitted_at")), n, annotator, item_id))
        if self.shown_path.is_file():
            for event in iter_jsonl(self.shown_path):
                self.shown_at.setdefault((str(event.get("id")), str(event.get("annotator"))), str(event.get("time")))
        if self.skipped_path.is_file():
            for n, event in enumerate(iter_jsonl(self.skipped_path)):
                item_id, annotator = str(event.get("id")), str(event.get("annotator"))
                if (item_id, annotator) not in self.records:
                    self.skipped.setdefault(annotator, set()).add(item_id)
                    events.append((_timestamp(event.get("time")), n, annotator, item_id))
        for _, _, annotator, item_id in sorted(events):
            self._touch(annotator, item_id)

    def close(self) -> None:
        """Release the files (idempotent). Everything submitted is already on disk."""
        with self._lock:
            if self._lock_file.closed:
                return
            self._out.close()
            self._skips.close()
            self._shown.close()
            self._lock_file.close()

    # ------------------------------------------------------------------------------------------------
    # Queries
    # ------------------------------------------------------------------------------------------------

    def progress(self, annotator: str) -> dict[str, int]:
        with self._lock:
            ids = self.by_id.keys()
            return {
                "total": len(self.items),
                "yours": sum(1 for i in ids if annotator in self.done_by.get(i, ())),
                "skipped": len(self.skipped.get(annotator, set()) & set(ids)),
                "complete": sum(1 for i in ids if len(self.done_by.get(i, ())) >= self.per_item),
                "per_item": self.per_item,
            }

    def next_item(self, annotator: str) -> dict[str, Any] | None:
        """The item this person should do next (the one they hold, else the first free one), leased to them."""
        with self._lock:
            now = self.clock()
            held = [i for i, holders in self.leases.items() if holders.get(annotator, 0) > now]
            for item_id in held:
                if annotator not in self.done_by.get(item_id, ()) and item_id not in self.skipped.get(annotator, ()):
                    return self._view(annotator, item_id, lease=True)
            for item_id in self.by_id:
                if annotator in self.done_by.get(item_id, ()) or item_id in self.skipped.get(annotator, ()):
                    continue
                if self._free_places(item_id, annotator, now) > 0:
                    return self._view(annotator, item_id, lease=True)
            self._release(annotator)
            return None

    def held_by_others(self, annotator: str) -> int:
        """Items this person has not done or skipped that are not offered to them only because others hold them now
        (so "nothing left" is not yet true: they come back when a lease lapses or its holder skips)."""
        with self._lock:
            now = self.clock()
            return sum(
                1 for item_id in self.by_id
                if annotator not in self.done_by.get(item_id, ()) and item_id not in self.skipped.get(annotator, ())
                and self._free_places(item_id, annotator, now) <= 0
                and self.per_item - len(self.done_by.get(item_id, set()) - {annotator}) > 0
            )

    def previous(self, annotator: str, before: str | None) -> dict[str, Any] | None:
        """The item this person submitted or skipped just before ``before`` (the latest one when ``before`` is new)."""
        with self._lock:
            history = self.history(annotator)
            if before in history:
                position = history.index(before)
                if position == 0:
                    return None
                return self._view(annotator, history[position - 1], lease=False)
            return self._view(annotator, history[-1], lease=False) if history else None

    def history(self, annotator: str) -> list[str]:
        """Ids this person submitted or skipped, oldest first."""
        with self._lock:
            touched = self.touched.get(annotator, {})
            return [i for i in sorted(touched, key=touched.__getitem__) if i in self.by_id]

    # ------------------------------------------------------------------------------------------------
    # Changes
    # ------------------------------------------------------------------------------------------------

    def submit(self, annotator: str, item_id: str, critique: Any, spans: Any) -> dict[str, Any]:
        """Write this person's feedback on ``item_id`` (or replace their earlier one) and return the record."""
        with self._lock:
            item = self._known(item_id)
            if not isinstance(critique, str):
                raise FeedbackUIError(400, "critique must be text")
            if len(critique) > self.max_critique_chars:
                raise FeedbackUIError(413, f"the critique is {len(critique)} characters; at most "
                                           f"{self.max_critique_chars} are accepted: shorten it")
            if lone_surrogates(critique):
                raise FeedbackUIError(400, "the critique holds half of a character (an unpaired UTF-16 surrogate, "
                                           "e.g. an emoji cut by a copy); delete and retype that character")
            if self.require_critique and not critique.strip():
                raise FeedbackUIError(400, "write a critique before submitting (what is good or poor, and why)")
            if not isinstance(spans, list) or not all(isinstance(s, dict) for s in spans):
                raise FeedbackUIError(400, "spans must be a list of {start, end, label} objects")
            if len(spans) > self.max_spans:
                raise FeedbackUIError(413, f"{len(spans)} marks; at most {self.max_spans} are accepted per item")
            try:
                marked: list[MarkedSpan] = spans_from_offsets(str(item["response"]), spans, unit="utf16")
            except ValueError as exc:
                raise FeedbackUIError(400, str(exc)) from None
            now = self.clock()
            key = (item_id, annotator)
            revising = key in self.records
            if not revising and self._free_places(item_id, annotator, now) <= 0:
                completed = len(self.done_by.get(item_id, set()) - {annotator}) >= self.per_item
                what = "was completed by other annotators" if completed else "is held by another annotator"
                raise FeedbackUIError(
                    409, f"item {item_id!r} {what} while it was not held for you; your draft is kept in this "
                    "browser: copy it if you need it, then take the next item"
                )
            submitted_at = utc_now()
            record = human_record(item, critique, marked, annotator, self.shown_at.get(key, submitted_at), submitted_at)
            suggestion = self.suggestions.get(item_id)
            if suggestion is not None:
                record["suggestion"] = suggestion
                record["changes"] = span_changes(suggestion["spans"], marked, suggestion["critique"], record["critique"])
            if revising:
                record["revised"] = True
                self._replace(key, record)
            else:
                self._out.append(record)
            self.records[key] = record
            self.done_by.setdefault(item_id, set()).add(annotator)
            self.skipped.get(annotator, set()).discard(item_id)
            self._touch(annotator, item_id)
            self.leases.get(item_id, {}).pop(annotator, None)
            return record

    def skip(self, annotator: str, item_id: str) -> None:
        """Put an item aside for this person (remembered across restarts; "back" brings it again)."""
        with self._lock:
            self._known(item_id)
            if (item_id, annotator) in self.records:
                raise FeedbackUIError(409, f"you already submitted item {item_id!r}; it cannot be skipped")
            self._skips.append({"id": item_id, "annotator": annotator, "skipped": True, "time": utc_now()})
            self.skipped.setdefault(annotator, set()).add(item_id)
            self._touch(annotator, item_id)
            self.leases.get(item_id, {}).pop(annotator, None)

    def renew(self, annotator: str, item_id: str) -> bool:
        """Extend this person's lease on an item while their page shows it; False if it had already lapsed to others."""
        with self._lock:
            self._known(item_id)
            now = self.clock()
            if self.leases.get(item_id, {}).get(annotator, 0) > now or self._free_places(item_id, annotator, now) > 0:
                self._take(annotator, item_id, now)
                return True
            return False

    # ------------------------------------------------------------------------------------------------
    # Internals (called with the lock held)
    # ------------------------------------------------------------------------------------------------

    def _known(self, item_id: str) -> Mapping[str, Any]:
        item = self.by_id.get(str(item_id))
        if item is None:
            raise FeedbackUIError(404, f"no item with id {item_id!r} in the input")
        return item

    def _free_places(self, item_id: str, annotator: str, now: float) -> int:
        others = sum(1 for who, expiry in self.leases.get(item_id, {}).items() if who != annotator and expiry > now)
        return self.per_item - len(self.done_by.get(item_id, set()) - {annotator}) - others

    def _take(self, annotator: str, item_id: str, now: float) -> None:
        self._release(annotator, keep=item_id)
        self.leases.setdefault(item_id, {})[annotator] = now + self.lease_s

    def _release(self, annotator: str, keep: str | None = None) -> None:
        for item_id, holders in self.leases.items():
            if item_id != keep:
                holders.pop(annotator, None)

    def _touch(self, annotator: str, item_id: str) -> None:
        self._sequence += 1
        self.touched.setdefault(annotator, {})[item_id] = self._sequence

    def _view(self, annotator: str, item_id: str, lease: bool) -> dict[str, Any]:
        item = self.by_id[item_id]
        if lease:
            self._take(annotator, item_id, self.clock())
        if (item_id, annotator) not in self.shown_at:
            self.shown_at[(item_id, annotator)] = utc_now()
            self._shown.append({"id": item_id, "annotator": annotator, "time": self.shown_at[(item_id, annotator)]})
        record = self.records.get((item_id, annotator))
        status = "submitted" if record else "skipped" if item_id in self.skipped.get(annotator, ()) else "new"
        return {
            "id": item_id,
            "prompt": str(item["prompt"]),
            "response": str(item["response"]),
            "status": status,
            "record": record,
            "suggestion": self.suggestions.get(item_id),
            "position": self.order[item_id] + 1,
            "progress": self.progress(annotator),
        }

    def _replace(self, key: tuple[str, str], record: Mapping[str, Any]) -> None:
        """Replace the line of ``key`` in the output: a new file, fsync'd, renamed over the old one."""
        tmp = self.output.with_name(self.output.name + ".tmp")
        with self.output.open("rb") as src, tmp.open("wb") as dst:
            for line in src:
                try:
                    old = json.loads(line)
                except ValueError:
                    old = None
                if isinstance(old, dict) and (str(old.get("id")), record_annotator(old)) == key:
                    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
                dst.write(line)
            dst.flush()
            os.fsync(dst.fileno())
        self._out.close()
        tmp.replace(self.output)
        self._out = _Appender(self.output, sync_each=True)


def _timestamp(value: Any) -> float:
    """Seconds since the epoch of an ISO UTC timestamp; 0 for a missing or unreadable one (file order decides)."""
    try:
        return float(calendar.timegm(time.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError, OverflowError):
        return 0.0
