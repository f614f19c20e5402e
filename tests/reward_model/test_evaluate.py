"""`python -m reward_model.evaluate`: the Table 1 / Appendix C metrics, as JSON and Markdown."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.reward_model.rm_testlib import RECORDS, write_records
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from reward_model.evaluate import is_ensemble_dir, main
from text2grad.apps.cli import main as cli_main


def test_evaluate_memorized_model(memorized_rm, rm_world, tmp_path, unigram_tokenizer):
    unigram_tokenizer.save_pretrained(tmp_path / "policy_tok")
    out = tmp_path / "eval"
    rc = main([
        "--model_name_or_path", str(memorized_rm), "--dataset_path", str(rm_world / "train.jsonl"),
        "--output_dir", str(out), "--max_new_tokens", "64", "--batch_size", "3",
        "--label_tokenizer", str(tmp_path / "policy_tok"),
    ])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["n_examples"] == 4 and report["json_validity_rate"] == 1.0
    assert report["unmatched_span_rate"] == 0.0 and report["token_label_accuracy"] == 1.0
    for cls in ("positive", "negative", "neutral"):
        assert report["token"][cls]["precision"] == report["token"][cls]["recall"] == 1.0
        assert report["token"][cls]["support"] > 0
    assert report["spans"]["exact"] == report["spans"]["n_reference"] == 6
    assert report["generation"]["malformed"] == 0 and report["generation"]["requests"] == 4
    assert "| positive | 1.000 | 1.000 | 1.000 |" in (out / "report.md").read_text()
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in RECORDS]
    assert all(r["predicted"] == r["reference"] for r in rows)


def _word_tokenizer(path):
    """A word-level tokenizer (words and punctuation runs, as ``\w+|[^\w\s]+``) over the records' responses,
    so the token metrics below can be counted by hand; the BPE test tokenizer's merges cannot."""
    words = sorted({w for r in RECORDS for w in re.findall(r"\w+|[^\w\s]+", r["response"])})
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    return path


def test_evaluate_saved_predictions_by_hand(rm_world, tmp_path):
    predictions = [
        {"id": "a", "critique": "ok", "good_spans": ["for a job"], "poor_spans": ["Oslo"]},  # exact
        {"id": "b", "raw": "I refuse to answer in JSON."},  # malformed
        {"id": "c", "critique": "bad", "good_spans": [], "poor_spans": ["compare prices"]},  # wrong sign
        {"id": "d", "raw": 'Hmm.\n{"good_spans": ["Sam wants"], "poor_spans": ["a cat", "a bird"]}'},  # 1 unmatched
    ]
    pred_file = write_records(tmp_path / "pred.jsonl", list(reversed(predictions)))  # matched by id, not order
    out = tmp_path / "eval"
    # through the `text2grad eval-rm` console entry point
    rc = cli_main([
        "eval-rm", "--predictions_file", str(pred_file), "--dataset_path", str(rm_world / "train.jsonl"),
        "--output_dir", str(out), "--label_tokenizer", str(_word_tokenizer(tmp_path / "words")),
    ])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["json_validity"] == {"total": 4, "valid": 3, "repaired": 0}
    assert report["unmatched_span_rate"] == pytest.approx(1 / 6)  # 6 predicted quotes, "a bird" not found
    spans = report["spans"]
    # reference spans: a 2, b 2, c 1, d 1; exact: a 2 + d 1 ("a cat"); predicted located: a 2, c 1, d 2
    assert (spans["n_reference"], spans["exact"], spans["partial"], spans["n_predicted"]) == (6, 3, 0, 5)
    assert spans["predicted_overlapping"] == 3
    # Word-level tokens (see _word_tokenizer), per response, reference / prediction labels:
    #   a "Alex moved to Oslo for a job ."   8 tokens: +{for a job} -{Oslo}        / the same
    #   b "def add ( a , b ): return a - b" 11 tokens: +{def add ( a , b ):} (7) -{return a - b} (4) / all neutral
    #   c "Check local listings and compare prices ." 7 tokens: +{compare prices}  / -{compare prices}
    #   d "Sam wants a cat ."                5 tokens: -{a cat}                     / +{Sam wants} -{a cat}
    # positive: predicted 3 + 2, correct 3 (for a job), reference 3 + 7 + 2
    # negative: predicted 1 + 2 + 2, correct 1 + 2 (Oslo, a cat), reference 1 + 4 + 2
    # neutral: predicted 4 + 11 + 5 + 1 = 21, reference 4 + 0 + 5 + 3 = 12, both 4 + 0 + 5 + 1 = 10
    token = report["token"]
    assert token["positive"]["precision"] == pytest.approx(3 / 5) and token["positive"]["recall"] == pytest.approx(3 / 12)
    assert token["negative"]["precision"] == pytest.approx(3 / 5) and token["negative"]["recall"] == pytest.approx(3 / 7)
    assert token["neutral"]["precision"] == pytest.approx(10 / 21) and token["neutral"]["recall"] == pytest.approx(10 / 12)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert rows[1]["error"] and rows[1]["predicted_ok"] is False
    assert rows[3]["predicted_unmatched"] == ["a bird"]


def test_evaluate_errors(rm_world, tmp_path, capsys):
    assert main(["--dataset_path", str(rm_world / "train.jsonl"), "--output_dir", str(tmp_path)]) == 2
    assert "--model_name_or_path" in capsys.readouterr().err
    pred = write_records(tmp_path / "p.jsonl", [{"id": "zzz", "raw": "x"}])
    rc = main(["--predictions_file", str(pred), "--dataset_path", str(rm_world / "train.jsonl"),
               "--output_dir", str(tmp_path), "--label_tokenizer", str(rm_world / "base")])
    assert rc == 2 and "no prediction for record 'a'" in capsys.readouterr().err


def test_an_ensemble_directory_is_evaluated_as_the_ensemble_critic_with_each_members_metrics(memorized_rm, rm_world, tmp_path):
    """``reward_model.train --ensemble_size K`` leaves member-<k>/ folders and no model of its own: evaluate scores the
    members' consensus and each member's own metrics."""
    ensemble = tmp_path / "ensemble"
    for k in range(2):
        shutil.copytree(memorized_rm, ensemble / f"member-{k}")
    assert is_ensemble_dir(str(ensemble)) and not is_ensemble_dir(str(memorized_rm))
    assert not is_ensemble_dir(str(tmp_path / "missing")) and not is_ensemble_dir(None)
    out = tmp_path / "eval"
    args = ["--model_name_or_path", str(ensemble), "--dataset_path", str(rm_world / "train.jsonl"),
            "--output_dir", str(out), "--max_new_tokens", "64", "--batch_size", "3"]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["n_examples"] == 4 and len(report["members"]) == 2
    # two identical members agree on every quote: the consensus and each member score as the one model does
    for scored in (report, *report["members"]):
        assert scored["json_validity_rate"] == 1.0 and scored["token_label_accuracy"] == 1.0
        assert scored["spans"]["exact"] == scored["spans"]["n_reference"] == 6


def test_an_ensemble_directory_with_an_adapter_is_refused(memorized_rm, rm_world, tmp_path, capsys):
    shutil.copytree(memorized_rm, tmp_path / "ensemble" / "member-0")
    rc = main(["--model_name_or_path", str(tmp_path / "ensemble"), "--adapter", str(memorized_rm),
               "--dataset_path", str(rm_world / "train.jsonl"), "--output_dir", str(tmp_path / "eval")])
    assert rc == 2 and "is an ensemble directory (member-<k>/ inside): drop --adapter" in capsys.readouterr().err
