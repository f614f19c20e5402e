"""What every committed benchmark result file records next to its figures: machine, date, command and load.

A benchmark that writes ``--output_json`` calls :func:`run_context` at its start and :func:`write_result` at its end;
``benchmarks/results_tables.py`` reads the files back into the README tables, so a figure always travels with the
machine, date and command that produced it. The load averages say whether other jobs shared the machine.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from text2grad.apps.quickstart.results import cpu_name

def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded; None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def run_context(argv: list[str] | None = None) -> dict[str, Any]:
    """Machine, date, the command as typed (relative to the repository root) and the load before the run."""
    args = sys.argv[1:] if argv is None else argv
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(Path(__file__).resolve().parents[1])
    except ValueError:
        pass
    return {
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "command": shlex.join(["python", str(script), *args]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_before": load_average(),
    }


def write_result(path: str | Path, context: dict[str, Any], figures: dict[str, Any]) -> Path:
    """Writes ``{**context, "load_after": ..., **figures}`` as indented JSON and returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**context, "load_after": load_average(), **figures}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {path}", flush=True)
    return path
