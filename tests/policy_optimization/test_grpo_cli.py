"""`python -m policy_optimization.grpo`: Text2Grad-GRPO from a config, on the tiny SLF5K world."""

from __future__ import annotations

import json

import pytest
import torch

from policy_optimization.grpo import main
from text2grad.apps.tiny import make_tiny_world
from text2grad.core.modeling import load_causal_lm

PROMPT = "{prompt}"  # rl_prompts.jsonl of `text2grad prepare-data` carries the rendered prompt


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_tiny_world("slf5k", tmp_path_factory.mktemp("tiny") / "world", n_train=8, n_eval=2)


def grpo_args(world, out, *extra: str) -> list[str]:
    return [
        "--model_name_or_path", str(world / "model"), "--dataset_path", str(world / "data" / "rl_prompts.jsonl"),
        "--prompt_template", PROMPT, "--critic", "tests.policy_optimization.po_testlib:first_and_last_words",
        "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "8",
        "--max_steps", "2", "--learning_rate", "1e-3", "--lora_r", "4", "--output_dir", str(out), "--save_steps", "1000",
        "--seed", "0", *extra,
    ]


@pytest.mark.slow
def test_grpo_cli_trains_two_steps_with_span_advantages(world, tmp_path):
    out = tmp_path / "grpo"
    assert main(grpo_args(world, out)) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "text2grad/nonzero_reward_share" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # the critic quotes two words as good and one as poor (nothing for completions under 3 words): span rewards
    # reach the token advantages in at least one step
    shares = [r["text2grad/nonzero_reward_share"] for r in steps]
    assert all(0 <= x <= 1 for x in shares) and max(shares) > 0, shares
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(world / "model")
    assert (out / "grpo_config.yaml").is_file()
    load_causal_lm(str(out))  # the adapter loads on its base


def test_grpo_cli_errors_exit_2_before_loading_a_model(world, tmp_path, capsys):
    assert main(grpo_args(world, tmp_path / "x", "--critic", "no_such_critic")) == 2
    assert capsys.readouterr().err.startswith("error: unknown critic 'no_such_critic'")
    with pytest.raises(SystemExit) as exc:  # a bad config value stops in the parser, like every CLI here
        main(grpo_args(world, tmp_path / "x", "--per_device_train_batch_size", "3"))
    assert exc.value.code == 2 and "error: per_device_train_batch_size (3) must be a multiple" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_grpo_refuses_colocated_vllm_without_a_gpu(world, tmp_path, capsys):
    assert main(grpo_args(world, tmp_path / "x", "--use_vllm", "true", "--vllm_mode", "colocate")) == 2
    assert "use_vllm with vllm_mode colocate needs a GPU" in capsys.readouterr().err
