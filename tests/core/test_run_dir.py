"""The output-directory rules both trainers follow (text2grad.core.run_dir), on the filesystem alone."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from text2grad.core import run_dir
from text2grad.core.config import ConfigError, save_config


@dataclass
class Cfg:
    learning_rate: float = 1e-5
    num_iterations: int = 2
    resume: str | None = None
    overwrite_output_dir: bool = False
    accept_config_changes: bool = False


def _checkpoint(out, step, marker="state.json"):
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / marker).write_text(json.dumps({"step": step}))
    save_config(Cfg(), path / "config.yaml")
    return path


def _open(out, cfg, write=True):
    return run_dir.open_run(out, cfg, marker="state.json", config_file="config.yaml", run_files=("config.yaml",
                            "metrics.jsonl"), resumable_keys=("resume", "num_iterations"), step_key="step", write=write)


def test_a_file_in_place_of_the_output_dir_is_refused(tmp_path):
    (tmp_path / "out").write_text("notes")
    with pytest.raises(FileExistsError, match="is a file, not a directory"):
        _open(tmp_path / "out", Cfg())
    assert (tmp_path / "out").read_text() == "notes"


def test_an_earlier_run_is_refused_then_overwritten_completely(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out, 3)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "checkpoint-3-nonfinite").mkdir()
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(FileExistsError, match=r"already holds a run \(checkpoint-3, metrics.jsonl\)"):
        _open(out, Cfg())
    with pytest.raises(FileExistsError):  # the check before models load says the same
        _open(out, Cfg(), write=False)
    assert _open(out, Cfg(overwrite_output_dir=True)) is None
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-3-nonfinite", "notes.txt"]  # only the run's files go


def test_resume_auto_finds_the_latest_and_cuts_the_logs_back(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out, 1)
    _checkpoint(out, 2)
    (out / "checkpoint-5").mkdir()  # no state file: an interrupted save, never resumed from
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    assert _open(out, Cfg(resume="auto", num_iterations=9)) == out / "checkpoint-2"  # num_iterations may change
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    with pytest.raises(FileNotFoundError, match="not a checkpoint of this trainer"):
        _open(out, Cfg(resume=str(out / "checkpoint-5")))


def test_resume_with_a_changed_config_is_refused_or_recorded(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out, 4)
    with pytest.raises(ConfigError, match=r"learning_rate: 1e-05 -> 0.001.*--accept_config_changes true"):
        _open(out, Cfg(resume="auto", learning_rate=1e-3))
    assert not (out / run_dir.CHANGES_FILE).exists()
    _open(out, Cfg(resume="auto", learning_rate=1e-3, accept_config_changes=True), write=False)
    assert not (out / run_dir.CHANGES_FILE).exists()  # a check writes nothing
    _open(out, Cfg(resume="auto", learning_rate=1e-3, accept_config_changes=True))
    (change,) = [json.loads(line) for line in (out / run_dir.CHANGES_FILE).read_text().splitlines()]
    assert change["step"] == 4 and change["changes"] == {"learning_rate": [1e-05, 0.001]}


def test_resume_auto_without_a_checkpoint_starts_fresh_and_rotation_keeps_the_newest(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')  # a run that died before its first checkpoint
    assert _open(out, Cfg(resume="auto")) is None and not (out / "metrics.jsonl").exists()
    for step in (1, 2, 10):
        _checkpoint(out, step)
    (out / "checkpoint-2-nonfinite").mkdir()
    run_dir.rotate_checkpoints(out, keep=2)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-10", "checkpoint-2", "checkpoint-2-nonfinite"]
