"""One CLI convention for every entry point: ``--help`` works for every subcommand and module (grouped, with
``text2grad <command>`` in its usage line), ``--version``, no abbreviated flags, ``error: <message>`` and exit 2
for every bad input before any model loads, ``text2grad`` with no command exits 2, ``| head`` ends quietly,
and library noise stays out of a quiet run's logs."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from annotation.config import AnnotationConfig
from policy_optimization.code_pairs import CodePairsConfig
from policy_optimization.config import PPOConfig
from policy_optimization.dpo import DPORunConfig
from policy_optimization.grpo import GRPORunConfig
from policy_optimization.sft import SFTRunConfig
from reward_model.evaluate import EvalConfig
from reward_model.merge import MergeConfig
from reward_model.scalar import ScalarRMConfig
from reward_model.train import RewardModelConfig
import policy_optimization.train as ppo
import reward_model.train as rm
from text2grad.apps.cli import available
from text2grad.apps.cli import main as text2grad
from text2grad.apps.evaluation.code.cli import CodeEvalConfig
from text2grad.apps.evaluation.compare_feedback import CompareConfig
from text2grad.apps.evaluation.qa import QAEvalConfig
from text2grad.apps.evaluation.summarization import SummarizationEvalConfig
from text2grad.apps.prepare_data.common import PrepareDataConfig
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
from text2grad.core.config import RENAMED_KEYS, ConfigError, configure_logging, load_config, renamed_keys

COMMANDS = sorted(available())
# The config dataclass behind each subcommand.
CONFIGS = {
    "quickstart": QuickstartConfig, "prepare-data": PrepareDataConfig, "annotate": AnnotationConfig,
    "train-rm": RewardModelConfig, "eval-rm": EvalConfig, "merge-rm": MergeConfig, "train-scalar-rm": ScalarRMConfig,
    "sft": SFTRunConfig, "train-policy": PPOConfig, "train-grpo": GRPORunConfig, "dpo": DPORunConfig,
    "code-pairs": CodePairsConfig, "eval-summarization": SummarizationEvalConfig, "eval-code": CodeEvalConfig,
    "eval-qa": QAEvalConfig, "compare-feedback": CompareConfig,
}
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
    ("train-policy --resume_from_checkpoint auto", "resume_from_checkpoint was renamed to resume"),
    ("annotate --feedback_source llm", "feedback_source was renamed to critic"),
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


def test_every_subcommand_has_its_config_listed_here():
    assert set(CONFIGS) == set(COMMANDS)


def test_renamed_keys_fail_naming_the_new_key_on_the_command_line(capsys):
    rc, _, err = _run(["train-policy", "--feedback_source", "reward_model"], capsys)
    assert rc == 2 and "error: feedback_source was renamed to critic" in err and "--critic" in err
    rc, _, err = _run(["train-grpo", "--feedback-source-kwargs", "{}"], capsys)  # the dashed spelling too
    assert rc == 2 and "error: feedback_source_kwargs was renamed to critic_kwargs" in err
    rc, _, err = _run(["train-rm", "--disable_tqdm", "true"], capsys)
    assert rc == 2 and "disable_tqdm was renamed to progress_bar (with the opposite value" in err


def test_renamed_keys_fail_naming_the_new_key_in_a_yaml_file(tmp_path, capsys):
    (tmp_path / "ppo.yaml").write_text("feedback_source: reward_model\nfeedback_source_kwargs: {path: x}\n")
    rc, _, err = _run(["train-policy", "--config", str(tmp_path / "ppo.yaml")], capsys)
    assert rc == 2
    assert "feedback_source was renamed to critic:" in err and "feedback_source_kwargs was renamed to critic_kwargs" in err
    assert f"(in {tmp_path / 'ppo.yaml'})" in err
    with pytest.raises(ConfigError, match="resume_from_checkpoint was renamed to resume"):
        load_config(RewardModelConfig, overrides={"resume_from_checkpoint": "latest"})


def test_every_renamed_key_is_refused_by_every_cli_that_has_its_new_name(capsys):
    """The one table (`RENAMED_KEYS`) holds for every command: each old key whose new name a command has is
    refused with exit 2 and a message naming that new key, and no command still has an old key as a field."""
    checked = 0
    for command in COMMANDS:
        cls = CONFIGS[command]
        fields = {f.name for f in dataclasses.fields(cls)}
        for old, message in renamed_keys(cls).items():
            new = next(n for n in RENAMED_KEYS[old].to if n in fields)
            rc, _, err = _run([command, f"--{old}", "1"], capsys)
            assert rc == 2 and f"error: {old} was renamed to {new}" in err, (command, old, err)
            checked += 1
    assert checked >= 25  # every command has at least its data input, most a progress bar or a critic too


def test_the_renamed_table_has_no_live_field_left():
    """An old spelling is no field of any CLI's config (else that CLI would still answer to two names), except
    prepare-data's eval_split, which names a split of the source dataset, not held-out records."""
    live = {(command, old) for command in COMMANDS for old in RENAMED_KEYS
            if old in {f.name for f in dataclasses.fields(CONFIGS[command])} and "source" in old}
    assert live == set()
