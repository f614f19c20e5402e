"""The text2grad command and the tiny offline world used by the per-dataset scripts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_dataset

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


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The native split names the tiny world must write, and the split of the hand-written fixture to compare with.
NATIVE_SPLITS = {
    "slf5k": (["development", "test", "train", "validation"], "train"),
    "kodcode": (["train"], "train"),
    "ultrafeedback": (["test_gen", "test_prefs", "test_sft", "train_gen", "train_prefs", "train_sft"], "train_prefs"),
}


def _types(value):
    """A value's type structure: lists and dicts down to their leaves (floats and ints both count as numbers)."""
    if isinstance(value, list):
        return ["list"] + sorted({json.dumps(_types(v)) for v in value})
    if isinstance(value, dict):
        return {k: _types(v) for k, v in sorted(value.items())}
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


@pytest.mark.parametrize("dataset", ["slf5k", "kodcode", "ultrafeedback"])
def test_tiny_world_writes_the_native_layout(tmp_path, dataset):
    out = make_tiny_world(dataset, tmp_path / dataset, n_train=6, n_eval=2)
    splits, main_split = NATIVE_SPLITS[dataset]
    files = sorted((out / "raw").rglob("*.*"))
    names = sorted(f.name.split(".")[0].split("-")[0] for f in files)
    assert names == splits
    # the same columns, and the same types down to nested lists of dicts, as the hand-written fixture rows
    fixture = next(iter_jsonl(FIXTURES / dataset / f"{main_split}.jsonl"))
    main_file = next(f for f in files if f.name.startswith(main_split + ".") or f.name.startswith(main_split + "-"))
    kind = "json" if main_file.suffix == ".jsonl" else "parquet"
    tiny = load_dataset(kind, data_files=str(main_file), split="train")
    assert sorted(tiny.column_names) == sorted(fixture)
    assert {k: _types(v) for k, v in tiny[0].items()} == {k: _types(v) for k, v in fixture.items()}
    if dataset == "slf5k":
        assert set(tiny["comparison_preference"]) == {"Summary A", "Summary B"}
    # prepare-data ran on those files into data/ (the eval scripts read data/eval.jsonl)
    report = json.loads((out / "data" / "prepare_report.json").read_text())
    assert report["dataset"] == dataset and report["input"] == str(out / "raw")
    assert report["files"]["annotation_input.jsonl"] > 0 and report["files"]["rl_prompts.jsonl"] > 0
    for rec in iter_jsonl(out / "annotations.jsonl"):
        for span in rec["good_spans"] + rec["poor_spans"]:
            assert span in rec["response"]
    assert (out / "model" / "config.json").exists() and (out / "model" / "tokenizer.json").exists()
    mtime = (out / "model" / "config.json").stat().st_mtime
    make_tiny_world(dataset, tmp_path / dataset, n_train=6, n_eval=2)  # idempotent: nothing rewritten
    assert (out / "model" / "config.json").stat().st_mtime == mtime


def test_records_are_seeded():
    assert make_records("slf5k", 3, seed=1) == make_records("slf5k", 3, seed=1)
    assert make_records("slf5k", 3, seed=1) != make_records("slf5k", 3, seed=2)
    with pytest.raises(ValueError, match="unknown dataset"):
        make_records("imagenet", 1)
