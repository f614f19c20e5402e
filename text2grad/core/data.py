"""Reading records from JSON, JSONL or a Hugging Face dataset, and filling prompt templates from them.

Every phase reads its inputs through `load_records`, so a user can point any phase at
``data/train.jsonl``, ``data/train.json``, a directory saved with ``Dataset.save_to_disk``, or a hub id
such as ``CarperAI/openai_summarize_tldr`` (``split=`` picks the split). Errors name the file, the line
and the missing field.
"""

from __future__ import annotations

import json
import os
import string
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

import datasets

from text2grad.core.config import DataError  # defined beside ConfigError, so the CLI catches it without datasets

__all__ = ["DataError", "load_records", "write_jsonl", "append_jsonl", "iter_jsonl", "render_template", "record_id"]


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSONL file. A torn last line (a crash mid-write) is skipped, any other bad line is an error."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        lines = fh.readlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(lines) and not line.endswith("\n"):
                return  # a write interrupted by a crash; resumable writers redo that record
            raise DataError(f"{path}:{n}: not valid JSON ({exc.msg}); fix or remove that line") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{n}: expected a JSON object per line, got {type(obj).__name__}")
        yield obj


def load_records(
    source: str | Path,
    split: str | None = None,
    field_map: Mapping[str, str] | None = None,
    required: tuple[str, ...] = (),
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Load records as a list of dicts.

    Args:
        source: a .jsonl / .json file, a directory saved by ``datasets`` (``save_to_disk``) or containing
            data files, or a hub dataset id.
        split: dataset split for hub ids and DatasetDicts (default "train").
        field_map: rename fields, ``{our_name: their_name}``; e.g. ``{"prompt": "post", "response": "summary"}``.
        required: fields (after mapping) every record must have.
        limit: keep only the first N records.
    """
    path = Path(str(source)).expanduser()
    if path.suffix == ".jsonl" or (path.is_file() and path.suffix not in (".json",)):
        if not path.is_file():
            raise DataError(f"data file {path} does not exist")
        records = list(iter_jsonl(path))
    elif path.suffix == ".json":
        if not path.is_file():
            raise DataError(f"data file {path} does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} is not valid JSON: {exc}") from None
        if isinstance(data, dict):  # {"data": [...]} or {"train": [...]} layouts
            key = split if split in data else next((k for k in ("data", "train", "records") if k in data), None)
            data = data.get(key) if key else None
        if not isinstance(data, list):
            raise DataError(f"{path} must hold a list of objects (or {{'data': [...]}})")
        records = data
    else:
        records = _load_hf(str(source), split)
    if limit is not None:
        records = records[:limit]
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DataError(f"{source}: record {i} is a {type(rec).__name__}, expected an object")
        rec = dict(rec)
        for ours, theirs in (field_map or {}).items():
            if theirs in rec:
                rec[ours] = rec[theirs]
        missing = [f for f in required if f not in rec or rec[f] is None]
        if missing:
            hint = f" (field_map: {dict(field_map)})" if field_map else ""
            raise DataError(
                f"{source}: record {i} (id={record_id(rec, i)!r}) lacks field(s) {missing}; it has {sorted(rec)}{hint}. "
                "Map your field names with field_map / --field_map."
            )
        out.append(rec)
    return out


def _load_hf(source: str, split: str | None) -> list[dict[str, Any]]:
    path = Path(source).expanduser()
    try:
        if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(source, split=split or "train")
    except Exception as exc:  # datasets raises many types; all mean "could not load"
        raise DataError(
            f"could not load dataset {source!r}: {type(exc).__name__}: {exc}. Pass a .jsonl/.json file, a directory "
            "saved with Dataset.save_to_disk, or a hub id (hub ids need network access or a warm HF cache)."
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        name = split or "train"
        if name not in ds:
            raise DataError(f"dataset {source!r} has splits {list(ds)}, not {name!r}; pass split=...")
        ds = ds[name]
    return [dict(r) for r in ds]


def record_id(record: Mapping[str, Any], index: int) -> str:
    """The record's own id if it has one, else its position."""
    for key in ("id", "record_id", "uid", "task_id", "question_id", "prompt_id"):
        if key in record and record[key] is not None:
            return str(record[key])
    return str(index)


def write_whole(path: str | Path, content: str | bytes) -> None:
    """Replace ``path`` with ``content`` in one step: written to a temp file of this call's own, then renamed over it,
    so readers never see half a file, and processes writing the same file at once (two study runs on one task
    instance) each leave a whole one, never a torn mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            tmp.write_text(content, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_jsonl(path: str | Path, records: list[Mapping[str, Any]]) -> None:
    """Write records as one JSON object per line, whole (`write_whole`)."""
    write_whole(path, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records))


def append_jsonl(fh, record: Mapping[str, Any]) -> None:
    """Append one record as a single write of one line, then flush and fsync (crash-safe appends)."""
    fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, Mapping) and "content" in m for m in value)


def render_template(template: str, record: Mapping[str, Any], where: str = "") -> str:
    """Fill ``{field}`` placeholders from a record; a missing field is an error that names it.

    A field holding a conversation (a list of ``{"role", "content"}`` messages, as in UltraFeedback's
    ``chosen`` / ``rejected``) fills in the content of its last message: the reply that conversation ends with.
    """
    fields = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    missing = [f for f in fields if f not in record]
    if missing:
        raise DataError(
            f"template needs field(s) {missing} that record {where or record_id(record, -1)!r} lacks; "
            f"it has {sorted(record)}"
        )
    values = {k: (record[k][-1]["content"] if _is_conversation(record[k]) else record[k]) for k in fields}
    return template.format_map(values)
