"""PPO fails loudly and never mixes runs: bad numbers and bad output paths stop before any model loads,
a critic that mostly fails stops the run (exit 1) with a warning on every iteration that had errors,
and a resume with a changed config is refused unless accepted (then recorded)."""

from __future__ import annotations

import json
import logging

import pytest
import yaml
from tests.policy_optimization.po_testlib import PROMPTS, first_and_last_words

from policy_optimization import train
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.config import ConfigError
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import build_tiny_llama


class Unreachable:
    """A critic whose server is down (sources should never raise; a broken one does)."""

    def __init__(self, **kwargs):
        pass

    def feedback(self, prompts, responses):
        raise ConnectionError("http://127.0.0.1:9/v1 refused the connection")


@pytest.fixture
def model_dir(tmp_path, bpe_tokenizer):
    path = tmp_path / "model"
    build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(path)
    bpe_tokenizer.save_pretrained(path)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def _args(tmp_path, model_dir, *extra):
    return ["--model_name_or_path", str(model_dir), "--dataset_path", str(tmp_path / "prompts.jsonl"),
            "--num_iterations", "1", "--batch_size", "4", "--num_mini_batches", "1", "--num_ppo_epochs", "1",
            "--response_length", "4", "--lora_r", "2", "--progress_bar", "false", "--output_dir", str(tmp_path / "run"),
            *extra]


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded although the arguments were wrong")

    monkeypatch.setattr(train, "load_models", refuse)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--learning_rate", "-1e-5"], "learning_rate must be > 0, got -1e-05"),
        (["--learning_rate", "0"], "learning_rate must be > 0, got 0"),
        (["--batch_size", "0"], "batch_size must be >= 1, got 0"),
        (["--weight_decay", "-0.1"], "weight_decay must be >= 0"),
        (["--max_feedback_error_rate", "1.5"], "max_feedback_error_rate is a share in [0, 1]"),
        (["--top_p", "0"], "top_p must be > 0"),
    ],
)
def test_bad_numbers_stop_before_anything_loads(tmp_path, model_dir, capsys, no_model_loading, extra, message):
    with pytest.raises(SystemExit) as exc:  # the parser rejects the value: usage line, "error: ...", exit 2
        train.main(_args(tmp_path, model_dir, *extra))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_output_dir_that_is_a_file_or_an_earlier_run_is_refused_before_models_load(tmp_path, model_dir, capsys,
                                                                                    no_model_loading):
    (tmp_path / "run").write_text("my notes")
    assert train.main(_args(tmp_path, model_dir)) == 2
    assert "error: output_dir " in capsys.readouterr().err and (tmp_path / "run").read_text() == "my notes"
    (tmp_path / "run").unlink()
    (tmp_path / "run" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-3" / "trainer_state.json").write_text("{}")
    assert train.main(_args(tmp_path, model_dir)) == 2
    err = capsys.readouterr().err
    assert "already holds a run (checkpoint-3)" in err and "--resume auto" in err and "--overwrite_output_dir true" in err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint-3"]  # no stray base_merged etc.


def test_a_critic_that_fails_stops_the_run_with_exit_1(tmp_path, model_dir, capsys):
    rc = train.main(_args(tmp_path, model_dir, "--critic", f"{__name__}:Unreachable"))
    err = capsys.readouterr().err
    assert rc == 1
    assert "error: stopped: iteration 1: feedback failed for 4 of 4 samples (100%)" in err
    assert "ConnectionError: http://127.0.0.1:9/v1 refused the connection" in err
    assert not (tmp_path / "run" / "policy").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_each_iteration_with_feedback_errors_warns_and_training_goes_on_below_the_limit(make_trainer, caplog):
    def one_in_four_fails(prompt, response):
        return Feedback.failed("unparseable critique") if prompt == PROMPTS[0] else first_and_last_words(prompt, response)

    trainer = make_trainer(CallableFeedbackSource(one_in_four_fails), num_iterations=2, max_feedback_error_rate=0.5,
                           dataset=[{"prompt": p} for p in PROMPTS[:4]])
    with caplog.at_level(logging.WARNING, logger="policy_optimization.trainer"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "got no feedback" in r.getMessage()]
    assert len(warnings) == 2  # one per iteration (each batch holds the failing prompt)
    assert all("1 of 4 samples got no feedback (25%); first cause: unparseable critique" in w for w in warnings)
    assert trainer.state.step == 2


def test_resume_with_a_changed_config_is_refused_unless_accepted_and_then_recorded(make_trainer, tmp_path):
    source = CallableFeedbackSource(first_and_last_words)
    make_trainer(source, num_iterations=1).train()
    run = tmp_path / "run"
    changed = make_trainer(source, num_iterations=2, resume="auto", kl_coef=0.5, learning_rate=1e-3)
    with pytest.raises(ConfigError, match=r"kl_coef: 0.05 -> 0.5; learning_rate: 0.003 -> 0.001.*--accept_config_changes"):
        changed.train()
    assert yaml.safe_load((run / "ppo_config.yaml").read_text())["kl_coef"] == 0.05  # untouched
    # how long to run may change freely; the run continues
    longer = make_trainer(source, num_iterations=2, resume="auto")
    longer.train()
    assert longer.state.step == 2 and not (run / "config_changes.jsonl").exists()
    accepted = make_trainer(source, num_iterations=3, resume="auto", kl_coef=0.5, accept_config_changes=True)
    accepted.train()
    (change,) = [json.loads(line) for line in (run / "config_changes.jsonl").read_text().splitlines()]
    assert change["step"] == 2 and change["changes"] == {"kl_coef": [0.05, 0.5]}
    assert yaml.safe_load((run / "ppo_config.yaml").read_text())["kl_coef"] == 0.5


def test_overwrite_removes_the_earlier_runs_files_so_runs_never_mix(make_trainer, tmp_path):
    source = CallableFeedbackSource(first_and_last_words)
    make_trainer(source, num_iterations=2, save_steps=1, save_total_limit=None).train()
    run = tmp_path / "run"
    assert (run / "checkpoint-2").is_dir()
    with pytest.raises(FileExistsError, match="already holds a run"):
        make_trainer(source, num_iterations=1).train()
    make_trainer(source, num_iterations=1, overwrite_output_dir=True).train()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
