"""Stage helpers of the quickstart pipeline (text2grad/apps/quickstart/pipeline.py)."""

from __future__ import annotations

from pathlib import Path

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
