"""The CLIs in-process, as the quickstart and the shell scripts call them: sft -> train (PPO) and dpo."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from policy_optimization import dpo, sft, train
from policy_optimization.ppo_config import PPOConfig, ProcessBatch
from policy_optimization.dpo_config import DPORunConfig
from policy_optimization.sft import load_pairs
from text2grad.apps.tiny import make_tiny_world
from text2grad.core.data import write_jsonl
from text2grad.core.modeling import load_causal_lm


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_tiny_world("slf5k", tmp_path_factory.mktemp("tiny") / "world", n_train=8, n_eval=2)


PROMPT = "Title: {title}\n\n{post}\n\nTL;DR:"


@pytest.mark.slow
def test_sft_then_ppo_then_dpo_write_loadable_models(world, tmp_path):
    # the files prepare-data wrote from the tiny world's native SLF5K rows
    data, model = str(world / "data" / "rl_prompts.jsonl"), str(world / "model")
    assert sft.main([
        "--model_name_or_path", model, "--dataset_path", str(world / "data" / "sft.jsonl"), "--prompt_template", PROMPT,
        "--completion_template", "{completion}", "--output_dir", str(tmp_path / "sft"), "--max_steps", "2",
        "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--lora_r", "4", "--save_steps", "1000",
    ]) == 0
    assert json.loads((tmp_path / "sft" / "adapter_config.json").read_text())["base_model_name_or_path"] == model

    rc = train.main([
        "--model_name_or_path", model, "--adapter", str(tmp_path / "sft"), "--dataset_path", data,
        "--prompt_template", PROMPT, "--feedback_prompt_template", "{post}",
        "--critic", "reference", "--reward_mode", "mixed", "--scalar_source", "tests.policy_optimization.po_testlib:word_count_score",
        "--num_iterations", "2", "--batch_size", "4", "--num_mini_batches", "2", "--num_ppo_epochs", "1",
        "--response_length", "8", "--learning_rate", "1e-3", "--lora_r", "4", "--output_dir", str(tmp_path / "ppo"),
        "--progress_bar", "false",
    ])
    assert rc == 0
    out = tmp_path / "ppo"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2] and all(m["samples/feedback_error"] == 0 for m in metrics)
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert sample["feedback_prompt"] in sample["prompt"] and sample["prompt"].endswith("TL;DR:")
    # The PPO adapter sits on the SFT-merged base, which was saved so the adapter loads on its own.
    adapter_cfg = json.loads((out / "policy" / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == str(out / "base_merged")
    policy = load_causal_lm(str(out / "policy"))
    ids = torch.tensor([[5, 6, 7]])
    assert torch.isfinite(policy(input_ids=ids).logits).all()

    assert dpo.main([
        "--model_name_or_path", model, "--dataset_path", str(world / "data" / "preference_pairs.jsonl"),
        "--prompt_template", PROMPT, "--chosen_template", "{chosen}", "--rejected_template", "{rejected}", "--output_dir", str(tmp_path / "dpo"),
        "--max_steps", "1", "--per_device_train_batch_size", "2", "--lora_r", "4", "--save_steps", "1000",
        "--learning_rate", "1e-3",
    ]) == 0
    # The one DPO step really trained: LoRA B starts at zero, so a non-zero B and different logits mean an update.

    adapter = load_file(str(tmp_path / "dpo" / "adapter_model.safetensors"))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and any(bool(t.abs().sum() > 0) for t in lora_b)
    with torch.no_grad():
        base_logits = load_causal_lm(model)(input_ids=ids).logits
        dpo_logits = load_causal_lm(str(tmp_path / "dpo"))(input_ids=ids).logits
    assert torch.isfinite(dpo_logits).all() and not torch.equal(base_logits, dpo_logits)


def test_train_cli_reports_bad_input_clearly(world, tmp_path, capsys):
    base = ["--model_name_or_path", str(world / "model"), "--num_iterations", "1", "--output_dir", str(tmp_path / "o")]
    assert train.main(base + ["--dataset_path", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    data = str(world / "data" / "rl_prompts.jsonl")
    assert train.main(base + ["--dataset_path", data, "--prompt_template", "{nope}", "--critic", "reference"]) == 2
    assert "nope" in capsys.readouterr().err
    assert train.main(base + ["--dataset_path", data, "--prompt_template", "{post}", "--critic", "no_such_source"]) == 2
    assert "unknown critic 'no_such_source'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: invalid choice for a Literal field
        train.main(base + ["--dataset_path", data, "--reward_mode", "sparse"])
    assert "reward_mode" in capsys.readouterr().err


def test_train_cli_setup_errors_are_reported_not_raised(world, tmp_path, capsys, monkeypatch):
    """Wrong constructor kwargs (TypeError) and a missing optional package (ImportError) are user errors."""
    base = [
        "--model_name_or_path", str(world / "model"), "--num_iterations", "1", "--output_dir", str(tmp_path / "o"),
        "--dataset_path", str(world / "data" / "rl_prompts.jsonl"), "--prompt_template", "{post}",
    ]
    rc = train.main(base + ["--critic", "reference", "--critic_kwargs", '{"no_such_option": 1}'])
    err = capsys.readouterr().err
    assert rc == 2 and "error:" in err and "no_such_option" in err and "critic_kwargs" in err
    assert "Traceback" not in err

    monkeypatch.setitem(sys.modules, "openai", None)  # as if the optional package were not installed
    monkeypatch.delitem(sys.modules, "annotation.llm", raising=False)
    rc = train.main(base + ["--critic", "llm"])
    err = capsys.readouterr().err
    assert rc == 2 and "error:" in err and "pip install openai" in err and "Traceback" not in err


def test_config_checks_choice_fields_and_save_total_limit_when_built():
    with pytest.raises(ValueError, match=r"report_to must be one of \['none', 'tensorboard', 'wandb'\], got 'tb'"):
        PPOConfig(report_to="tb")
    for field, bad in [("kl_estimator", "k2"), ("reward_scheme", "cosine"), ("boundary", "some"),
                       ("overlap", "both"), ("occurrence", "last"), ("reward_mode", "sparse")]:
        with pytest.raises(ValueError, match=f"{field} must be one of"):
            PPOConfig(**{field: bad})
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        PPOConfig(dtype="float8")
    with pytest.raises(ValueError, match="save_total_limit must be >= 1, got 0.*none"):
        PPOConfig(save_total_limit=0)
    ok = PPOConfig(report_to="wandb", kl_estimator="k3", dtype="bf16", save_total_limit=None)
    assert (ok.report_to, ok.kl_estimator, ok.save_total_limit) == ("wandb", "k3", None)


def test_config_rejects_inconsistent_batch_settings():
    with pytest.raises(ValueError, match="divisible by num_mini_batches"):
        PPOConfig(batch_size=6, num_mini_batches=4)
    with pytest.raises(ValueError, match="divisible by num_mini_batches 2 x gradient_accumulation_steps 3 = 6"):
        PPOConfig(batch_size=8, num_mini_batches=2, gradient_accumulation_steps=3)
    cfg = PPOConfig(batch_size=8, num_mini_batches=2, gradient_accumulation_steps=2, total_episodes=100)
    # batch_size is global: 2 processes sample 4 rollouts each, 2 per minibatch, 1 per micro-batch
    assert cfg.process_batch(1) == ProcessBatch(rollouts=8, mini_batch=4, micro_batch=2)
    assert cfg.process_batch(2) == ProcessBatch(rollouts=4, mini_batch=2, micro_batch=1)
    assert cfg.iterations() == 13  # ceil(100 episodes / 8 per iteration), at any process count
    with pytest.raises(ValueError, match=r"divisible by 4 processes x num_mini_batches 2 x gradient_accumulation_steps 2 = 16"
                                         r".*multiple of 16 \(e.g. 16\).*launch a number of processes that works with this batch: 1, 2"):
        cfg.process_batch(4)
    paper = PPOConfig(batch_size=12, num_mini_batches=2)  # configs/slf5k/ppo.yaml on 8 GPUs
    with pytest.raises(ValueError, match=r"multiple of 16 \(e.g. 16\).*: 1, 2, 3, 6$"):
        paper.process_batch(8)
    with pytest.raises(ValueError, match="num_iterations or total_episodes"):
        PPOConfig().iterations()


def test_dpo_pairs_from_conversation_records(tmp_path):
    turn = lambda text: [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": text}]  # noqa: E731
    write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Q?", "chosen": turn("good"), "rejected": turn("bad")}])
    cfg = DPORunConfig(dataset_path=str(tmp_path / "pairs.jsonl"), use_chat_template=False)
    rows = load_pairs(cfg, {"prompt": "{prompt}", "chosen": "{chosen}", "rejected": "{rejected}"})
    assert rows == [{"prompt": "Q?", "chosen": "good", "rejected": "bad"}]
