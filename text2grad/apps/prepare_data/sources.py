"""Reading a dataset split in its native layout from a hub id or a local copy, and checking its columns.

Sources, in the order they are recognised:

- a directory written by ``DatasetDict.save_to_disk`` (``dataset_dict.json``): its splits;
- a directory of data files, named as on the hub: ``<split>.jsonl`` / ``.json`` / ``.parquet`` / ``.arrow``,
  ``<split>-00000-of-00001.parquet`` (also with the hub's ``-<hash>`` after it), ``data/<split>-*.parquet`` (the
  hub's parquet layout), or a folder
  ``<split>/`` holding such files or a ``Dataset.save_to_disk`` copy;
- a single data file: it holds the split its name starts with (``train_prefs-0000.parquet``), else the
  dataset's main split;
- anything else is a hub id. SLF5K is a script dataset, so its hub splits are read as the JSONL files of the
  repository (``hf://datasets/JeremyAlain/SLF5K/<split>.jsonl``) with the ``json`` builder; the other
  datasets are plain parquet repositories read with ``load_dataset(id, split=...)``.

Every failure is a `SchemaError` whose message names the dataset, the split, what is missing and what exists.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import datasets

__all__ = ["SchemaError", "SplitData", "load_split", "list_splits", "check_columns"]

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
# SLF5K's loading script is not supported by datasets >= 4: read the repository's JSONL files instead.
_JSONL_REPOS = {"slf5k"}


class SchemaError(ValueError):
    """The input lacks a split or a column the dataset needs; the message names dataset, split and columns."""


@dataclass
class SplitData:
    """One split: its rows (dicts with the native columns), the columns it has, and where it came from."""

    dataset: str
    split: str
    rows: list[dict[str, Any]]
    columns: list[str]
    origin: str


def _split_of_file(path: Path) -> str:
    """``train_prefs-00000-of-00001.parquet`` -> ``train_prefs``; ``validation.jsonl`` -> ``validation``; the hub's
    content-addressed shard names too: ``train_prefs-00000-of-00001-f1b2c3d4e5f60718.parquet`` -> ``train_prefs``."""
    name = path.name
    for suffix in _FORMATS:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return re.sub(r"-\d{5}-of-\d{5}(-[0-9a-f]{8,})?$", "", name)


def _data_files(directory: Path) -> dict[str, list[Path]]:
    """Split name -> its data files, for a directory laid out like a hub dataset repository."""
    found: dict[str, list[Path]] = {}
    for base in (directory, directory / "data"):
        if not base.is_dir():
            continue
        for path in sorted(base.iterdir()):
            if path.is_file() and path.suffix in _FORMATS and path.name not in ("dataset_info.json", "state.json",
                                                                               "dataset_dict.json"):
                found.setdefault(_split_of_file(path), []).append(path)
            elif path.is_dir() and base == directory and path.name != "data":
                if (path / "dataset_info.json").exists() or any(p.suffix in _FORMATS for p in path.iterdir()):
                    found.setdefault(path.name, []).append(path)
    return found


def list_splits(source: str) -> list[str] | None:
    """The splits a local source has (None for a hub id: asking would need the network)."""
    path = Path(source).expanduser()
    if path.is_dir() and (path / "dataset_dict.json").exists():
        return list(json.loads((path / "dataset_dict.json").read_text())["splits"])
    if path.is_dir():
        return sorted(_data_files(path))
    if path.is_file():
        return [_split_of_file(path)]
    return None


def _load_files(files: Sequence[Path]) -> Any:
    if len(files) == 1 and files[0].is_dir():
        folder = files[0]
        if (folder / "dataset_info.json").exists():
            return datasets.load_from_disk(str(folder))
        files = sorted(p for p in folder.iterdir() if p.suffix in _FORMATS)
    kinds = {_FORMATS[p.suffix] for p in files}
    if len(kinds) != 1:
        raise SchemaError(f"mixed data file formats {sorted(kinds)} in {[str(p) for p in files]}; keep one format per split")
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # local files load in seconds; the bars would only bury the report
    try:
        return datasets.load_dataset(kinds.pop(), data_files=[str(p) for p in files], split="train")
    finally:
        if shown:
            datasets.enable_progress_bars()


def load_split(dataset: str, source: str, split: str, main_split: str, limit: int | None = None) -> SplitData:
    """Rows of ``split`` of ``dataset`` from ``source`` (hub id or local copy, see the module docstring)."""
    path = Path(source).expanduser()
    if path.is_dir() and (path / "dataset_dict.json").exists():
        dd = datasets.load_from_disk(str(path))
        if split not in dd:
            raise SchemaError(f"{dataset}: {source} has no split {split!r}; it has splits {sorted(dd)}")
        ds, origin = dd[split], f"{source} (save_to_disk, split {split})"
    elif path.is_dir():
        files = _data_files(path)
        if split not in files:
            raise SchemaError(
                f"{dataset}: {source} has no split {split!r} (looked for {split}.jsonl/.json/.parquet/.arrow, "
                f"{split}-*.parquet, data/{split}-*.parquet or a {split}/ folder); it has splits {sorted(files) or 'none'}"
            )
        ds, origin = _load_files(files[split]), f"{', '.join(str(p) for p in files[split])}"
    elif path.is_file():
        own = _split_of_file(path)
        if own != split and not (split == main_split and own not in _known_other_splits(dataset, main_split)):
            raise SchemaError(f"{dataset}: {source} holds split {own!r}, not {split!r}; pass a directory with a "
                              f"{split} file, or the {split} file itself")
        ds, origin = _load_files([path]), str(path)
    elif path.suffix in _FORMATS or str(source).startswith((".", "/", "~")):
        raise SchemaError(f"{dataset}: input {source} does not exist")
    else:
        ds, origin = _load_hub(dataset, source, split), f"hub:{source} split {split}"
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return SplitData(dataset, split, [dict(r) for r in ds], list(ds.column_names), origin)


# Splits a single local file may be named after, to tell "a train file" from "some other split's file".
_SPLITS = {
    "slf5k": ("train", "development", "validation", "test"),
    "ultrafeedback": ("train_prefs", "test_prefs", "train_sft", "test_sft", "train_gen", "test_gen"),
    "kodcode": ("train",),
}


def _known_other_splits(dataset: str, main_split: str) -> set[str]:
    return set(_SPLITS.get(dataset, ())) - {main_split}


def _load_hub(dataset: str, repo: str, split: str) -> Any:
    try:
        if dataset in _JSONL_REPOS:
            return datasets.load_dataset("json", data_files=f"hf://datasets/{repo}/{split}.jsonl", split="train")
        return datasets.load_dataset(repo, split=split)
    except Exception as exc:  # datasets raises many types; all mean "could not read that split"
        known = ""
        if dataset not in _JSONL_REPOS:
            try:
                known = f"; it has splits {datasets.get_dataset_split_names(repo)}"
            except Exception:  # offline or unknown repo: the original error says why
                known = ""
        raise SchemaError(
            f"{dataset}: could not read split {split!r} of hub dataset {repo!r}{known} ({type(exc).__name__}: "
            f"{str(exc)[:300]}). Hub ids need network access (unset HF_HUB_OFFLINE) or a warm cache; a local copy "
            "works offline."
        ) from None


def check_columns(data: SplitData, required: Sequence[str]) -> None:
    """Raise `SchemaError` naming dataset, split, the missing columns and the columns that exist."""
    missing = [c for c in required if c not in data.columns]
    if missing:
        raise SchemaError(
            f"{data.dataset} split {data.split!r} ({data.origin}) lacks column(s) {missing}; it has columns "
            f"{sorted(data.columns)}. (The native layouts: text2grad/apps/prepare_data/README.md.)"
        )
