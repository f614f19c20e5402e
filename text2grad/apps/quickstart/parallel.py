"""Generation-bound work of the quickstart on one torch thread, and independent jobs side by side.

The tiny presets spend their policy-optimization time in autoregressive decoding (the policy's rollouts and the
reward model's feedback, 16 sequences at a time), where every step is many small kernels: a second torch thread
only adds synchronisation (measured on 2 cores: 1.0-1.1 s per PPO iteration on one thread vs 1.2-1.5 s on two).
So such work runs on one thread, and the reward modes, which do not depend on each other, run at the same time in
separate processes, one thread each (benchmarks/README.md). Training steps over full batches (SFT, the
reward model) keep every thread.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

__all__ = ["torch_threads", "run_side_by_side", "iterations_done", "usable_cores"]


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with ``n`` torch intra-op threads (0: leave the count as it is), then restore the previous count."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def iterations_done(metrics_file: Path) -> int:
    """The last iteration a PPO run has logged in its metrics.jsonl (0 before the first; a half-written line is skipped)."""
    last = 0
    try:
        lines = metrics_file.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        try:
            last = max(last, int(json.loads(line).get("iteration", 0)))
        except (ValueError, AttributeError):
            continue
    return last


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under ``taskset``; else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def _run_logged(log: Path, threads: int, setup: Callable[[], None] | None, fn: Callable[..., Any], args: tuple) -> Any:
    """In a worker process: ``threads`` torch threads, stdout and stderr (Python's and the C libraries') into ``log``."""
    torch.set_num_threads(threads)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", buffering=1) as fh:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(fh.fileno(), 1), os.dup2(fh.fileno(), 2)
        sys.stdout = sys.stderr = fh
        try:
            if setup is not None:
                setup()
            return fn(*args)
        finally:  # a worker may run another job next: never leave it writing to a closed file
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__


def run_side_by_side(
    jobs: Sequence[tuple[str, Callable[..., Any], tuple]],
    logs: Sequence[Path],
    progress: Callable[[], tuple[int, int]] | None = None,
    setup: Callable[[], None] | None = None,
    threads: int = 1,
    desc: str = "side by side",
) -> list[Any]:
    """Run ``jobs`` (``(name, fn, args)``; ``fn`` and ``args`` picklable) at the same time, each in its own spawned
    process with ``threads`` torch threads, its output in the matching ``logs`` file. Returns the results in job order;
    at most one process per ``threads`` cores runs at a time.

    ``progress() -> (done, total)`` drives a progress bar (labelled ``desc``) while they run; ``setup`` runs first
    in every job's process. A failed job stops the wait and raises ``RuntimeError`` naming the job and its log (the
    other jobs finish first).
    """
    workers = max(1, min(len(jobs), usable_cores() // max(1, threads)))
    for (name, _, _), log in zip(jobs, logs):
        print(f"  {name}: output in {log}", flush=True)
    context = multiprocessing.get_context("spawn")  # fork after torch's threads have started can hang
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures: list[Future] = [pool.submit(_run_logged, log, threads, setup, fn, args)
                                 for (_, fn, args), log in zip(jobs, logs)]
        bar = tqdm(total=progress()[1], desc=desc, unit="it") if progress else None
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=2.0, return_when=FIRST_EXCEPTION)
                if bar is not None:
                    bar.n = progress()[0]
                    bar.refresh()
                if any(f.exception() is not None for f in finished):
                    break
        finally:
            if bar is not None:
                bar.close()
        results = []
        for (name, _, _), log, future in zip(jobs, logs, futures):
            error = future.exception()
            if error is not None:
                raise RuntimeError(f"{name} failed: {error} (its output: {log})") from error
            results.append(future.result())
    return results

