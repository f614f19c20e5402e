"""The output directory of a training run, shared by both trainers (PPO and the reward model).

One rule for every trainer:

- ``output_dir`` is a directory; a file there is refused before any model loads.
- A directory that already holds an earlier run (``checkpoint-<N>/``, the run's config or its metrics file) is
  refused unless the user resumes it (``--resume auto|PATH``) or says ``--overwrite_output_dir true``; with
  overwrite the earlier run's checkpoints and logs are removed first, so two runs never mix.
- Resuming compares the checkpoint's saved config with the current one and refuses differences, unless the user
  accepts them (``--accept_config_changes true``): then they are logged and appended to
  ``config_changes.jsonl``, so the run's history says which part ran with which values.
- Metrics are one JSON object per line (``metrics.jsonl``); on resume, lines written after the checkpoint are
  dropped, so the file always describes the run the weights come from.
- Ctrl-C or SIGTERM asks the run to stop after the current step (`graceful_stop`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import yaml
from transformers import TrainerCallback

from text2grad.core.config import ConfigError, config_to_dict

__all__ = [
    "CHANGES_FILE",
    "METRICS_FILE",
    "MetricsJsonl",
    "append_jsonl",
    "check_output_dir",
    "check_resume_config",
    "clear_earlier_run",
    "earlier_run_files",
    "find_latest_checkpoint",
    "graceful_stop",
    "list_checkpoints",
    "open_run",
    "resolve_resume",
    "rotate_checkpoints",
    "truncate_jsonl",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CHANGES_FILE = "config_changes.jsonl"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_NO_RESUME = ("", "none", "null", "false", "no")
_RUN_CONTROL_KEYS = ("resume", "overwrite_output_dir", "accept_config_changes")  # how to start, never what to train


def list_checkpoints(output_dir: str | Path, marker: str | None = None) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint-<step>`` directory (holding ``marker`` if given), by step."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in out.iterdir()
        if (m := _CHECKPOINT.match(p.name)) and p.is_dir() and (marker is None or (p / marker).is_file())
    ]
    return sorted(found)


def find_latest_checkpoint(output_dir: str | Path, marker: str | None = None) -> Path | None:
    """The ``checkpoint-<step>`` directory with the highest step (that holds ``marker``), or None."""
    found = list_checkpoints(output_dir, marker)
    return found[-1][1] if found else None


def rotate_checkpoints(output_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (``checkpoint-<N>-nonfinite`` and the like are kept)."""
    for _, old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def resolve_resume(resume: str | None, output_dir: str | Path, marker: str) -> Path | None:
    """The checkpoint ``--resume`` names: ``auto`` is the latest in ``output_dir`` (None when there is none yet:
    a fresh start), a path must be a checkpoint holding ``marker``; None/none/false: no resume."""
    if resume is None or resume.strip().lower() in _NO_RESUME:
        return None
    if resume.strip().lower() == "auto":
        return find_latest_checkpoint(output_dir, marker)
    path = Path(resume)
    if not (path / marker).is_file():
        raise FileNotFoundError(
            f"--resume {resume}: not a checkpoint of this trainer (no {marker} there); pass a checkpoint-<N> "
            "directory or 'auto' for the latest one in output_dir"
        )
    return path


def earlier_run_files(output_dir: str | Path, run_files: Sequence[str]) -> list[Path]:
    """The files of an earlier run in ``output_dir``: its checkpoints and any of ``run_files`` present."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [p for _, p in list_checkpoints(out)]
    found += [out / name for name in run_files if (out / name).exists()]
    return found


def check_output_dir(output_dir: str | Path, *, overwrite: bool, resuming: bool, run_files: Sequence[str]) -> None:
    """Refuse an ``output_dir`` that is a file, or that holds an earlier run while neither resuming nor
    overwriting. Call it before any model loads (it only reads the filesystem)."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output_dir {out} is a file, not a directory; choose another --output_dir")
    if resuming or overwrite:
        return
    earlier = earlier_run_files(out, run_files)
    if earlier:
        names = ", ".join(sorted(p.name for p in earlier)[:4])
        raise FileExistsError(
            f"{out} already holds a run ({names}); pass --resume auto to continue it, "
            "--overwrite_output_dir true to replace it, or choose another --output_dir"
        )


def clear_earlier_run(output_dir: str | Path, run_files: Sequence[str]) -> list[Path]:
    """Remove an earlier run's checkpoints and ``run_files`` (``--overwrite_output_dir``); returns what went."""
    removed = earlier_run_files(output_dir, run_files)
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    if removed:
        logger.warning("overwrite_output_dir: removed %d file(s) of the earlier run in %s", len(removed), output_dir)
    return removed


def _comparable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any], ignore: Sequence[str] = ()) -> dict[str, list[Any]]:
    """``{key: [saved value, current value]}`` for every key whose value differs (keys in ``ignore`` skipped)."""
    out = {}
    for key in sorted(set(saved) | set(current)):
        if key in ignore:
            continue
        old, new = _comparable(saved.get(key)), _comparable(current.get(key))
        if old != new:
            out[key] = [old, new]
    return out


def check_resume_config(
    saved_config: str | Path,
    cfg: Any,
    *,
    accept: bool,
    ignore: Sequence[str],
    output_dir: str | Path,
    step: int,
    write: bool = True,
) -> dict[str, list[Any]]:
    """Compare the config saved with a checkpoint with ``cfg``; raise ConfigError on differences unless
    ``accept``, in which case they are logged and appended to ``output_dir/config_changes.jsonl`` (by the process
    with ``write``; ``write=False`` only checks, e.g. before the models load). Keys in ``ignore`` (how long to run, logging, resume flags) may always change."""
    path = Path(saved_config)
    if not path.is_file():
        logger.warning("%s is missing: the resumed run's config cannot be compared with the checkpoint's", path)
        return {}
    saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    diffs = config_differences(saved, config_to_dict(cfg), (*ignore, *_RUN_CONTROL_KEYS))
    if not diffs:
        return {}
    listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diffs.items())
    if not accept:
        raise ConfigError(
            f"the checkpoint {path.parent} was trained with a different config ({listed}). Rerun with the saved "
            "values, or pass --accept_config_changes true to continue with the new ones (recorded in "
            f"{Path(output_dir) / CHANGES_FILE})"
        )
    if write:
        logger.warning("resuming at step %d with a changed config: %s", step, listed)
        append_jsonl(Path(output_dir) / CHANGES_FILE, {"step": step, "checkpoint": str(path.parent), "changes": diffs})
    return diffs


def open_run(
    output_dir: str | Path,
    cfg: Any,
    *,
    marker: str,
    config_file: str,
    run_files: Sequence[str],
    resumable_keys: Sequence[str],
    step_key: str,
    logs: Sequence[str] = (METRICS_FILE,),
    log_key: str = "step",
    is_main: bool = True,
    write: bool = True,
) -> Path | None:
    """Apply every rule above for a trainer whose config has ``resume``, ``overwrite_output_dir`` and
    ``accept_config_changes``; returns the checkpoint to resume from, or None for a fresh start.

    ``marker`` is the file every checkpoint of the trainer holds (its step under ``step_key``), ``config_file`` the
    config saved beside it; ``logs`` are JSONL files cut back to the checkpoint's step (by ``log_key``). With
    ``write=False`` nothing is changed on disk (a check before the models load); otherwise the main process
    records accepted config changes, cuts the logs or removes an earlier run being overwritten.
    """
    resume = resolve_resume(cfg.resume, output_dir, marker)
    if resume is None:
        # --resume auto with no checkpoint yet is a fresh start: the earlier attempt's logs go.
        auto = (cfg.resume or "").strip().lower() == "auto"
        check_output_dir(output_dir, overwrite=cfg.overwrite_output_dir or auto, resuming=False, run_files=run_files)
        if write and is_main:
            clear_earlier_run(output_dir, run_files)
        return None
    check_output_dir(output_dir, overwrite=False, resuming=True, run_files=run_files)
    step = int(json.loads((resume / marker).read_text()).get(step_key, 0))
    check_resume_config(resume / config_file, cfg, accept=cfg.accept_config_changes, ignore=resumable_keys,
                        output_dir=output_dir, step=step, write=write and is_main)
    if write and is_main:
        for name in logs:
            truncate_jsonl(Path(output_dir) / name, log_key, step)
    return resume


class MetricsJsonl(TrainerCallback):
    """A transformers Trainer's every logged step as one line of ``<output_dir>/metrics.jsonl`` (loss, learning
    rate, grad norm, eval loss ...), the file PPO writes too.

    ``fresh=True`` is for runs that never resume: an earlier run's file in ``output_dir`` is removed when training
    begins, so its lines do not mix with this run's (resumable runs cut the file back to their checkpoint instead).
    """

    def __init__(self, fresh: bool = False):
        self.fresh = fresh

    def on_train_begin(self, args, state, control, **kwargs):
        if self.fresh and state.is_world_process_zero:
            (Path(args.output_dir) / METRICS_FILE).unlink(missing_ok=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            append_jsonl(Path(args.output_dir) / METRICS_FILE, {"step": state.global_step, "epoch": state.epoch, **logs})


def append_jsonl(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line (creating the directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def truncate_jsonl(path: str | Path, key: str, last: int) -> None:
    """Drop records whose ``key`` exceeds ``last`` (written after the checkpoint a run resumes from)."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [
        line for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line).get(key, 0) <= last
    ]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


@contextlib.contextmanager
def graceful_stop(request_stop: Callable[[], bool]) -> Iterator[None]:
    """First Ctrl-C / SIGTERM calls ``request_stop()`` (the run finishes its step, checkpoints and returns);
    a Ctrl-C after that (``request_stop`` returned True: already requested) stops at once. Outside the main
    thread signals cannot be caught, and nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        already = request_stop()
        if already and signum == signal.SIGINT:
            raise KeyboardInterrupt
        logger.warning("signal %d: stopping after this step (Ctrl-C again to stop now)", signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
