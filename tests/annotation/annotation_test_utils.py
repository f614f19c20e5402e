"""Helpers shared by the annotation tests: input files and a secret-looking API key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SECRET_KEY = "sk-test-SECRETsecret0123456789abcdefXYZ"


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def qa_records(n: int, prefix: str = "r") -> list[dict[str, Any]]:
    """UltraFeedback-style records whose responses have a distinct first and last line."""
    return [
        {
            "id": f"{prefix}{i}",
            "prompt": f"Question {i}: how do I water a cactus?",
            "response": f"Answer {i}: water it sparingly.\nSoak the soil, then let it dry.\nDone with item {i}.",
            "extra": {"n": i},
        }
        for i in range(n)
    ]
