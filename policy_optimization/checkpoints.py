"""What a PPO run keeps on disk besides weights: the trainer state and config of each checkpoint, and the
output-directory rules (`text2grad.core.run_dir`) as PPO applies them.

``checkpoint-<step>/`` holds accelerate's state (weights, optimizer, scheduler, per-process RNG), plus
``trainer_state.json`` (`TrainerState` and the number of processes) and ``ppo_config.yaml`` (the config it was
trained with, compared on resume).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from policy_optimization.ppo_config import PPOConfig
from text2grad.core import run_dir
from text2grad.core.config import save_config

__all__ = [
    "CONFIG_FILE", "RESUMABLE_KEYS", "RUN_FILES", "STATE_FILE", "TrainerState", "check_process_count", "find_latest_checkpoint",
    "open_ppo_run", "read_trainer_state", "write_checkpoint_files",
]

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
CONFIG_FILE = "ppo_config.yaml"
# Files of a run in output_dir besides its checkpoints: a fresh run refuses (or with overwrite removes) them.
RUN_FILES = (CONFIG_FILE, run_dir.METRICS_FILE, "samples.jsonl", run_dir.CHANGES_FILE)
# Config keys a resumed run may change without --accept_config_changes: how long and how visibly it runs.
RESUMABLE_KEYS = (
    "resume", "overwrite_output_dir", "accept_config_changes", "output_dir", "num_iterations", "total_episodes",
    "save_steps", "save_total_limit", "progress_bar", "report_to", "run_name", "log_samples", "log_level",
    "max_feedback_error_rate",
)


@dataclass
class TrainerState:
    """Everything besides weights, optimizer, scheduler and RNG that a resumed run needs."""

    step: int = 0  # completed PPO iterations
    episodes: int = 0  # responses sampled so far, over all processes
    kl_coef: float = 0.0
    data_epoch: int = 0
    data_pos: int = 0  # position in the epoch's permutation of the prompts


def open_ppo_run(cfg: PPOConfig, is_main: bool = True, write: bool = True) -> Path | None:
    """The output-directory rules (`text2grad.core.run_dir.open_run`) for PPO; the checkpoint to resume or None."""
    return run_dir.open_run(
        cfg.output_dir, cfg, marker=STATE_FILE, config_file=CONFIG_FILE, run_files=RUN_FILES, resumable_keys=RESUMABLE_KEYS,
        step_key="step", logs=(run_dir.METRICS_FILE, "samples.jsonl"), log_key="iteration", is_main=is_main, write=write,
    )


def find_latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The ``checkpoint-<step>`` directory with the highest step that holds a trainer state, or None."""
    return run_dir.find_latest_checkpoint(output_dir, STATE_FILE)


def write_checkpoint_files(path: Path, state: TrainerState, cfg: PPOConfig, num_processes: int) -> None:
    """``trainer_state.json`` and ``ppo_config.yaml`` into the checkpoint directory ``path`` (main process)."""
    (path / STATE_FILE).write_text(json.dumps({**state.__dict__, "num_processes": num_processes}, indent=2))
    save_config(cfg, path / CONFIG_FILE)


def check_process_count(path: Path, num_processes: int) -> None:
    """Refuse to resume the checkpoint ``path`` with another number of processes than wrote it (ValueError)."""
    saved = json.loads((path / STATE_FILE).read_text()).get("num_processes", num_processes)
    if saved != num_processes:
        raise ValueError(
            f"{path} was written by {saved} process(es) but this run has {num_processes}: resume with the same number "
            f"of processes (accelerate launch --num_processes {saved}, or torchrun --nproc_per_node ... with "
            f"{saved} in total over all machines). Each process keeps its own random stream and optimizer shard, "
            "so another count would not continue the saved run; to train on with a different count, start a new "
            "run (another output_dir, or --overwrite_output_dir true)."
        )


def read_trainer_state(path: Path, num_processes: int) -> TrainerState:
    """The `TrainerState` saved in the checkpoint ``path``; a ValueError if it was written by another number of
    processes (`check_process_count`)."""
    check_process_count(path, num_processes)
    saved = json.loads((path / STATE_FILE).read_text())
    state = TrainerState()
    for key in TrainerState.__dataclass_fields__:
        if key in saved:
            setattr(state, key, type(getattr(state, key))(saved[key]))
    return state
