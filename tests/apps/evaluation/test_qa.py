"""QA evaluation: ARC scoring on a tiny generated multiple-choice set, AlpacaEval / MT-Bench style judging."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from tests.fake_openai import FakeOpenAIServer

from text2grad.apps.evaluation.summarization_config import SummarizationEvalConfig
from text2grad.core.config import load_config
from text2grad.core.data import DataError, iter_jsonl, write_jsonl
from text2grad.apps.evaluation.qa import MultipleChoiceItem, main, normalize_multiple_choice, score_multiple_choice
from text2grad.apps.evaluation.qa_config import QAEvalConfig

# One record per accepted layout: hub (choices {text, label}), original ARC (question {stem, choices}),
# flat (choices [str], integer answer), and numeric labels as some ARC items have.
ARC = [
    {"id": "q1", "question": "What is the capital of Germany?",
     "choices": {"text": ["Lisbon", "Berlin", "Oslo", "Kyoto"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
    {"id": "q2", "question": {"stem": "Which animal barks?", "choices": [{"text": "a cat", "label": "A"}, {"text": "a dog", "label": "B"},
                                                                        {"text": "a fish", "label": "C"}]}, "answerKey": "B"},
    {"id": "q3", "question": "What do you write code in?", "choices": ["an editor", "a bathtub", "a cloud of steam"], "answer": 0},
    {"id": "q4", "question": "How many legs does a spider have?", "choices": {"text": ["six", "eight", "four"], "label": ["1", "2", "3"]},
     "answerKey": "2"},
]


def test_normalize_multiple_choice_layouts():
    items = [normalize_multiple_choice(r, i) for i, r in enumerate(ARC)]
    assert [it.choices[it.answer] for it in items] == ["Berlin", "a dog", "an editor", "eight"]
    assert items[1].question == "Which animal barks?" and items[3].labels == ("1", "2", "3")
    with pytest.raises(DataError, match="answer 'E'"):
        normalize_multiple_choice({"question": "q", "choices": ["x", "y"], "answerKey": "E"}, 0)
    with pytest.raises(DataError, match="at least 2 choices"):
        normalize_multiple_choice({"question": "q", "choices": ["x"], "answer": 0}, 0)


def _manual_choice_logprobs(model, tokenizer, prompt, choices):
    out = []
    for choice in choices:
        ctx = tokenizer(prompt)["input_ids"]
        cont = tokenizer(" " + choice, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits[0].float(), -1)
        out.append((sum(logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(cont)), len(cont)))
    return out


def test_scoring_with_a_hand_computable_model(bpe_tokenizer, unigram_lm):
    model = unigram_lm(len(bpe_tokenizer), seed=3)
    log_p = torch.log_softmax(model.weights.detach(), -1)
    items = [normalize_multiple_choice(r, i) for i, r in enumerate(ARC)]
    summary, rows = score_multiple_choice(model, bpe_tokenizer, items, batch_size=3)
    correct = correct_norm = 0
    for item, row in zip(items, rows):
        ids = [bpe_tokenizer(" " + c, add_special_tokens=False)["input_ids"] for c in item.choices]
        sums = [sum(log_p[i].item() for i in seq) for seq in ids]
        means = [s / len(seq) for s, seq in zip(sums, ids)]
        assert row["choice_logprobs"] == pytest.approx(sums, abs=1e-4)
        assert row["choice_tokens"] == [len(seq) for seq in ids]
        best, best_norm = sums.index(max(sums)), means.index(max(means))
        assert row["prediction"] == item.labels[best] and row["prediction_norm"] == item.labels[best_norm]
        correct += best == item.answer
        correct_norm += best_norm == item.answer
    assert summary == {"n": 4, "accuracy": correct / 4, "accuracy_norm": correct_norm / 4}


def _train_on_answers(model, tokenizer, items, steps=15):
    """Teach a tiny model the right answers (teacher forcing on 'Question: q\\nAnswer: a')."""
    texts = [f"Question: {it.question}\nAnswer: {it.choices[it.answer]}" for it in items]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        for text in texts:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    model.eval()


def test_arc_cli_on_a_tiny_generated_set(tmp_path, bpe_tokenizer, tiny_llama, capsys):
    data = tmp_path / "arc.jsonl"
    write_jsonl(data, ARC)
    items = [normalize_multiple_choice(r, i) for i, r in enumerate(ARC)]
    tiny_llama.eval()
    untrained = tmp_path / "untrained"
    tiny_llama.save_pretrained(untrained)
    bpe_tokenizer.save_pretrained(untrained)
    assert main(["--task", "arc", "--dataset_path", str(data), "--model", str(untrained), "--output_dir", str(tmp_path / "u"),
                 "--batch_size", "5", "--progress_bar", "false", "--device", "cpu"]) == 0
    rows = list(iter_jsonl(tmp_path / "u" / "arc_items.jsonl"))
    correct = 0
    for item, row in zip(items, rows):  # the CLI's predictions agree with an independent unbatched computation
        manual = _manual_choice_logprobs(tiny_llama, bpe_tokenizer, f"Question: {item.question}\nAnswer:", item.choices)
        assert row["choice_logprobs"] == pytest.approx([m[0] for m in manual], abs=1e-4)
        best = max(range(len(manual)), key=lambda k: manual[k][0])
        assert row["prediction"] == item.labels[best]
        correct += best == item.answer
    results = json.loads((tmp_path / "u" / "arc.json").read_text())["results"]
    assert results["accuracy"] == correct / 4 and results["n"] == 4

    _train_on_answers(tiny_llama, bpe_tokenizer, items)
    trained = tmp_path / "trained"
    tiny_llama.save_pretrained(trained)
    bpe_tokenizer.save_pretrained(trained)
    assert main(["--task", "arc", "--dataset_path", str(data), "--model", str(trained), "--output_dir", str(tmp_path / "t"),
                 "--progress_bar", "false", "--device", "cpu"]) == 0
    results = json.loads((tmp_path / "t" / "arc.json").read_text())["results"]
    assert results["accuracy"] == 1.0 and results["accuracy_norm"] == 1.0
    md = (tmp_path / "t" / "arc.md").read_text()
    assert "| ARC accuracy (sum log-prob) | 1.0000 | 4 |" in md


def test_alpaca_eval_style_with_generation_and_fake_judge(tmp_path, saved_policy, monkeypatch):
    monkeypatch.setitem(sys.modules, "alpaca_eval", None)  # as if alpaca-eval were not installed
    data = tmp_path / "alpaca.json"
    records = [{"instruction": f"Give advice number {i}.", "output": ("STRONG baseline" if i % 3 == 0 else "weak baseline"),
                "generator": "ref"} for i in range(6)]
    data.write_text(json.dumps(records))

    def handler(body, n):
        user = body["messages"][-1]["content"]
        a = user.split("[Response A]\n", 1)[1].split("\n\n[Response B]", 1)[0]
        b = user.split("[Response B]\n", 1)[1].split("\n\nFirst explain", 1)[0]
        if "STRONG" in a or "STRONG" in b:
            return "Verdict: A" if "STRONG" in a else "Verdict: B"
        return "Verdict: B" if "weak baseline" in a else "Verdict: A"  # prefer the policy over the weak baseline

    with FakeOpenAIServer(handler) as server:
        rc = main(["--task", "alpaca_eval", "--dataset_path", str(data), "--model", str(saved_policy), "--output_dir", str(tmp_path / "o"),
                   "--max_new_tokens", "5", "--judge_model", "fake", "--judge_base_url", server.base_url, "--progress_bar", "false",
                   "--device", "cpu", "--baseline_name", "gpt4_turbo"])
        assert rc == 0 and len(server.requests) == 6
        # the policy's answers reach the judge; with no chat template the prompt is a plain transcript
        assert all("Give advice number" in b["messages"][-1]["content"] for b in server.requests)
    results = json.loads((tmp_path / "o" / "alpaca_eval.json").read_text())["results"]
    assert (results["wins"], results["losses"], results["ties"]) == (4, 2, 0)
    assert results["win_rate"] == pytest.approx(4 / 6)
    assert results["length_controlled_win_rate"] is None
    md = (tmp_path / "o" / "alpaca_eval.md").read_text()
    assert "not installed" in md and "the win rate is raw" in md
    items = list(iter_jsonl(tmp_path / "o" / "alpaca_eval_items.jsonl"))
    assert [it["id"] for it in items] == [str(i) for i in range(6)] and all("prediction" in it for it in items)


def test_mt_bench_style_multi_turn(tmp_path, saved_policy):
    data = tmp_path / "mt.jsonl"
    write_jsonl(data, [
        {"question_id": 81, "category": "writing", "turns": ["Write a haiku about Berlin.", "Now make it rhyme."]},
        {"question_id": 82, "category": "math", "turns": ["What is 2 + 2?"], "reference": ["4"]},
    ])

    def handler(body, n):
        user = body["messages"][-1]["content"]
        turns = user.count("### User:")
        return f"Rating: [[{3 + 4 * (turns - 1)}]]" if "Reference answer" not in user else "Rating: [[9]]"

    with FakeOpenAIServer(handler) as server:
        rc = main(["--task", "mt_bench", "--dataset_path", str(data), "--model", str(saved_policy), "--output_dir", str(tmp_path / "o"),
                   "--max_new_tokens", "4", "--judge_model", "fake", "--judge_base_url", server.base_url, "--progress_bar", "false",
                   "--device", "cpu"])
        assert rc == 0 and len(server.requests) == 3
    results = json.loads((tmp_path / "o" / "mt_bench.json").read_text())["results"]
    assert results["score"] == pytest.approx((3 + 7 + 9) / 3)
    assert results["per_turn"] == {"1": pytest.approx(6.0), "2": pytest.approx(7.0)}
    assert results["per_category"] == {"math": 9.0, "writing": pytest.approx(5.0)}
    items = list(iter_jsonl(tmp_path / "o" / "mt_bench_items.jsonl"))
    turn1, turn2 = items[0], items[1]
    assert (turn1["turn"], turn2["turn"]) == (1, 2)
    # turn 2 was answered with the policy's own turn-1 answer in the conversation
    assert turn2["messages"][:2] == turn1["messages"] and turn2["messages"][2]["content"] == "Now make it rhyme."


def test_mt_bench_predictions_file_needs_one_answer_per_turn(tmp_path, capsys):
    data, preds = tmp_path / "mt.jsonl", tmp_path / "answers.jsonl"
    write_jsonl(data, [{"question_id": 1, "turns": ["a?", "b?"]}])
    write_jsonl(preds, [{"question_id": 1, "prediction": ["only one"]}])
    assert main(["--task", "mt_bench", "--dataset_path", str(data), "--predictions_file", str(preds), "--judge_model", "x",
                 "--judge_base_url", "http://127.0.0.1:9/v1", "--output_dir", str(tmp_path / "o")]) == 2
    assert "1 answers for 2 turns" in capsys.readouterr().err


def test_judged_tasks_require_a_judge(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--task", "alpaca_eval", "--dataset_path", "x.json", "--model", "m"])
    assert "--judge_model" in capsys.readouterr().err
    assert isinstance(normalize_multiple_choice(ARC[0], 0), MultipleChoiceItem)


def test_alpaca_eval_scores_model_outputs_json_matched_by_instruction(tmp_path):
    """AlpacaEval's own files have no ids: outputs are matched to the data by instruction text."""
    data, outputs = tmp_path / "alpaca_eval.json", tmp_path / "model_outputs.json"
    data.write_text(json.dumps([{"instruction": f"task {i}", "output": f"baseline {i}", "generator": "gpt4_turbo"} for i in range(4)]))
    # shuffled order, AlpacaEval's field names
    outputs.write_text(json.dumps([{"instruction": f"task {i}", "output": f"policy {i}" + (" BEST" if i < 3 else ""), "generator": "mine"}
                                   for i in (2, 0, 3, 1)]))

    def handler(body, n):
        user = body["messages"][-1]["content"]
        a = user.split("[Response A]\n", 1)[1].split("\n\n[Response B]", 1)[0]
        b = user.split("[Response B]\n", 1)[1].split("\n\nFirst explain", 1)[0]
        return "Verdict: A" if "BEST" in a else "Verdict: B" if "BEST" in b else "Verdict: tie"

    with FakeOpenAIServer(handler) as server:
        rc = main(["--task", "alpaca_eval", "--dataset_path", str(data), "--predictions_file", str(outputs), "--prediction_field", "output",
                   "--judge_model", "fake", "--judge_base_url", server.base_url, "--output_dir", str(tmp_path / "o"),
                   "--length_controlled", "false", "--progress_bar", "false"])
        assert rc == 0
    results = json.loads((tmp_path / "o" / "alpaca_eval.json").read_text())["results"]
    assert (results["wins"], results["ties"], results["losses"]) == (3, 1, 0)
    assert results["win_rate"] == pytest.approx(3.5 / 4)
    items = list(iter_jsonl(tmp_path / "o" / "alpaca_eval_items.jsonl"))
    assert [it["prediction"].split(" BEST")[0] for it in items] == [f"policy {i}" for i in range(4)]
    assert "switched off" in (tmp_path / "o" / "alpaca_eval.md").read_text()


def test_shipped_eval_configs_parse():
    root = Path(__file__).resolve().parents[3]
    slf5k = load_config(SummarizationEvalConfig, root / "configs/slf5k/eval.yaml", {"dataset_path": "d.jsonl", "model": "m"})
    assert slf5k.stop_strings == ["\n\n"] and slf5k.field_map == {"reference": "ideal_human_summary"}
    assert "{post}" in slf5k.prompt_template and slf5k.bertscore_model is None
    for task in ("arc", "alpaca_eval", "mt_bench"):
        cfg = load_config(QAEvalConfig, root / "configs/ultrafeedback/eval.yaml", {"task": task, "dataset_path": "d", "model": "m", "judge_model": "j"})
        assert cfg.use_chat_template and cfg.baseline_field == "output"
