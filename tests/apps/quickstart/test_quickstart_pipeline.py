"""Stage helpers of the quickstart pipeline (text2grad/apps/quickstart/pipeline.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from peft import LoraConfig, get_peft_model

from text2grad.apps.quickstart import pipeline
from text2grad.apps.quickstart.presets import resolve
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
from text2grad.core.data import iter_jsonl, write_jsonl
from text2grad.core.generation import Generation
from text2grad.core.modeling import is_adapter_only, load_causal_lm


def test_annotations_come_back_in_input_order_whatever_order_the_workers_finished_in(monkeypatch, tmp_path):
    """The annotation CLI appends records as its workers finish; on a busy machine two can swap, and the reward
    model's held-out split (the first tenth) and its training order must not change with that."""
    inputs = [{"id": f"policy-{i}", "prompt": f"post {i}\nTL;DR:", "response": f" summary {i}"} for i in range(6)]
    write_jsonl(tmp_path / "to_annotate.jsonl", inputs)
    finished = [inputs[k] for k in (1, 0, 2, 5, 3, 4)]  # two workers overtook each other

    def annotation_cli(module: str, argv: list[str]) -> None:
        assert module == "annotation.cli"
        output = Path(argv[argv.index("--output") + 1])
        write_jsonl(output, [{**r, "critique": "ok", "good_spans": [], "poor_spans": []} for r in finished])

    monkeypatch.setattr(pipeline, "_call", annotation_cli)
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out")))
    annotations = pipeline._annotate(cfg, tmp_path, tmp_path / "posts.jsonl")
    assert [r["id"] for r in annotations] == [r["id"] for r in inputs]
    assert [r["id"] for r in iter_jsonl(tmp_path / "annotations.jsonl")] == [r["id"] for r in finished]  # file as written


def test_a_lora_sft_policy_is_merged_before_the_reward_model_trains_on_it(monkeypatch, tmp_path, bpe_tokenizer, tiny_llama):
    """A LoRA SFT (--sft_args --use_lora true) leaves an adapter-only folder; the reward model's own adapter must
    name a base that holds the SFT weights, so the pipeline trains it on the merged folder."""
    tiny_llama.save_pretrained(tmp_path / "base")
    bpe_tokenizer.save_pretrained(tmp_path / "base")
    sft = tmp_path / "policy" / "sft"
    get_peft_model(load_causal_lm(str(tmp_path / "base")), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(sft)
    bpe_tokenizer.save_pretrained(sft)
    trained_on = []

    def phases(module: str, argv: list[str]) -> None:
        flag = dict(zip(argv, argv[1:]))
        if module == "annotation.cli":
            rows = list(iter_jsonl(flag["--dataset_path"]))
            write_jsonl(Path(flag["--output"]), [{**r, "critique": "ok", "good_spans": [], "poor_spans": []} for r in rows])
        elif module == "reward_model.train":
            trained_on.append(Path(flag["--model_name_or_path"]))

    monkeypatch.setattr(pipeline, "_call", phases)
    monkeypatch.setattr(pipeline, "generate_responses",
                        lambda path, prompts, *a, **k: [Generation([1], [2], "a summary", True) for _ in prompts])
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                                   n_train=24, n_annotations=16))
    data = pipeline.stage_data(cfg, tmp_path / "out")
    pipeline.stage_reward_model(cfg, data, sft, sft, tmp_path / "out", pipeline.StageClock(pipeline.STAGES))
    assert trained_on == [tmp_path / "policy" / "sft-merged"]
    assert (trained_on[0] / "config.json").is_file() and not is_adapter_only(trained_on[0])
    # a reward-model base of the user's own: the SFT adapter is not its base, so nothing is merged for it
    trained_on.clear()
    given = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out2"), cache_dir=str(tmp_path / "cache2"),
                                     n_train=24, n_annotations=16, rm_base_model=str(tmp_path / "base")))
    sft2 = tmp_path / "policy2" / "sft"
    get_peft_model(load_causal_lm(str(tmp_path / "base")), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(sft2)
    bpe_tokenizer.save_pretrained(sft2)
    pipeline.stage_reward_model(given, pipeline.stage_data(given, tmp_path / "out2"), sft2, sft2, tmp_path / "out2",
                                pipeline.StageClock(pipeline.STAGES))
    assert trained_on == [tmp_path / "base"] and not (tmp_path / "policy2" / "sft-merged").exists()


def _annotate_everything(monkeypatch) -> list[dict]:
    """Fake annotation CLI, reward-model training and sampling for `stage_reward_model`; returns the calls made to
    the annotation CLI ({"rows": what it was asked to annotate, "kwargs": its critic kwargs})."""
    calls: list[dict] = []

    def phases(module: str, argv: list[str]) -> None:
        flag = dict(zip(argv, argv[1:]))
        if module == "annotation.cli":
            rows = list(iter_jsonl(flag["--dataset_path"]))
            calls.append({"rows": rows, "kwargs": json.loads(flag["--critic_kwargs"])})
            write_jsonl(Path(flag["--output"]), [{**r, "critique": "ok", "good_spans": [], "poor_spans": []} for r in rows])

    monkeypatch.setattr(pipeline, "_call", phases)
    monkeypatch.setattr(pipeline, "generate_responses",
                        lambda path, prompts, *a, **k: [Generation([1], [2], f"sample of {p[:12]}", True) for p in prompts])
    return calls


def test_extra_policy_samples_are_annotated_on_the_rl_prompts_on_top_of_the_same_offline_annotations(monkeypatch, tmp_path,
                                                                                                      bpe_tokenizer, tiny_llama):
    """The reward-model refresh's equal-annotation control: as many more SFT-policy samples as asked, on the RL prompts
    in turn, checked against the RL posts' facts, and every annotation of the run without them still there."""
    tiny_llama.save_pretrained(tmp_path / "sft")
    bpe_tokenizer.save_pretrained(tmp_path / "sft")
    calls = _annotate_everything(monkeypatch)
    runs, data, trained_on = {}, {}, {}
    for extra in (0, 30):
        cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / f"out{extra}"), cache_dir=str(tmp_path / "cache"),
                                       n_train=200, n_rl=20, n_annotations=100, rm_extra_policy_samples=extra))
        data[extra] = pipeline.stage_data(cfg, tmp_path / f"out{extra}")
        model, _ = pipeline.stage_reward_model(cfg, data[extra], tmp_path / "sft", tmp_path / "sft", tmp_path / f"out{extra}",
                                               pipeline.StageClock(pipeline.STAGES))
        runs[extra], trained_on[extra] = calls[-1], list(iter_jsonl(model.parent / "rm_train.jsonl"))
    base, more = runs[0], runs[30]
    assert len(calls) == 2  # the run with extra samples is not the cached run without them
    assert len(base["rows"]) == 100 and len(more["rows"]) == 130
    assert len(trained_on[30]) == len(trained_on[0]) + 30  # every extra sample adds to training, none to the held-out
    assert {r["id"] for r in base["rows"]} < {r["id"] for r in more["rows"]}
    added = [r for r in more["rows"] if r["id"] not in {b["id"] for b in base["rows"]}]
    rl = list(iter_jsonl(data[30]["rl"]))
    assert len(rl) < 30  # so the RL prompts are taken again from the first
    assert sorted(r["prompt"] for r in added) == sorted(rl[i % len(rl)]["prompt"] for i in range(30))
    assert all(r["response"].startswith("sample of ") for r in added)  # the SFT policy's, not noisy summaries
    assert base["kwargs"] == {"data_path": str(data[0]["train"])}
    assert more["kwargs"] == {"data_path": [str(data[30]["train"]), str(data[30]["rl"])]}


def test_extra_policy_samples_in_place_of_noisy_summaries_keep_the_annotation_count(monkeypatch, tmp_path, bpe_tokenizer,
                                                                                     tiny_llama):
    """The control's samples by their kind alone: the same RL-prompt samples, but as many noisy summaries fewer, so the
    reward model trains and is evaluated on as many annotations as the run without them; and its prompts alone: noisy
    summaries of the same RL posts in their place."""
    tiny_llama.save_pretrained(tmp_path / "sft")
    bpe_tokenizer.save_pretrained(tmp_path / "sft")
    calls = _annotate_everything(monkeypatch)
    rows, sizes = {}, {}
    for name, fields in (("base", {}), ("added", {"rm_extra_policy_samples": 30}),
                         ("swapped", {"rm_extra_policy_samples": 30, "rm_extra_replace_noisy": True}),
                         ("prompts", {"rm_extra_noisy_summaries": 30, "rm_extra_replace_noisy": True})):
        cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / name), cache_dir=str(tmp_path / "cache"),
                                       n_train=200, n_rl=20, n_annotations=100, **fields))
        model, _ = pipeline.stage_reward_model(cfg, pipeline.stage_data(cfg, tmp_path / name), tmp_path / "sft",
                                               tmp_path / "sft", tmp_path / name, pipeline.StageClock(pipeline.STAGES))
        rows[name] = {r["id"]: r for r in calls[-1]["rows"]}
        sizes[name] = tuple(sum(1 for _ in iter_jsonl(model.parent / f)) for f in ("rm_train.jsonl", "rm_eval.jsonl"))
    assert len(calls) == 4  # each its own reward model
    kinds = {name: Counter(i.split("-")[0] + ("-rl" if "-rl" in i else "") for i in ids) for name, ids in rows.items()}
    assert kinds["base"] == {"policy": 50, "noisy": 50}
    assert kinds["swapped"] == {"policy": 50, "policy-rl": 30, "noisy": 20}
    assert kinds["prompts"] == {"policy": 50, "noisy-rl": 30, "noisy": 20}
    assert sizes["swapped"] == sizes["prompts"] == sizes["base"] and sizes["added"][0] == sizes["base"][0] + 30
    prompts_of = {name: sorted(r["prompt"] for i, r in rows[name].items() if "-rl" in i) for name in ("swapped", "prompts")}
    assert prompts_of["swapped"] == prompts_of["prompts"]  # the same RL posts, noisy summaries in place of samples
    assert not any(r["response"].startswith("sample of ") for i, r in rows["prompts"].items() if "-rl" in i)
    assert [[Path(f).name for f in c["kwargs"]["data_path"]] for c in calls[1:]] == [["train.jsonl", "rl.jsonl"]] * 3
    assert set(rows["swapped"]) - set(rows["base"]) == set(rows["added"]) - set(rows["base"])  # the same extra samples
    assert set(rows["swapped"]) < set(rows["added"])  # and the first 20 noisy summaries, unchanged


def test_more_extra_samples_than_noisy_summaries_to_replace_is_refused_before_sampling(monkeypatch, tmp_path,
                                                                                         bpe_tokenizer, tiny_llama):
    tiny_llama.save_pretrained(tmp_path / "sft")
    bpe_tokenizer.save_pretrained(tmp_path / "sft")
    calls = _annotate_everything(monkeypatch)
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                                   n_train=200, n_rl=20, n_annotations=100, rm_extra_policy_samples=51,
                                   rm_extra_replace_noisy=True))
    with pytest.raises(ValueError, match="51 extra RL-prompt annotations cannot take the place of 50 noisy summaries of "
                                         "training posts; ask for at most 50"):
        pipeline.stage_reward_model(cfg, pipeline.stage_data(cfg, tmp_path / "out"), tmp_path / "sft", tmp_path / "sft",
                                    tmp_path / "out", pipeline.StageClock(pipeline.STAGES))
    assert calls == []


def test_more_annotations_than_training_posts_says_how_many_are_annotated(monkeypatch, tmp_path, capsys, bpe_tokenizer,
                                                                          tiny_llama):
    """One response per training post: asking for more than the split holds annotates the split, and says so."""
    tiny_llama.save_pretrained(tmp_path / "sft")
    bpe_tokenizer.save_pretrained(tmp_path / "sft")
    calls = _annotate_everything(monkeypatch)
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                                   n_train=24, n_annotations=30))
    pipeline.stage_reward_model(cfg, pipeline.stage_data(cfg, tmp_path / "out"), tmp_path / "sft", tmp_path / "sft",
                                tmp_path / "out", pipeline.StageClock(pipeline.STAGES))
    rows = calls[-1]["rows"]
    assert len(rows) == 24
    assert sum(r["id"].startswith("policy-") for r in rows) == 15 and sum(r["id"].startswith("noisy-") for r in rows) == 9
    assert ("annotating 15 SFT-policy samples and 9 noisy summaries: n_annotations 30 is capped at the 24 training "
            "posts, one response each") in capsys.readouterr().out


def test_a_negative_number_of_extra_policy_samples_is_refused():
    with pytest.raises(ValueError, match="rm_extra_policy_samples must be >= 0"):
        resolve(QuickstartConfig(preset="ci", rm_extra_policy_samples=-1))


def test_replacing_noisy_summaries_without_extra_samples_is_refused():
    with pytest.raises(ValueError, match="rm_extra_replace_noisy needs rm_extra_policy_samples or "
                                         "rm_extra_noisy_summaries > 0"):
        resolve(QuickstartConfig(preset="ci", rm_extra_replace_noisy=True))
    with pytest.raises(ValueError, match="rm_extra_noisy_summaries must be >= 0"):
        resolve(QuickstartConfig(preset="ci", rm_extra_noisy_summaries=-1))
