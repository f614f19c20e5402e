"""The paper's no-CoT and dense annotation variants: prompts, record formats and reward-model targets."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.annotation.annotation_test_utils import read_jsonl, write_jsonl
from tests.fake_openai import FakeOpenAIServer
from reward_model.serialization import NOCOT_INSTRUCTION, encode_example, parse_target, target_text
from reward_model.train_config import RewardModelConfig
from text2grad.core.feedback import Feedback
from text2grad.core.rewards import compute_score_rewards

PROMPTS = Path(__file__).resolve().parents[2] / "annotation" / "prompts"


def test_nocot_target_has_no_critique():
    fb = Feedback(critique="The city is wrong: it is Berlin.", good_spans=("for a job",), poor_spans=("Oslo",))
    cot, nocot = target_text(fb), target_text(fb, "nocot")
    assert cot.startswith("The city is wrong") and cot.endswith(nocot)
    assert nocot == json.dumps({"good_spans": ["for a job"], "poor_spans": ["Oslo"]})
    assert "city" not in nocot and "\n" not in nocot
    parsed = parse_target(nocot)
    assert parsed.ok and parsed.feedback.critique == "" and parsed.feedback.poor_spans == ("Oslo",)


def test_nocot_training_example_teaches_no_critique(bpe_tokenizer):
    fb = Feedback(critique="The city is wrong.", good_spans=(), poor_spans=("Oslo",))
    enc = encode_example(bpe_tokenizer, "Summarize: Alex moved to Berlin.", "Alex moved to Oslo.", fb, max_length=4096,
                         instruction=NOCOT_INSTRUCTION, target_format="nocot")
    target = bpe_tokenizer.decode([t for t in enc.labels if t != -100], skip_special_tokens=True)
    assert target.strip() == target_text(fb, "nocot") and "city" not in target


def test_reward_model_config_switches_to_the_nocot_instruction():
    cfg = RewardModelConfig(target_format="nocot")
    assert cfg.instruction == NOCOT_INSTRUCTION and "critique" not in cfg.instruction.lower()
    assert RewardModelConfig(target_format="nocot", instruction="mine").instruction == "mine"


def test_nocot_prompts_ask_for_spans_without_a_critique():
    for name in ("slf5k", "ultrafeedback", "kodcode"):
        user = yaml.safe_load((PROMPTS / f"{name}_nocot.yaml").read_text())["user"]
        answer = user.rsplit("Answer with", 1)[1]
        assert "critique" not in answer.split("\n", 2)[-1], name  # the JSON skeleton has no critique key
        assert '"good_spans"' in answer.replace("{{", "{") and "no reasoning, explanation or critique" in answer


def test_dense_annotation_labels_the_whole_response(tmp_path, run_cli, bpe_tokenizer):
    """The dense prompt through the real client: its span_scores record becomes good/poor spans over ~all tokens."""
    post = "Alex moved to Berlin for a job and loves the food there."
    summary = "Alex moved to Berlin for a holiday and loves the food."
    write_jsonl(tmp_path / "in.jsonl", [{"id": "s1", "prompt": post, "response": summary}])
    parts = [("Alex moved to Berlin", "good"), ("for a holiday", "poor"), ("and", "neutral"), ("loves the food.", "good")]
    answer = json.dumps({"span_scores": [{"text": t, "label": lab} for t, lab in parts]})
    with FakeOpenAIServer(lambda body, n: answer) as server:
        rc, report = run_cli(server, tmp_path, "--dataset", "slf5k",
                             "--prompt_template", str(PROMPTS / "slf5k_dense.yaml"))
    assert rc == 0 and report["done"] == 1
    user = server.requests[0]["messages"][-1]["content"]
    assert "Label every part" in user and summary in user and post in user
    (got,) = read_jsonl(tmp_path / "out.jsonl")
    assert got["good_spans"] == ["Alex moved to Berlin", "loves the food."] and got["poor_spans"] == ["for a holiday"]
    ids = bpe_tokenizer.encode(summary, add_special_tokens=False)
    out = compute_score_rewards([Feedback.from_dict(got)], [ids], bpe_tokenizer, mode="dense")
    assert out.stats()["tokens/labelled_share"] > 0.8  # everything but " and" and blanks
