"""Every phase once on a real pretrained model: SmolLM2-135M-Instruct (offline, `text2grad.core.assets`) with its
chat template. Annotation with a programmatic critic, a LoRA reward model trained a few steps that writes span
JSON the parser reads as written (grounded quotes), and one PPO iteration with LoRA through the real trainer and
the shared-backbone value head.

Kept to a couple of minutes on 2 CPU cores: a handful of prompts, short responses, a few optimizer steps.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

import annotation.cli
import policy_optimization.train
import policy_optimization.trainer as trainer_module
import reward_model.train
from reward_model.inference import GenerativeRewardModel
from text2grad.apps.quickstart.task import TaskConfig, generate_task, noisy_summary
from text2grad.core.assets import smollm2_path
from text2grad.core.data import write_jsonl
from text2grad.core.generation import apply_chat_template

# Measured on the 2-core machine, shared (load average 3.1-3.8), under nice -n 19 with OMP_WAIT_POLICY=PASSIVE (as
# env.sh sets it): 75 s in pytest, 95 s for the whole process (the 12 reward-model steps: 41 s). Without that setting,
# beside other busy processes, the same test took 17.5-19 min (OpenMP threads spinning): the timeout is for that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CRITIC = "text2grad.apps.quickstart.task:FactCritic"
RM_INSTRUCTION = "Quote the right and wrong facts of the summary as JSON."


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_path()
    return path, AutoTokenizer.from_pretrained(str(path))


def test_every_phase_on_smollm2(smollm2, tmp_path, monkeypatch):
    model_path, tokenizer = smollm2
    splits = generate_task(TaskConfig(seed=3, n_train=8, n_rl=2, n_eval=1))
    data = tmp_path / "data"
    for name, records in splits.items():
        write_jsonl(data / f"{name}.jsonl", records)

    # Phase 1: annotation by the programmatic FactCritic (exact quotes of right and wrong facts)
    rng, noisy = random.Random(0), TaskConfig(p_omit=0.2, p_wrong=0.4)
    to_annotate = [
        {"id": f"{r['id']}-{k}", "prompt": r["prompt"], "response": noisy_summary(rng, r["facts"], noisy)}
        for r in splits["train"] for k in range(2)
    ]
    write_jsonl(tmp_path / "to_annotate.jsonl", to_annotate)
    assert annotation.cli.main([
        "--dataset_path", str(tmp_path / "to_annotate.jsonl"), "--output", str(tmp_path / "annotations.jsonl"),
        "--critic", CRITIC, "--critic_kwargs", json.dumps({"data_path": str(data / "train.jsonl")}),
        "--field_map", json.dumps({"prompt": "prompt", "response": "response"}),
    ]) == 0
    annotated = _read_jsonl(tmp_path / "annotations.jsonl")
    assert len(annotated) == len(to_annotate) and sum(bool(r["poor_spans"]) for r in annotated) > 0

    # Phase 2: a LoRA reward model on SmolLM2, its chat template as the prompt format. The target is the span JSON
    # alone (target_format nocot, the paper's no-CoT ablation) with a one-line instruction: the shortest examples
    # that still teach the whole output format. 12 steps of 2 at a high LoRA learning rate are enough for the model
    # to write complete span JSON itself (measured: 3 steps wrote unterminated lists, 8 steps still left a
    # truncated one, 12 steps of 1 example repeated quotes until max_new_tokens); a critique before the JSON (cot)
    # took ~2.5x the CPU time for the same steps in our runs, so the CoT target is left to the quickstart's tests.
    rm_dir = tmp_path / "rm"
    assert reward_model.train.main([
        "--model_name_or_path", str(model_path), "--dataset_path", str(tmp_path / "annotations.jsonl"),
        "--output_dir", str(rm_dir), "--use_lora", "true", "--lora_r", "8", "--lora_alpha", "16",
        "--prompt_format", "chat", "--target_format", "nocot", "--instruction", RM_INSTRUCTION,
        "--max_length", "256", "--max_steps", "12", "--learning_rate", "3e-3",
        "--per_device_train_batch_size", "2", "--logging_steps", "1", "--save_steps", "1000000", "--seed", "0",
        "--dtype", "fp32", "--progress_bar", "false",
    ]) == 0
    assert (rm_dir / "adapter_model.safetensors").is_file()
    rm = GenerativeRewardModel.from_pretrained(str(rm_dir), max_new_tokens=48, batch_size=2, grounded_spans=True)
    probe = splits["rl"][:2]  # posts the reward model never saw, with the task's SFT-style summaries
    feedbacks = rm.feedback([r["prompt"] for r in probe], [r["completion"] for r in probe])
    # Every output parsed as written: no malformed, truncated or repaired JSON (the parser closes a truncated
    # list and would count it as parsed; the stats say it was not needed).
    assert rm.stats.malformed == 0 and rm.stats.truncated == 0 and rm.stats.repaired == 0, rm.stats.as_dict()
    for fb, rec in zip(feedbacks, probe):
        assert fb.ok and fb.error is None, fb.raw
        # the model wrote exactly one span-JSON object and nothing else, and the parser read it back unchanged
        assert json.loads(fb.raw) == {"good_spans": list(fb.good_spans), "poor_spans": list(fb.poor_spans)}
        assert fb.good_spans or fb.poor_spans  # it judged something
        # grounded decoding: whatever the model quotes is an exact substring of the response under review
        assert all(q.strip() and q in rec["completion"] for q in (*fb.good_spans, *fb.poor_spans))
    del rm

    # Phase 3: one PPO iteration, LoRA policy, chat-templated prompts, the reward model as critic
    sampled: list = []
    real_generate = trainer_module.generate

    def recording_generate(*args, **kwargs):
        generations = real_generate(*args, **kwargs)
        sampled.extend(generations)
        return generations

    monkeypatch.setattr(trainer_module, "generate", recording_generate)
    ppo_dir = tmp_path / "ppo"
    assert policy_optimization.train.main([
        "--model_name_or_path", str(model_path), "--dataset_path", str(data / "rl.jsonl"),
        "--prompt_template", "{prompt}", "--use_chat_template", "true", "--use_lora", "true", "--lora_r", "8",
        "--lora_alpha", "16", "--critic", "reward_model",
        "--critic_kwargs", json.dumps({"path": str(rm_dir), "max_new_tokens": 32, "batch_size": 2, "grounded_spans": True}),
        "--output_dir", str(ppo_dir), "--num_iterations", "1", "--batch_size", "2", "--num_mini_batches", "1",
        "--num_ppo_epochs", "1", "--response_length", "6", "--learning_rate", "1e-3", "--temperature", "1.0",
        "--dtype", "fp32", "--save_steps", "0", "--log_samples", "2", "--progress_bar", "false",
        "--max_feedback_error_rate", "1.0", "--seed", "0",
        # 6-token responses are cut mid-sentence, unlike anything the reward model was trained on, so its critique
        # of them may be empty or fail to parse (such samples score zero, counted); the penalty on responses cut at
        # response_length (set in every per-dataset config) keeps the rewards non-zero either way
        "--missing_eos_penalty", "1.0",
    ]) == 0

    metrics = _read_jsonl(ppo_dir / "metrics.jsonl")
    assert len(metrics) == 1
    for key in ("loss/policy", "loss/value", "objective/kl", "reward/score_mean", "policy/entropy"):
        assert math.isfinite(metrics[0][key]), key

    # The adapter moved away from its initialisation (LoRA B starts at zero).
    adapter = load_file(str(ppo_dir / "policy" / "adapter_model.safetensors"))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and any(float(t.abs().sum()) > 0 for t in lora_b)
    assert (ppo_dir / "value_model" / "value_head.safetensors").is_file()  # shared backbone: only a head

    # Exact ids: each prompt is the chat template rendered once (SmolLM2's ChatML writes no BOS; the system
    # turn's <|im_start|> opens it once), and the logged responses are the decoded sampled ids.
    assert len(sampled) == 2
    rendered = {tuple(tokenizer(apply_chat_template(tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"]): r
                for r in splits["rl"]}
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    for g in sampled:
        assert tuple(g.prompt_ids) in rendered
        assert g.prompt_ids[0] == im_start and g.prompt_ids.count(im_start) == 3  # system, user, assistant
        header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        assert g.prompt_ids[-len(header):] == header  # generation starts right after the assistant header
        assert 1 <= len(g.response_ids) <= 6
        assert g.text == tokenizer.decode(g.response_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    logged = _read_jsonl(ppo_dir / "samples.jsonl")
    assert {s["response"] for s in logged} == {g.text for g in sampled}
    for s in logged:  # the reward model served as PPO's critic with grounded decoding: its quotes are in the response
        assert all(q in s["response"] for q in (*s["feedback"]["good_spans"], *s["feedback"]["poor_spans"]))
