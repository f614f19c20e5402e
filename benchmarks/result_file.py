"""What every committed benchmark result file records next to its figures: machine, date, command and load.

A benchmark that writes ``--output_json`` calls :func:`run_context` at its start and :func:`write_result` at its end;
``benchmarks/results_tables.py`` reads the files back into the README tables, so a figure always travels with the
machine, date and command that produced it. The load averages say whether other jobs shared the machine.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from text2grad.apps.quickstart.results import cpu_name

def rss_mb() -> float:
    """This process's resident set size now (Linux /proc), in MiB; NaN where /proc has none."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_result(argv: list[str], *, env: dict[str, str], label: str, timeout_s: float, too_slow: str) -> dict[str, Any]:
    """Run one setting of a benchmark in a fresh process (so its peak memory is its own) and return the JSON of its
    last ``RESULT `` line on stdout; its stderr (progress) goes straight to ours. Exits with a message naming
    ``label`` when it fails or runs past ``timeout_s`` (``too_slow`` says what to shrink)."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        sys.exit(f"{label} ran past its time limit ({timeout_s:.0f} s): {too_slow}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"{label} failed (exit {proc.returncode}): its output is above")
    return json.loads(lines[-1][len("RESULT "):])


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
