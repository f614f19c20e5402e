"""CoT vs no-CoT critics compared with the paper's protocol: LLM-judge pairwise win rate + token metrics."""

from __future__ import annotations

import json

from tests.fake_openai import FakeOpenAIServer
from text2grad.apps.evaluation.compare_feedback import main, render_feedback
from text2grad.core.feedback import Feedback

RECORDS = [
    {"id": f"r{i}", "prompt": f"Summarize: Alex{i} moved to Berlin for a job.", "response": f"Alex{i} moved to Oslo for a job.",
     "critique": "The city is wrong.", "good_spans": ["for a job"], "poor_spans": ["Oslo"]}
    for i in range(8)
]


def cot_critic(prompt: str, response: str) -> Feedback:
    """Critique first, then the right spans (what a CoT reward model writes)."""
    return Feedback(critique="The city is wrong: the post says Berlin.", good_spans=("for a job",), poor_spans=("Oslo",))


def nocot_critic(prompt: str, response: str) -> Feedback:
    """Spans only, and a wrong one (no critique)."""
    return Feedback(critique="", good_spans=("Oslo",), poor_spans=())


def prefers_the_critiqued_feedback(body: dict, n: int) -> str:
    user = body["messages"][-1]["content"]
    a = user.split("[Feedback A]")[1].split("[Feedback B]")[0]
    return "Feedback A explains the error.\nVerdict: A" if "Critique:" in a else "Feedback B explains it.\nVerdict: B"


def test_render_feedback_shows_a_missing_critique_as_spans_only():
    assert render_feedback(Feedback(good_spans=("x",))) == 'Good spans: "x"\nPoor spans: none'
    assert render_feedback(cot_critic("", "")).startswith("Critique: The city is wrong")


def test_cot_vs_nocot_judge_win_rate_and_token_metrics(tmp_path, bpe_tokenizer):
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    bpe_tokenizer.save_pretrained(tmp_path / "tok")
    with FakeOpenAIServer(prefers_the_critiqued_feedback) as server:
        rc = main([
            "--dataset_path", str(tmp_path / "eval.jsonl"), "--tokenizer", str(tmp_path / "tok"),
            "--candidate_critic", "tests.apps.evaluation.test_compare_feedback:cot_critic",
            "--baseline_critic", "tests.apps.evaluation.test_compare_feedback:nocot_critic",
            "--base_url", server.base_url, "--judge_model", "judge", "--output_dir", str(tmp_path / "out"),
        ])
    assert rc == 0 and len(server.requests) == 8
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    judge = report["judge"]
    assert (judge["win_share"], judge["tie_share"], judge["loss_share"]) == (1.0, 0.0, 0.0)
    assert 0 < judge["a_preferred_rate"] < 1  # the candidate was shown in both positions
    cand, base = report["token_metrics"]["candidate"], report["token_metrics"]["baseline"]
    assert cand["token"]["negative"]["f1"] == 1.0 and cand["token"]["positive"]["f1"] == 1.0
    assert base["token"]["negative"]["f1"] == 0.0 and base["token"]["positive"]["f1"] == 0.0
    assert len((tmp_path / "out" / "judgments.jsonl").read_text().splitlines()) == 8


def test_missing_inputs_exit_2(tmp_path, capsys):
    assert main(["--dataset_path", str(tmp_path / "none.jsonl")]) == 2
    assert "error: set --dataset_path" in capsys.readouterr().err
