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

from annotation.annotation_config import AnnotationConfig
from policy_optimization.code_pairs_config import CodePairsConfig
from policy_optimization.ppo_config import PPOConfig
from policy_optimization.dpo_config import DPORunConfig
from policy_optimization.grpo_config import GRPORunConfig
from policy_optimization.sft_config import SFTRunConfig
from reward_model.evaluate_config import EvalConfig
from reward_model.merge_config import MergeConfig
from reward_model.scalar_config import ScalarRMConfig
from reward_model.serve_config import ServeCriticConfig
from reward_model.train_config import RewardModelConfig
import policy_optimization.train as ppo
import reward_model.train as rm
from text2grad.apps.cli import available
from text2grad.apps.cli import main as text2grad
from text2grad.apps.evaluation.code.code_eval_config import CodeEvalConfig
from text2grad.apps.evaluation.compare_feedback_config import CompareConfig
from text2grad.apps.evaluation.qa_config import QAEvalConfig
from text2grad.apps.evaluation.summarization_config import SummarizationEvalConfig
from text2grad.apps.feedback_ui.feedback_ui_config import FeedbackUIConfig
from text2grad.apps.prepare_data.prepare_data_config import PrepareDataConfig
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
import text2grad.core.config as config_module
from text2grad.core.critics import load_object
from text2grad.core.data import DataError
from text2grad.core.config import (
    RENAMED_KEYS, ConfigError, configure_logging, invoked_as, load_config, parse_config, renamed_keys,
)

REPO = Path(__file__).resolve().parents[1]
COMMANDS = sorted(available())
# The config dataclass behind each subcommand.
CONFIGS = {
    "quickstart": QuickstartConfig, "prepare-data": PrepareDataConfig, "annotate": AnnotationConfig,
    "train-rm": RewardModelConfig, "eval-rm": EvalConfig, "merge-rm": MergeConfig, "train-scalar-rm": ScalarRMConfig,
    "serve-critic": ServeCriticConfig,
    "sft": SFTRunConfig, "train-policy": PPOConfig, "train-grpo": GRPORunConfig, "dpo": DPORunConfig,
    "code-pairs": CodePairsConfig, "eval-summarization": SummarizationEvalConfig, "eval-code": CodeEvalConfig,
    "eval-qa": QAEvalConfig, "compare-feedback": CompareConfig, "feedback-ui": FeedbackUIConfig,
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


def test_the_command_list_and_version_load_no_ml_library():
    # `text2grad --help` and `--version` are the first things a user types: they print at once, without torch
    script = ("import sys\nfrom text2grad.apps.cli import main\n"
              "assert main(['--help']) == 0 and main(['--version']) == 0\n"
              "print(sorted(m for m in ('torch', 'datasets', 'transformers', 'peft', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: text2grad <command>" in out.stdout and out.stdout.strip().endswith("[]")


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
    ("annotate --dataset_path {t}/in.jsonl --output {t}/o.jsonl --conc 3", "unrecognized arguments: --conc"),
    ("annotate --dataset_path {t}/in.jsonl --output {t}/o.jsonl --concurrency 0", "concurrency must be > 0"),
    ("annotate --dataset_path {t}/in.jsonl --output {t}/o.jsonl --max_tokens -5", "max_tokens must be > 0"),
    ("annotate --dataset_path {t}/in.jsonl --output {t}/in.jsonl", "is the input file"),
    ("annotate --dataset_path {t}/in.jsonl --output {t}", "is a directory"),
    ("train-rm --dataset_path {t}/in.jsonl --output_dir {t}/rm --learning_rate=-1e-5", "learning_rate must be > 0"),
    ("train-rm --dataset_path {t}/in.jsonl --output_dir {t}/rm --per_device_train_batch_size 0",
     "per_device_train_batch_size must be > 0"),
    ("train-rm --dataset_path {t}/in.jsonl --output_dir {t}/a_file --model_name_or_path {t}", "is a file"),
    ("train-rm --dataset_path {t}/in.jsonl --output_dir {t}/rm --model_name_or_path {t}/missing_model",
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
    ("code-pairs --dataset_path {t}/in.jsonl --output {t}/in.jsonl", "is the input file"),
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
    for command, sub in available().items():  # the config `text2grad <command> --help` reads is the command's own
        assert load_object(sub.config) is CONFIGS[command], command


@pytest.mark.parametrize("command", COMMANDS)
def test_the_dispatcher_prints_the_same_help_as_the_command_itself(command, capsys):
    # `text2grad <command> --help` builds the parser from the config alone; the command's main builds it itself
    rc, fast, _ = _run([command, "--help"], capsys)
    with invoked_as(f"text2grad {command}"), pytest.raises(SystemExit) as exc:
        load_object(f"{available()[command].module}:main")(["--help"])
    assert rc == exc.value.code == 0 and fast == capsys.readouterr().out


def test_the_options_of_every_command_print_without_loading_ml_libraries():
    # one process for all commands: a library any of them loads stays in sys.modules, so each line names what
    # that command added
    script = ("import contextlib, io, json, sys\nfrom text2grad.apps.cli import available, main\n"
              "heavy = ('torch', 'datasets', 'transformers', 'peft', 'trl', 'openai', 'deepspeed', 'accelerate', 'vllm')\n"
              "for command in sorted(available()):\n"
              "    with contextlib.redirect_stdout(io.StringIO()) as help_text:\n"
              "        try:\n            main([command, '--help'])\n        except SystemExit as exc:\n"
              "            assert exc.code == 0, command\n"
              "    assert help_text.getvalue().startswith(f'usage: text2grad {command}'), command\n"
              "    print(json.dumps([command, sorted(m for m in heavy if m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = dict(json.loads(line) for line in out.stdout.splitlines())
    assert sorted(loaded) == COMMANDS and {c: libs for c, libs in loaded.items() if libs} == {}


def test_renamed_keys_fail_naming_the_new_key_on_the_command_line(capsys):
    rc, _, err = _run(["train-policy", "--feedback_source", "reward_model"], capsys)
    assert rc == 2 and "error: feedback_source was renamed to critic" in err and "--critic" in err
    rc, _, err = _run(["train-grpo", "--feedback-source-kwargs", "{}"], capsys)  # the dashed spelling too
    assert rc == 2 and "error: feedback_source_kwargs was renamed to critic_kwargs" in err
    rc, _, err = _run(["train-rm", "--disable_tqdm", "true"], capsys)
    assert rc == 2 and "disable_tqdm was renamed to progress_bar (with the opposite value" in err


def test_a_renamed_value_fails_naming_the_new_value(capsys):
    rc, _, err = _run(["train-policy", "--scalar_source", "spans"], capsys)
    assert rc == 2 and "scalar_source 'spans' was renamed to quote_count" in err and "--scalar_source quote_count" in err


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
            if old in {f.name for f in dataclasses.fields(CONFIGS[command])}}
    assert live == {("prepare-data", "eval_split")}


SHIPPED_YAML = {
    "annotation.yaml": AnnotationConfig, "reward_model.yaml": RewardModelConfig, "scalar_rm.yaml": ScalarRMConfig,
    "ppo.yaml": PPOConfig, "grpo.yaml": GRPORunConfig, "sft.yaml": SFTRunConfig, "dpo.yaml": DPORunConfig,
    "quickstart.yaml": QuickstartConfig, "slf5k/eval.yaml": SummarizationEvalConfig,
    "ultrafeedback/eval.yaml": QAEvalConfig, "kodcode/eval.yaml": CodeEvalConfig,
}


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").glob("*/*.yaml")
                                        if p.parent.name not in ("accelerate",)))
def test_every_shipped_yaml_loads_with_the_house_spellings(path):
    cls = SHIPPED_YAML.get(path) or SHIPPED_YAML[Path(path).name]
    # the eval configs leave what to evaluate to the command line (as their headers show)
    required = {"slf5k/eval.yaml": {"dataset_path": "d.jsonl", "model": "m"}, "kodcode/eval.yaml": {"model": "m"},
                "ultrafeedback/eval.yaml": {"task": "arc", "dataset_path": "d.jsonl", "model": "m"}}
    cfg = load_config(cls, REPO / "configs" / path, required.get(path))  # an old key: "... was renamed to ..."
    assert isinstance(cfg, cls)


def test_one_data_input_name_from_yaml_to_command_line(tmp_path):
    """dataset_path / eval_dataset_path / critic / progress_bar set in a YAML, then overridden by a flag."""
    (tmp_path / "rm.yaml").write_text("dataset_path: a.jsonl\neval_dataset_path: b.jsonl\nprogress_bar: false\n")
    cfg = parse_config(RewardModelConfig, ["--config", str(tmp_path / "rm.yaml"), "--dataset_path", "c.jsonl"])
    assert (cfg.dataset_path, cfg.eval_dataset_path, cfg.progress_bar) == ("c.jsonl", "b.jsonl", False)
    (tmp_path / "ann.yaml").write_text("dataset_path: a.jsonl\ndataset_split: validation\ncritic: reference\n")
    cfg = parse_config(AnnotationConfig, ["--config", str(tmp_path / "ann.yaml"), "--critic", "llm"])
    assert (cfg.dataset_path, cfg.dataset_split, cfg.critic) == ("a.jsonl", "validation", "llm")
    cfg = parse_config(QAEvalConfig, ["--task", "arc", "--model", "m", "--dataset_path", "allenai/ai2_arc", "--dataset_config", "ARC-Challenge",
                                      "--dataset_split", "test", "--progress_bar", "false"])
    assert (cfg.dataset_config, cfg.dataset_split, cfg.progress_bar) == ("ARC-Challenge", "test", False)
    assert parse_config(ScalarRMConfig, ["--progress_bar", "false"]).progress_bar is False


@pytest.mark.parametrize("cls, old, new", [
    (RewardModelConfig, "eval_file", "eval_dataset_path"), (EvalConfig, "eval_file", "dataset_path"),
    (CompareConfig, "eval_file", "dataset_path"), (ScalarRMConfig, "train_file", "dataset_path"),
    (AnnotationConfig, "input", "dataset_path"), (SummarizationEvalConfig, "data", "dataset_path"),
    (CodeEvalConfig, "show_progress", "progress_bar"), (PPOConfig, "feedback_source", "critic"),
])
def test_an_old_key_names_the_new_key_of_that_command(cls, old, new):
    with pytest.raises(ConfigError, match=f"^{old} was renamed to {new}"):
        load_config(cls, overrides={old: "x"})


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_main_runs_under_the_shared_wrapper(command, monkeypatch, capsys):
    """Each module's own ``main`` (what ``python -m`` runs, without the dispatcher's guard) goes through
    `text2grad.core.cli.run_cli`: a data error after parsing is ``error: ...`` + exit 2, Ctrl-C is exit 130."""
    command_main = load_object(f"{available()[command].module}:main")

    def raise_(exc):
        def load(*args, **kwargs):
            raise exc
        return load

    monkeypatch.setattr(config_module, "load_config", raise_(DataError("the records are bad")))
    assert command_main([]) == 2
    assert capsys.readouterr().err.strip().endswith("error: the records are bad")
    monkeypatch.setattr(config_module, "load_config", raise_(KeyboardInterrupt()))
    assert command_main([]) == 130
