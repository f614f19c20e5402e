"""Scalar (Bradley-Terry) reward model: loss definition and direction, encoding, training CLI, PPO scorer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, TrainingArguments

from policy_optimization.ppo_config import SCALAR_SOURCES, PPOConfig
from reward_model.scalar import (
    CONFIG_FILENAME,
    ScalarRewardScorer,
    encode_pair_text,
    load_pairs,
    main,
    pairwise_accuracy,
    pairwise_loss,
    split_pairs,
)
from reward_model.scalar import _reward_config
from reward_model.scalar_config import ScalarRMConfig
from reward_model.train import shared_training_kwargs, training_arguments
from reward_model.train_config import RewardModelConfig
from text2grad.core.critics import load_object
from text2grad.core.data import DataError

# Hand-written pairs in the layout of `text2grad prepare-data`'s preference_pairs.jsonl.
PAIRS = [
    {"prompt": "Summarize: Alex moved to Berlin for a job.", "chosen": "Alex moved to Berlin for work.",
     "rejected": "Alex moved to Oslo for a holiday."},
    {"prompt": "Write add(a, b).", "chosen": "def add(a, b):\n    return a + b", "rejected": "def add(a, b):\n    return a - b"},
    {"prompt": "Summarize: Sam wants a dog but the landlord says no.", "chosen": "Sam wants a dog; the landlord refuses.",
     "rejected": "Sam wants a cat."},
    {"prompt": "How do I find a bike in Lisbon?", "chosen": "Check local listings and compare prices.",
     "rejected": "Bikes are vehicles."},
]


def test_pairwise_loss_is_minus_log_sigmoid_of_the_margin():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0])
    expected = (-math.log(1 / (1 + math.exp(-1.0))) - math.log(0.5)) / 2
    assert float(pairwise_loss(chosen, rejected)) == pytest.approx(expected, rel=1e-6)
    # a larger chosen-over-rejected margin always costs less
    assert float(pairwise_loss(torch.tensor([3.0]), torch.tensor([0.0]))) < float(pairwise_loss(torch.tensor([0.0]), torch.tensor([3.0])))


def test_encoding_keeps_the_response_and_cuts_the_prompt_from_the_left(rm_tokenizer):
    tok = rm_tokenizer
    full = encode_pair_text(tok, "Summarize: Alex moved.", "Alex moved to Berlin.", prompt_template="{prompt}\n\n", max_length=512)
    body = tok("Alex moved to Berlin.", add_special_tokens=False)["input_ids"]
    assert full[-1] == tok.eos_token_id and full[-1 - len(body) : -1] == body
    short = encode_pair_text(tok, "Summarize: Alex moved. " * 20, "Alex moved to Berlin.", prompt_template="{prompt}\n\n",
                             max_length=len(body) + 6)
    assert len(short) == len(body) + 6 and short[-1 - len(body) : -1] == body


def test_pairs_are_checked_and_split(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    assert load_pairs(str(path), "train", {}) == PAIRS
    train, held = split_pairs(PAIRS, 0.25, seed=0)
    assert len(held) == 1 and len(train) == 3 and held[0] not in train
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "chosen": "c"}) + "\n")
    with pytest.raises(DataError, match="rejected"):
        load_pairs(str(bad), "train", {})


@pytest.fixture(scope="module")
def scalar_run(rm_world):
    torch.set_num_threads(1)
    (rm_world / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = rm_world / "scalar"
    args = ["--model_name_or_path", str(rm_world / "base"), "--dataset_path", str(rm_world / "pairs.jsonl"),
            "--eval_dataset_path", str(rm_world / "pairs.jsonl"), "--output_dir", str(out), "--max_steps", "15",
            "--learning_rate", "5e-3", "--per_device_train_batch_size", "4", "--lora_r", "8", "--lora_alpha", "16",
            "--lora_dropout", "0.0", "--max_length", "96", "--save_steps", "1000", "--logging_steps", "5",
            "--progress_bar", "false", "--dtype", "fp32", "--seed", "0"]
    assert main(args) == 0
    return out


def test_training_puts_chosen_above_rejected_on_the_training_pairs(rm_world, rm_tokenizer, scalar_run):
    cfg = ScalarRMConfig(model_name_or_path=str(rm_world / "base"), max_length=96)
    torch.manual_seed(0)
    untrained = AutoModelForSequenceClassification.from_pretrained(str(rm_world / "base"), num_labels=1)
    untrained.config.pad_token_id = rm_tokenizer.pad_token_id
    before = pairwise_accuracy(ScalarRewardScorer(model=untrained, tokenizer=rm_tokenizer, config=cfg, device="cpu"), PAIRS)
    scorer = ScalarRewardScorer(str(scalar_run), device="cpu")  # the saved adapter + head, loaded like PPO does
    after = pairwise_accuracy(scorer, PAIRS)
    assert after["accuracy"] == 1.0 and after["mean_margin"] > max(before["mean_margin"], 0.0) + 0.5, (before, after)
    # the loss the trainer minimised is lower after training
    chosen = torch.tensor(scorer([p["prompt"] for p in PAIRS], [p["chosen"] for p in PAIRS]))
    rejected = torch.tensor(scorer([p["prompt"] for p in PAIRS], [p["rejected"] for p in PAIRS]))
    assert float(pairwise_loss(chosen, rejected)) < math.log(2)
    report = json.loads((scalar_run / "eval_pairwise.json").read_text())
    assert report["pairs"] == 4 and report["accuracy"] == 1.0
    for name in ("adapter_config.json", "tokenizer.json", CONFIG_FILENAME):
        assert (scalar_run / name).is_file(), name
    # every logged step in metrics.jsonl, as the other trainers write it (15 steps, logged every 5)
    logged = [json.loads(line) for line in (scalar_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged if "loss" in m] == [5, 10, 15]
    assert all(math.isfinite(float(m["loss"])) for m in logged if "loss" in m)


def test_cli_errors_exit_2_before_loading(tmp_path, capsys):
    assert main(["--model_name_or_path", str(tmp_path)]) == 2
    assert "error: set --dataset_path" in capsys.readouterr().err
    missing = tmp_path / "nope.jsonl"
    assert main(["--model_name_or_path", str(tmp_path), "--dataset_path", str(missing)]) == 2
    assert "error:" in capsys.readouterr().err


def test_an_adapter_only_base_is_refused_with_the_merge_command(tmp_path, capsys):
    adapter = tmp_path / "sft"  # a LoRA SFT output: an adapter and no model of its own
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": ""}))
    assert main(["--model_name_or_path", str(adapter), "--dataset_path", str(tmp_path / "pairs.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"model_name_or_path {adapter} holds only a LoRA adapter" in err
    assert f"text2grad merge-rm --adapter {adapter} --output_dir {adapter}-merged" in err


def test_scorer_needs_a_trained_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=CONFIG_FILENAME):
        ScalarRewardScorer(str(tmp_path))
    with pytest.raises(ValueError, match="path"):
        ScalarRewardScorer()


def test_ppo_config_names_the_scalar_reward_model():
    assert load_object(SCALAR_SOURCES["scalar_rm"]) is ScalarRewardScorer
    cfg = PPOConfig(reward_mode="scalar", scalar_source="scalar_rm", critic="none")
    assert cfg.scalar_source == "scalar_rm"
    with pytest.raises(ValueError, match="critic 'none'"):
        PPOConfig(reward_mode="nl_gradient", critic="none")
    with pytest.raises(ValueError, match="scalar_source 'spans' was renamed to quote_count"):
        PPOConfig(scalar_source="spans")  # the earlier name fails, naming the new one


def test_both_reward_models_build_their_trainer_arguments_with_one_builder(tmp_path):
    """The scalar RM's RewardConfig and the generative RM's TrainingArguments share one builder: the same config
    values give the same shared arguments, and each keeps its own (eval batch and fp16 / max_length, centring)."""
    values = dict(output_dir=str(tmp_path), learning_rate=3e-4, per_device_train_batch_size=2, gradient_accumulation_steps=3,
                  max_steps=7, save_steps=5, save_total_limit=1, logging_steps=2, seed=11, progress_bar=False,
                  weight_decay=0.1, max_grad_norm=0.5, num_train_epochs=2.0, report_to="none")
    rm_cfg = RewardModelConfig(**values)
    rm_args, scalar_args = training_arguments(rm_cfg), _reward_config(ScalarRMConfig(**values, center_rewards_coefficient=0.01))
    shared = shared_training_kwargs(TrainingArguments, rm_cfg, warmup_ratio=0.0)
    assert {"learning_rate", "seed", "disable_tqdm", "save_steps", "max_steps"} <= set(shared)
    for key in shared:
        assert getattr(rm_args, key) == getattr(scalar_args, key), key
    assert (rm_args.learning_rate, rm_args.seed, rm_args.max_steps, rm_args.disable_tqdm) == (3e-4, 11, 7, True)
    assert rm_args.remove_unused_columns is False and rm_args.eval_strategy == "no"
    assert scalar_args.max_length is None and scalar_args.center_rewards_coefficient == 0.01
