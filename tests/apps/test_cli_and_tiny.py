"""The text2grad command and the tiny offline world used by the per-dataset scripts."""

import subprocess
import sys

import pytest

from text2grad.apps.cli import SUBCOMMANDS, available, main
from text2grad.core.data import iter_jsonl
from text2grad.apps.tiny import make_records, make_tiny_world


def test_help_lists_existing_subcommands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in available():
        assert name in out
    assert set(available()) <= set(SUBCOMMANDS)


def test_unknown_subcommand(capsys):
    assert main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "text2grad", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "commands:" in out.stdout


@pytest.mark.parametrize("dataset", ["slf5k", "kodcode", "ultrafeedback"])
def test_tiny_world(tmp_path, dataset):
    out = make_tiny_world(dataset, tmp_path / dataset, n_train=4, n_eval=2)
    train = list(iter_jsonl(out / "data" / "train.jsonl"))
    assert len(train) == 4 and not any(k.startswith("_") for k in train[0])
    for rec in iter_jsonl(out / "annotations.jsonl"):
        for span in rec["good_spans"] + rec["poor_spans"]:
            assert span in rec["response"]
    assert (out / "model" / "config.json").exists() and (out / "model" / "tokenizer.json").exists()
    mtime = (out / "model" / "config.json").stat().st_mtime
    make_tiny_world(dataset, tmp_path / dataset, n_train=4, n_eval=2)  # idempotent: nothing rewritten
    assert (out / "model" / "config.json").stat().st_mtime == mtime


def test_records_are_seeded():
    assert make_records("slf5k", 3, seed=1) == make_records("slf5k", 3, seed=1)
    assert make_records("slf5k", 3, seed=1) != make_records("slf5k", 3, seed=2)
    with pytest.raises(ValueError, match="unknown dataset"):
        make_records("imagenet", 1)
