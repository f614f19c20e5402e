"""The seeded disjoint split of prepare-data and the writer of its output files (its configuration: prepare_data_config.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from text2grad.core.data import write_jsonl, write_whole

__all__ = ["OUTPUT_FILES", "split_by_key", "write_outputs", "conversation_reply"]

# The files every dataset's --output_dir receives (other phases and the scripts read these names).
OUTPUT_FILES = ("annotation_input.jsonl", "sft.jsonl", "rl_prompts.jsonl", "eval.jsonl", "preference_pairs.jsonl")

def split_by_key(keys: Sequence[str], fractions: Mapping[str, float], seed: int) -> dict[str, str]:
    """Assign each distinct key (a prompt) to one part, so a prompt never lands in two parts.

    The distinct keys are sorted, shuffled with ``seed`` and cut at the cumulative fractions (the last part
    takes the rounding remainder), so the assignment depends only on the set of keys and the seed, not on the
    row order. Returns ``{key: part}``.
    """
    distinct = sorted(set(keys))
    random.Random(seed).shuffle(distinct)
    parts = list(fractions)
    out: dict[str, str] = {}
    start, total = 0, len(distinct)
    cumulative = 0.0
    for k, part in enumerate(parts):
        cumulative += float(fractions[part])
        end = total if k == len(parts) - 1 else round(cumulative * total)
        for key in distinct[start:end]:
            out[key] = part
        start = end
    return out


def conversation_reply(messages: Any) -> str | None:
    """The content of the last assistant message of a ``[{role, content}, ...]`` list (None if there is none)."""
    if not isinstance(messages, list):
        return None
    answers = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"]
    if not answers or not isinstance(answers[-1].get("content"), str):
        return None
    return answers[-1]["content"]


def write_outputs(output_dir: str | Path, files: Mapping[str, list[dict[str, Any]]], report: dict[str, Any]) -> Path:
    """Write every output file (atomically, see `write_jsonl`) and ``prepare_report.json`` last, so a
    report's presence means the directory is complete."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prepare_report.json").unlink(missing_ok=True)
    for name in OUTPUT_FILES:
        write_jsonl(out / name, list(files.get(name, [])))
    report = {**report, "files": {name: len(files.get(name, [])) for name in OUTPUT_FILES}}
    write_whole(out / "prepare_report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return out
