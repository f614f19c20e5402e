"""One CLI convention for every entry point: ``--help`` works for every subcommand and module (grouped, with
``text2grad <command>`` in its usage line), ``--version``, no abbreviated flags, ``error: <message>`` and exit 2
for every bad input before any model loads, ``text2grad`` with no command exits 2, ``| head`` ends quietly,
and library noise stays out of a quiet run's logs."""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from annotation.config import AnnotationConfig
from reward_model.train import RewardModelConfig
import policy_optimization.train as ppo
import reward_model.train as rm
from text2grad.apps.cli import available
from text2grad.apps.cli import main as text2grad
from text2grad.core.config import configure_logging, load_config

COMMANDS = sorted(available())
# Module CLIs that are not subcommands of `text2grad` (or are, under another name).
MODULES = ["text2grad.annotate", "text2grad.apps.tiny", "annotation.cli", "policy_optimization.train", "reward_model.train"]


def _run(argv, capsys):
    try:
        rc = text2grad(argv)
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_every_subcommand(command, capsys):
    rc, out, err = _run([command, "--help"], capsys)
    assert rc == 0, err
    assert out.startswith(f"usage: text2grad {command} ")
    assert "general:" in out and "--log_level" in out and "--version" in out  # the shared parser's options


@pytest.mark.parametrize("module", MODULES)
def test_help_of_every_module_cli(module, capsys):
    mod = importlib.import_module(module)
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: ") and "-h, --help" in out


def test_help_is_grouped_by_the_config_sections(capsys):
    _, out, _ = _run(["train-policy", "--help"], capsys)
    for section in ("models:", "data:", "PPO:", "run:"):
        assert f"\n{section}\n" in out, section


def test_version_everywhere(capsys):
    rc, out, _ = _run(["--version"], capsys)
    assert rc == 0 and out.startswith("text2grad ")
    rc, out, _ = _run(["annotate", "--version"], capsys)
    assert rc == 0 and out.startswith("text2grad ")


def test_no_command_prints_usage_and_exits_2(capsys):
    rc, out, err = _run([], capsys)
    assert rc == 2 and out == "" and "usage: text2grad <command>" in err and "error: no command given" in err
    rc, _, err = _run(["frobnicate"], capsys)
    assert rc == 2 and "error: unknown command 'frobnicate'" in err


def test_help_into_a_closed_pipe_ends_quietly():
    script = (
        f"{sys.executable} -m text2grad --help | head -1; "
        f"{sys.executable} -m text2grad train-policy --help | head -1"
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert out.stdout.splitlines()[0].startswith("usage: text2grad <command>")
    assert out.stdout.splitlines()[1].startswith("usage: text2grad train-policy")
    assert "BrokenPipeError" not in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def files(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "1", "prompt": "p", "response": "r"}) + "\n")
    (tmp_path / "a_file").write_text("mine")
    return tmp_path


# (command line, what stderr must say). Each is refused with exit 2 before any model or server is touched.
BAD_INPUTS = [
    ("annotate --input {t}/in.jsonl --output {t}/o.jsonl --conc 3", "unrecognized arguments: --conc"),
    ("annotate --input {t}/in.jsonl --output {t}/o.jsonl --concurrency 0", "concurrency must be > 0"),
    ("annotate --input {t}/in.jsonl --output {t}/o.jsonl --max_tokens -5", "max_tokens must be > 0"),
    ("annotate --input {t}/in.jsonl --output {t}/in.jsonl", "is the input file"),
    ("annotate --input {t}/in.jsonl --output {t}", "is a directory"),
    ("train-rm --train_file {t}/in.jsonl --output_dir {t}/rm --learning_rate=-1e-5", "learning_rate must be > 0"),
    ("train-rm --train_file {t}/in.jsonl --output_dir {t}/rm --per_device_train_batch_size 0",
     "per_device_train_batch_size must be > 0"),
    ("train-rm --train_file {t}/in.jsonl --output_dir {t}/a_file --model_name_or_path {t}", "is a file"),
    ("train-rm --train_file {t}/in.jsonl --output_dir {t}/rm --model_name_or_path {t}/missing_model",
     "model path '{t}/missing_model' does not exist"),
    ("train-policy --dataset_path {t}/in.jsonl --model_name_or_path {t} --num_iterations 1 --learning_rate 0",
     "learning_rate must be > 0"),
    ("train-policy --dataset_path {t}/in.jsonl --model_name_or_path {t} --num_iterations 1 --output_dir {t}/a_file",
     "is a file"),
    ("train-policy --dataset_path {t}/in.jsonl --model_name_or_path {t}/missing_model --num_iterations 1 "
     "--output_dir {t}/ppo", "model path '{t}/missing_model' does not exist"),
    ("train-policy --dataset_path {t}/in.jsonl --num_iterations 1 --batch_size -4", "batch_size must be >= 1"),
    ("sft --dataset_path {t}/in.jsonl --learning_rate 0", "learning_rate must be > 0"),
    ("sft --dataset_path {t}/in.jsonl --model_name_or_path {t} --output_dir {t}/a_file", "is a file"),
    ("dpo --dataset_path {t}/in.jsonl --per_device_train_batch_size 0", "per_device_train_batch_size must be > 0"),
    ("code-pairs --input {t}/in.jsonl --output {t}/in.jsonl", "is the input file"),
    ("train-policy --resume_from_checkpoint auto", "unrecognized arguments: --resume_from_checkpoint"),
]


@pytest.mark.parametrize("line, message", BAD_INPUTS, ids=[b[0][:60] for b in BAD_INPUTS])
def test_bad_inputs_are_refused_with_one_error_format(files, capsys, monkeypatch, line, message):
    def no_model(*a, **k):
        raise AssertionError("a model was loaded although the input was bad")

    monkeypatch.setattr(rm, "_build_model", no_model)
    monkeypatch.setattr(ppo, "load_models", no_model)
    rc, _, err = _run(line.format(t=files).split(), capsys)
    assert rc == 2, err
    assert any(l.startswith("error: ") for l in err.splitlines()), err
    assert message.format(t=files) in err
    assert "Traceback" not in err
    assert (files / "a_file").read_text() == "mine" and not (files / "rm").exists() and not (files / "ppo").exists()
    assert not list(Path(files).glob("o.jsonl*"))


def test_quiet_logs_hide_library_noise_and_log_level_info_shows_it():
    script = (
        "import logging, sys; from text2grad.core.config import configure_logging; configure_logging(sys.argv[1]);"
        "logging.getLogger('DeepSpeed').warning('Setting accelerator to CPU. If you have GPU ...');"
        "logging.getLogger('accelerate.utils.other').warning(\"Removed shared tensor {'b'} while saving.\");"
        "logging.getLogger('accelerate.state').info('Distributed environment: NO');"
        "logging.getLogger('policy_optimization.train').info('done: policy saved');"
        "logging.getLogger('transformers.trainer').warning('a real warning')"
    )
    quiet = subprocess.run([sys.executable, "-c", script, "warning"], capture_output=True, text=True, timeout=120).stderr
    loud = subprocess.run([sys.executable, "-c", script, "info"], capture_output=True, text=True, timeout=120).stderr
    assert "accelerator" not in quiet and "shared tensor" not in quiet and "Distributed environment" not in quiet
    assert "done: policy saved" in quiet and "a real warning" in quiet  # ours, and warnings one can act on
    for line in ("Setting accelerator to CPU", "Removed shared tensor", "Distributed environment", "done: policy saved"):
        assert line in loud


def test_deprecated_spellings_still_work_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        ann = load_config(AnnotationConfig, overrides={"progress": "false"})
        rm = load_config(RewardModelConfig, overrides={"disable_tqdm": "true", "resume_from_checkpoint": "latest"})
    assert ann.progress_bar is False and rm.progress_bar is False and rm.resume == "auto"
    assert "'disable_tqdm' is deprecated; use 'progress_bar' (with the opposite value)" in caplog.text
    configure_logging("warning")
