"""Training: the loss goes down, checkpoints carry adapter + tokenizer + config, resume is exact, merge is exact."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tests.reward_model.rm_testlib import INSTRUCTION, RECORDS, train_args, write_records
from transformers import Trainer

import reward_model.train as rm_train
from reward_model.inference import GenerativeRewardModel
from reward_model.merge import main as merge_main
from reward_model.serialization import collate, encode_example, record_feedback
from reward_model.train import (
    CONFIG_FILENAME,
    _strip_launcher_args,
    _length_grouping_kwargs,
    _warmup_kwargs,
    build_dataset,
    main,
    training_arguments,
)
from reward_model.train_config import RewardModelConfig
from text2grad.core.config import ConfigError, load_config
from text2grad.core.data import DataError
from text2grad.core.modeling import load_causal_lm, load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def mean_loss(model, tokenizer, records=RECORDS) -> float:
    """Masked cross-entropy over the target tokens of ``records``, as one batch."""
    encoded = [
        encode_example(tokenizer, r["prompt"], r["response"], record_feedback(r), max_length=128, instruction=INSTRUCTION)
        for r in records
    ]
    batch = collate([e.as_dict() for e in encoded], tokenizer.pad_token_id)
    with torch.no_grad():
        return float(model(**batch).loss)


@pytest.fixture(scope="module")
def lora_run(rm_world):
    torch.set_num_threads(1)
    out = rm_world / "lora"
    # the training file doubles as the eval file: the eval loss path runs, and must come out low
    assert main(train_args(rm_world, out, max_steps=10, learning_rate=1e-2, eval_dataset_path=rm_world / "train.jsonl",
                           eval_steps=5)) == 0
    return out


def test_few_lora_steps_lower_the_loss_and_save_everything(rm_world, lora_run):
    tokenizer = load_tokenizer(str(rm_world / "base"))
    before = mean_loss(load_causal_lm(str(rm_world / "base")), tokenizer)
    trained = load_causal_lm(str(lora_run))  # adapter dir: base model found through adapter_config.json
    after = mean_loss(trained, tokenizer)
    assert after < before - 0.5, (before, after)
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", CONFIG_FILENAME):
        assert (lora_run / name).is_file(), name
    assert not (lora_run / "model.safetensors").exists()  # LoRA saves the adapter, not the base weights
    adapter_cfg = json.loads((lora_run / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 8 and adapter_cfg["lora_alpha"] == 16
    assert set(adapter_cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    saved = load_config(RewardModelConfig, lora_run / CONFIG_FILENAME)
    assert saved.instruction == INSTRUCTION and saved.max_steps == 10 and saved.lora_r == 8
    assert load_tokenizer(str(lora_run)).get_vocab() == tokenizer.get_vocab()
    results = json.loads((lora_run / "train_results.json").read_text())
    # eval batches hold one example each, so the eval loss is the mean of the per-example losses
    per_example = sum(mean_loss(trained, tokenizer, [r]) for r in RECORDS) / len(RECORDS)
    assert results["eval_loss"] == pytest.approx(per_example, rel=1e-4)
    assert results["train_examples"] == 4 and results["dropped_too_long"] == 0
    evals = [h for h in json.loads((lora_run / "trainer_state.json").read_text())["log_history"] if "eval_loss" in h]
    assert [h["step"] for h in evals] == [5, 10]


def test_resume_continues_exactly(rm_world):
    common = dict(lr_scheduler_type="constant", save_steps=2, learning_rate=1e-3)
    straight, resumed = rm_world / "straight", rm_world / "resumed"
    assert main(train_args(rm_world, straight, max_steps=6, **common)) == 0
    assert main(train_args(rm_world, resumed, max_steps=4, **common)) == 0
    for ckpt in ("checkpoint-2", "checkpoint-4"):  # every checkpoint can be served or resumed on its own
        for name in ("adapter_model.safetensors", "tokenizer.json", CONFIG_FILENAME, "optimizer.pt"):
            assert (resumed / ckpt / name).is_file(), (ckpt, name)
    assert main(train_args(rm_world, resumed, max_steps=6, resume="auto", **common)) == 0
    state = json.loads((resumed / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    losses = {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]

    a = load_file(str(straight / "adapter_model.safetensors"))
    b = load_file(str(resumed / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)


def test_resume_from_a_directory_that_is_no_checkpoint_is_an_error(rm_world, tmp_path, capsys):
    (tmp_path / "not_a_checkpoint").mkdir()
    assert main(train_args(rm_world, tmp_path / "out", max_steps=1, resume=tmp_path / "not_a_checkpoint")) == 2
    err = capsys.readouterr().err
    assert "error: --resume" in err and "not a checkpoint of this trainer" in err
    assert not (tmp_path / "out").exists()


def test_merge_matches_the_adapter(rm_world, lora_run, tmp_path):
    merged = tmp_path / "merged"
    assert merge_main(["--adapter", str(lora_run), "--output_dir", str(merged)]) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", CONFIG_FILENAME):
        assert (merged / name).is_file(), name
    ids = torch.tensor([[5, 17, 42, 99, 7]])

    @torch.no_grad()
    def logits(model) -> torch.Tensor:  # on the model's device (the reward model is placed on this process's GPU)
        return model(ids.to(model.device)).logits.float().cpu()

    expected = logits(load_causal_lm(str(lora_run), merge_adapter=False))
    got = logits(load_causal_lm(str(merged)))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    base_logits = logits(load_causal_lm(str(rm_world / "base")))
    assert (base_logits - expected).abs().max() > 1e-3  # the adapter changed something, so the check means something
    a = GenerativeRewardModel.from_pretrained(str(lora_run), max_new_tokens=12)
    b = GenerativeRewardModel.from_pretrained(str(merged), max_new_tokens=12)
    assert b.instruction == INSTRUCTION == a.instruction  # the training config travelled with the merge
    prompts, responses = [r["prompt"] for r in RECORDS], [r["response"] for r in RECORDS]
    assert [f.raw for f in a.feedback(prompts, responses)] == [f.raw for f in b.feedback(prompts, responses)]
    # The base model named explicitly with the adapter beside it (from_pretrained(base, adapter=...)).
    c = GenerativeRewardModel.from_pretrained(str(rm_world / "base"), adapter=str(lora_run), max_new_tokens=12)
    assert c.instruction == INSTRUCTION
    torch.testing.assert_close(logits(c.model), expected, atol=1e-4, rtol=1e-4)
    assert [f.raw for f in c.feedback(prompts, responses)] == [f.raw for f in a.feedback(prompts, responses)]


def test_merge_rejects_a_non_adapter(rm_world, tmp_path, capsys):
    assert merge_main(["--adapter", str(rm_world / "base"), "--output_dir", str(tmp_path / "m")]) == 2
    assert "not a LoRA adapter" in capsys.readouterr().err


def test_field_map_reads_native_field_names(rm_world, rm_tokenizer, tmp_path):
    native = [
        {"id": r["id"], "post": r["prompt"], "summary": r["response"], "textual_feedback": r["critique"],
         "good_spans": r["good_spans"], "poor_spans": r["poor_spans"]}
        for r in RECORDS
    ]
    path = write_records(tmp_path / "native.jsonl", native)
    cfg = RewardModelConfig(
        dataset_path=str(path),
        field_map={"prompt": "post", "response": "summary", "critique": "textual_feedback"},
        instruction=INSTRUCTION,
        max_length=128,
    )
    dataset, dropped = build_dataset(cfg, rm_tokenizer, str(path), "train")
    assert len(dataset) == 4 and dropped == 0
    expected = encode_example(
        rm_tokenizer, RECORDS[1]["prompt"], RECORDS[1]["response"], record_feedback(RECORDS[1]),
        max_length=128, instruction=INSTRUCTION,
    )
    assert dataset[1] == expected.as_dict()
    with pytest.raises(DataError, match="lacks field"):
        build_dataset(RewardModelConfig(dataset_path=str(path), instruction=INSTRUCTION), rm_tokenizer, str(path), "train")
    short = RewardModelConfig(dataset_path=str(path), field_map=cfg.field_map, instruction=INSTRUCTION, max_length=20)
    with pytest.raises(DataError, match="raise --max_length"):
        build_dataset(short, rm_tokenizer, str(path), "train")


def test_cli_errors_are_clear(rm_world, tmp_path, capsys):
    assert main(["--model_name_or_path", str(rm_world / "base"), "--output_dir", str(tmp_path)]) == 2
    assert "dataset_path is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--no_such_flag", "1"])
    with pytest.raises(SystemExit):
        main(["--deepspeed", str(tmp_path / "missing.json")])
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="at most one of bf16 and fp16"):
        RewardModelConfig(bf16=True, fp16=True)
    with pytest.raises(ConfigError, match="warmup_ratio"):
        RewardModelConfig(warmup_ratio=1.5)


def test_warmup_ratio_becomes_the_scheduler_warmup(tmp_path):
    cfg = RewardModelConfig(output_dir=str(tmp_path), warmup_ratio=0.25, learning_rate=1e-2, lr_scheduler_type="linear")
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=training_arguments(cfg))
    trainer.create_optimizer_and_scheduler(num_training_steps=20)
    lrs = []
    for _ in range(8):
        lrs.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    # 25% of 20 steps = 5 warmup steps: 0, 1/5, ..., 4/5 of the peak, the peak at step 5, then linear decay.
    assert lrs[:6] == pytest.approx([1e-2 * i / 5 for i in range(6)])
    assert lrs[6] == pytest.approx(1e-2 * 14 / 15) and lrs[7] < lrs[6]


def test_warmup_ratio_goes_where_the_transformers_version_reads_it():
    @dataclasses.dataclass
    class Args4x:  # transformers 4.x: warmup_steps is a step count, the ratio has its own field
        warmup_steps: int = 0
        warmup_ratio: float = dataclasses.field(default=0.0, metadata={"help": "Linear warmup over warmup_ratio."})

    @dataclasses.dataclass
    class ArgsDeprecated:
        warmup_steps: float = 0
        warmup_ratio: float = dataclasses.field(default=0.0, metadata={"help": "Deprecated, use warmup_steps."})

    @dataclasses.dataclass
    class Args5:  # transformers 5: a float warmup_steps below 1 is a ratio
        warmup_steps: float = 0

    assert _warmup_kwargs(Args4x, 0.05) == {"warmup_ratio": 0.05}
    assert _warmup_kwargs(ArgsDeprecated, 0.05) == {"warmup_steps": 0.05}
    assert _warmup_kwargs(Args5, 0.05) == {"warmup_steps": 0.05}


def test_length_grouped_batches_hold_examples_of_similar_length(tmp_path):
    lengths = [5 + (i * 37) % 90 for i in range(64)]  # 5..94 tokens, shuffled
    examples = [{"input_ids": [1] * n, "labels": [1] * n} for n in lengths]
    padded = {}
    for grouped in (True, False):
        cfg = RewardModelConfig(output_dir=str(tmp_path / str(grouped)), per_device_train_batch_size=4,
                                group_by_length=grouped, seed=0)
        trainer = Trainer(model=torch.nn.Linear(2, 2), args=training_arguments(cfg), train_dataset=examples,
                          data_collator=lambda batch: collate(batch, 0))
        batches = [b["input_ids"] for b in trainer.get_train_dataloader()]
        assert sorted(int(n) for b in batches for n in (b != 0).sum(1)) == sorted(lengths)  # every example once
        padded[grouped] = sum(b.numel() for b in batches)
    # grouped: each batch of 4 is padded to a neighbour's length; shuffled: to the longest of 4 random ones
    assert padded[True] < 0.8 * padded[False], padded


def test_length_grouping_goes_where_the_transformers_version_reads_it():
    @dataclasses.dataclass
    class Args4x:
        group_by_length: bool = False

    @dataclasses.dataclass
    class Args5:
        train_sampling_strategy: str = "random"

    assert _length_grouping_kwargs(Args4x, True) == {"group_by_length": True}
    assert _length_grouping_kwargs(Args5, True) == {"train_sampling_strategy": "group_by_length"}
    assert _length_grouping_kwargs(Args5, False) == {"train_sampling_strategy": "random"}


def test_launcher_rank_flag_is_ignored():
    assert _strip_launcher_args(["--local_rank=1", "--a", "1", "--local-rank", "0", "--b", "2"]) == ["--a", "1", "--b", "2"]


@pytest.mark.parametrize("dataset", ["slf5k", "kodcode", "ultrafeedback", "quickstart"])
def test_shipped_configs_load(dataset, monkeypatch):
    monkeypatch.chdir(REPO)  # deepspeed paths in the YAML are relative to the repository root
    path = REPO / "configs" / dataset / "reward_model.yaml"
    cfg = load_config(RewardModelConfig, path)
    assert cfg.dataset_path and cfg.output_dir
    raw = yaml.safe_load(path.read_text())
    assert set(raw) <= set(RewardModelConfig.__dataclass_fields__)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--learning_rate=-1e-5"], "learning_rate must be > 0, got -1e-05"),
        (["--learning_rate", "0"], "learning_rate must be > 0, got 0"),
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be > 0, got 0"),
        (["--per_device_train_batch_size", "-2"], "per_device_train_batch_size must be > 0, got -2"),
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps must be > 0"),
        (["--max_steps", "0"], "max_steps must be > 0, or -1"),
        (["--lora_dropout", "1.5"], "lora_dropout must be in [0, 1]"),
    ],
)
def test_bad_numbers_stop_before_anything_is_written(rm_world, tmp_path, capsys, flags, message):
    rc, err = _exit_and_err(capsys, train_args(rm_world, tmp_path / "out") + flags)
    assert rc == 2 and "error: " in err and message in err
    assert not (tmp_path / "out").exists()


def _exit_and_err(capsys, argv):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


def test_output_paths_and_missing_models_are_reported_before_any_model_loads(rm_world, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rm_train, "_build_model", lambda cfg: (_ for _ in ()).throw(AssertionError("model loaded")))
    (tmp_path / "a_file").write_text("keep me")
    rc, err = _exit_and_err(capsys, train_args(rm_world, tmp_path / "a_file"))
    assert rc == 2 and "error: output_dir" in err and "is a file" in err and (tmp_path / "a_file").read_text() == "keep me"
    rc, err = _exit_and_err(capsys, train_args(rm_world, tmp_path / "out", model_name_or_path=tmp_path / "no_model"))
    assert rc == 2 and f"error: model path '{tmp_path / 'no_model'}' does not exist" in err
    assert not (tmp_path / "out").exists()


def test_a_second_run_into_the_same_directory_is_refused_unless_overwrite(rm_world, tmp_path, capsys):
    out = tmp_path / "rm"
    assert main(train_args(rm_world, out, max_steps=2, save_steps=1, save_total_limit=5)) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2] and all("learning_rate" in m for m in metrics if "loss" in m)
    adapter = (out / "adapter_model.safetensors").read_bytes()
    rc, err = _exit_and_err(capsys, train_args(rm_world, out, max_steps=1))
    assert rc == 2 and "already holds a run" in err and "--overwrite_output_dir true" in err
    assert (out / "adapter_model.safetensors").read_bytes() == adapter  # untouched
    assert main(train_args(rm_world, out, max_steps=1, save_steps=1, overwrite_output_dir=True, seed=1)) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]  # the earlier run's are gone
    again = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in again if "loss" in m] == [1]


def test_resume_with_a_changed_config_is_refused_unless_accepted(rm_world, tmp_path, capsys):
    out = tmp_path / "rm"
    common = dict(save_steps=1, lr_scheduler_type="constant")
    assert main(train_args(rm_world, out, max_steps=1, **common)) == 0
    rc, err = _exit_and_err(capsys, train_args(rm_world, out, max_steps=2, resume="auto", learning_rate=1e-4, **common))
    assert rc == 2 and "learning_rate: 0.003 -> 0.0001" in err and "--accept_config_changes true" in err
    assert main(train_args(rm_world, out, max_steps=2, resume="auto", learning_rate=1e-4, accept_config_changes=True,
                           **common)) == 0
    (change,) = [json.loads(line) for line in (out / "config_changes.jsonl").read_text().splitlines()]
    assert change["step"] == 1 and change["changes"] == {"learning_rate": [0.003, 0.0001]}
    steps = [m["step"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    assert steps == [1, 2]  # one line per step over both parts of the run


def test_a_lora_reward_model_on_an_adapter_only_base_is_refused_with_the_merge_command(rm_world, lora_run, tmp_path,
                                                                                       capsys, monkeypatch):
    # a LoRA adapter on top of another adapter would be saved against the bare base and reload without the first one
    monkeypatch.setattr(rm_train, "_build_model", lambda cfg: (_ for _ in ()).throw(AssertionError("model loaded")))
    rc, err = _exit_and_err(capsys, train_args(rm_world, tmp_path / "out", model_name_or_path=lora_run))
    assert rc == 2 and f"model_name_or_path {lora_run} holds only a LoRA adapter" in err
    assert f"text2grad merge-rm --adapter {lora_run} --output_dir {lora_run}-merged" in err and "--use_lora false" in err


def test_full_fine_tuning_from_an_adapter_only_folder_starts_from_the_adapted_weights(rm_world, lora_run, tmp_path):
    out = tmp_path / "full"
    # a negligible learning rate: the saved weights are the ones training started from
    assert main(train_args(rm_world, out, model_name_or_path=lora_run, use_lora="false", max_steps=1,
                           learning_rate=1e-12)) == 0
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    ids = torch.tensor([[5, 9, 13, 21, 34]])
    with torch.no_grad():
        expected = load_causal_lm(str(lora_run)).eval()(ids).logits  # base + adapter
        bare = load_causal_lm(str(rm_world / "base")).eval()(ids).logits
        got = load_causal_lm(str(out)).eval()(ids).logits
    assert not torch.allclose(expected, bare, atol=1e-4)  # the adapter changes the model: the check can fail
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
