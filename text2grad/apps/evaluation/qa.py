"""QA evaluation (UltraFeedback in the paper): ARC-Challenge, AlpacaEval 2.0 style and MT-Bench style judging.

::

    # ARC-Challenge accuracy by log-likelihood of the answer choices
    python -m text2grad.apps.evaluation.qa --task arc --model M --dataset_path allenai/ai2_arc --dataset_config ARC-Challenge --dataset_split test
    python -m text2grad.apps.evaluation.qa --task arc --model M --dataset_path arc_challenge_test.jsonl

    # AlpacaEval 2.0 style: pairwise judge against the reference outputs in the data (field "output")
    python -m text2grad.apps.evaluation.qa --task alpaca_eval --model M --dataset_path alpaca_eval.json --judge_model gpt-4o

    # MT-Bench style: multi-turn answers graded 1-10 by the judge
    python -m text2grad.apps.evaluation.qa --task mt_bench --model M --dataset_path mt_bench_questions.jsonl --judge_model gpt-4o

**ARC.** Each choice is scored by the log-probability of its tokens given ``Question: {question}\\nAnswer:``
(the choice text follows a space). Two accuracies are reported: by the summed log-probability, and by the
per-token mean (length-normalized), since the sum favours short choices. Ties go to the first choice.
Data: a JSONL/JSON file or a hub id (``allenai/ai2_arc`` with ``--dataset_config ARC-Challenge``), in the hub
layout (``question``, ``choices: {text, label}``, ``answerKey``), the original ARC layout
(``question: {stem, choices: [{text, label}]}``, ``answerKey``) or a flat one (``choices: [str]``,
``answer``: index or label); ``--field_map`` renames fields.

**AlpacaEval 2.0 style.** The policy answers each instruction (chat template on); the judge compares it
with the baseline output (the data's ``output`` field, GPT-4 Turbo's outputs in AlpacaEval 2.0, or
``--baseline_predictions``) using ``prompts/alpaca_eval_pairwise.txt``, with the A/B order drawn per item.
Reported: raw win rate ``(wins + 0.5 ties) / valid``. The length-controlled win rate is computed by the
``alpaca-eval`` package when it is installed and can fit its GLM (it needs the AlpacaEval 2.0 instruction
set in its original order and hub access); otherwise the report says plainly that the win rate is raw.
Our judge prompt is not AlpacaEval's official annotator, so numbers are comparable between our runs, not
with the public leaderboard.

**MT-Bench style.** Questions in MT-Bench's ``question.jsonl`` layout (``question_id``, ``category``,
``turns: [str, ...]``, optional ``reference: [str, ...]``). The policy answers turn by turn, seeing its own
earlier answers; the judge grades each turn's answer 1-10 in the context of the conversation
(``prompts/mt_bench_single.txt``, reference answer shown when given). Score = mean over all graded turns
with a parsed rating; per-turn and per-category means are reported, unparseable ratings counted.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import datasets

from text2grad.apps.evaluation.common import continuation_logprobs, load_generator, load_policy, run_cli, write_report
from text2grad.apps.evaluation.judge import JudgeConfig, PairwiseItem, SingleItem, grade_summary, judge_pairwise, judge_single, length_controlled_win_rate, load_prompt, win_rate_summary
from text2grad.apps.evaluation.qa_config import QAEvalConfig
from text2grad.core.config import save_config
from text2grad.core.data import DataError, load_records, record_id, render_template, write_jsonl
from text2grad.core.generation_backend import TextGenerator

__all__ = [
    "MultipleChoiceItem",
    "normalize_multiple_choice",
    "score_multiple_choice",
    "evaluate_arc",
    "evaluate_alpaca_eval",
    "evaluate_mt_bench",
    "main",
]

logger = logging.getLogger(__name__)

_DEFAULT_JUDGE_PROMPTS = {"alpaca_eval": "alpaca_eval_pairwise", "mt_bench": "mt_bench_single"}


# ------------------------------------------------------------------------------------------------
# ARC: multiple choice by log-likelihood


@dataclass(frozen=True)
class MultipleChoiceItem:
    id: str
    question: str
    choices: tuple[str, ...]
    labels: tuple[str, ...]
    answer: int  # index into choices


def normalize_multiple_choice(record: dict, index: int, answer_fields: Sequence[str] = ("answerKey", "answer", "label")) -> MultipleChoiceItem:
    """One multiple-choice record in any of the accepted layouts (see the module doc) as a `MultipleChoiceItem`."""
    rid = record_id(record, index)
    question, choices = record.get("question"), record.get("choices")
    if isinstance(question, dict):  # original ARC JSONL: {"question": {"stem", "choices": [...]}}
        choices = question.get("choices", choices)
        question = question.get("stem")
    if not isinstance(question, str):
        raise DataError(f"record {rid!r}: no question text (field 'question'); fields: {sorted(record)}. Use --field_map.")
    if isinstance(choices, dict) and "text" in choices:
        texts = list(choices["text"])
        labels = list(choices.get("label") or [chr(65 + i) for i in range(len(texts))])
    elif isinstance(choices, list) and choices and all(isinstance(c, dict) for c in choices):
        texts = [c["text"] for c in choices]
        labels = [c.get("label", chr(65 + i)) for i, c in enumerate(choices)]
    elif isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        texts, labels = list(choices), [chr(65 + i) for i in range(len(choices))]
    else:
        raise DataError(f"record {rid!r}: 'choices' must be {{text, label}}, a list of {{text, label}} or a list of strings; got {choices!r:.100}")
    if len(texts) < 2 or len(texts) != len(labels):
        raise DataError(f"record {rid!r}: needs at least 2 choices with one label each; got {len(texts)} texts and {len(labels)} labels")
    raw = next((record[f] for f in answer_fields if record.get(f) is not None), None)
    labels = [str(lab) for lab in labels]
    if isinstance(raw, bool) or raw is None:
        raise DataError(f"record {rid!r}: no answer (fields tried: {list(answer_fields)})")
    if str(raw) in labels:
        answer = labels.index(str(raw))
    elif isinstance(raw, int) and 0 <= raw < len(texts):
        answer = raw
    else:
        raise DataError(f"record {rid!r}: answer {raw!r} is neither one of the labels {labels} nor a choice index")
    return MultipleChoiceItem(rid, question, tuple(texts), tuple(labels), answer)


def score_multiple_choice(
    model,
    tokenizer,
    items: Sequence[MultipleChoiceItem],
    prompt_template: str = "Question: {question}\nAnswer:",
    choice_prefix: str = " ",
    batch_size: int = 8,
    max_length: int | None = None,
    progress_bar: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Score every choice by its log-likelihood given the question prompt; return ``(summary, per_item_rows)``.

    summary: ``{"n", "accuracy" (argmax of summed log-prob), "accuracy_norm" (argmax of per-token mean)}``.
    Each row: id, answer label, both predictions, per-choice ``logprob`` sums and token counts.
    """
    contexts, continuations, owners = [], [], []
    for k, item in enumerate(items):
        prompt = render_template(prompt_template, {"question": item.question}, where=item.id)
        for choice in item.choices:
            contexts.append(prompt)
            continuations.append(choice_prefix + choice)
            owners.append(k)
    scores = continuation_logprobs(
        model, tokenizer, contexts, continuations, batch_size=batch_size, max_length=max_length, progress_bar=progress_bar
    )
    per_item: list[list] = [[] for _ in items]
    for owner, score in zip(owners, scores):
        per_item[owner].append(score)
    rows, correct, correct_norm = [], 0, 0
    for item, item_scores in zip(items, per_item):
        sums = [s.logprob for s in item_scores]
        means = [s.mean_logprob for s in item_scores]
        pred = max(range(len(sums)), key=lambda i: (sums[i], -i))  # ties: first choice
        pred_norm = max(range(len(means)), key=lambda i: (means[i], -i))
        correct += pred == item.answer
        correct_norm += pred_norm == item.answer
        rows.append(
            {
                "id": item.id,
                "answer": item.labels[item.answer],
                "prediction": item.labels[pred],
                "prediction_norm": item.labels[pred_norm],
                "correct": pred == item.answer,
                "correct_norm": pred_norm == item.answer,
                "choice_logprobs": sums,
                "choice_tokens": [s.num_tokens for s in item_scores],
                "truncated": any(s.truncated for s in item_scores),
            }
        )
    n = len(items)
    return {"n": n, "accuracy": correct / n if n else float("nan"), "accuracy_norm": correct_norm / n if n else float("nan")}, rows


def _load(cfg: QAEvalConfig, required: tuple[str, ...] = ()) -> list[dict]:
    """Local files through `load_records`; hub ids through ``datasets`` (with a config name, which ARC needs)."""
    if Path(cfg.dataset_path).expanduser().exists() or cfg.dataset_config is None:
        records = load_records(cfg.dataset_path, split=cfg.dataset_split, field_map=cfg.field_map, required=required, limit=cfg.limit)
    else:
        try:
            ds = datasets.load_dataset(cfg.dataset_path, cfg.dataset_config, split=cfg.dataset_split or "test")
        except Exception as exc:  # noqa: BLE001 - datasets raises many types; all mean "could not load"
            raise DataError(
                f"could not load {cfg.dataset_path!r} (config {cfg.dataset_config!r}): {type(exc).__name__}: {exc}. Hub ids need "
                "network access or a warm HF cache; otherwise pass a .jsonl/.json file."
            ) from None
        records = [dict(r) for r in (ds.select(range(min(cfg.limit, len(ds)))) if cfg.limit is not None else ds)]
        for rec in records:
            for ours, theirs in cfg.field_map.items():
                if theirs in rec:
                    rec[ours] = rec[theirs]
    if not records:
        raise DataError(f"{cfg.dataset_path} holds no records")
    return records


def _policy(cfg: QAEvalConfig):
    return load_policy(cfg.model, cfg.adapter, cfg.dtype, cfg.device)


def _system_label(cfg: QAEvalConfig) -> str:
    if cfg.model is None:
        return str(cfg.predictions_file)
    return cfg.model + (f" + {cfg.adapter}" if cfg.adapter else "")


def evaluate_arc(cfg: QAEvalConfig) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """ARC accuracy; returns ``(results, report_rows, per_item_rows)``."""
    items = [normalize_multiple_choice(r, i) for i, r in enumerate(_load(cfg))]
    model, tokenizer = _policy(cfg)
    summary, per_item = score_multiple_choice(
        model, tokenizer, items, cfg.arc_prompt_template, cfg.choice_prefix, cfg.batch_size, cfg.max_length, cfg.progress_bar
    )
    results = {"task": "arc", "system": _system_label(cfg), "data": cfg.dataset_path} | summary
    results["notes"] = [
        f"Accuracy over n = {summary['n']} questions: each choice scored by the log-probability of its tokens given "
        f"the prompt {cfg.arc_prompt_template!r}; 'accuracy' picks the highest sum, 'accuracy_norm' the highest per-token mean.",
    ]
    truncated = sum(r["truncated"] for r in per_item)
    if truncated:
        results["notes"].append(f"{truncated} questions had a context or choice cut to max_length={cfg.max_length}.")
    rows = [
        {"metric": "ARC accuracy (sum log-prob)", "value": summary["accuracy"], "n": summary["n"]},
        {"metric": "ARC accuracy (per-token mean log-prob)", "value": summary["accuracy_norm"], "n": summary["n"]},
    ]
    return results, rows, per_item


# ------------------------------------------------------------------------------------------------
# Generation for the judged tasks


def _chat_prompt(tokenizer, messages: list[dict], cfg: QAEvalConfig) -> str:
    """The generation prompt for a conversation that ends with a user turn."""
    if cfg.use_chat_template and getattr(tokenizer, "chat_template", None):
        full = ([{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []) + messages
        return tokenizer.apply_chat_template(full, tokenize=False, add_generation_prompt=True)
    # No chat template: a plain transcript; generation stops when the model starts a new "User:" turn.
    names = {"user": "User", "assistant": "Assistant"}
    head = f"{cfg.system_prompt}\n\n" if cfg.system_prompt else ""
    return head + "".join(f"{names[m['role']]}: {m['content']}\n\n" for m in messages) + "Assistant:"


def _generate_turn(generator: TextGenerator, conversations: list[list[dict]], cfg: QAEvalConfig) -> list[str]:
    tokenizer = generator.tokenizer
    templated = cfg.use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    stop = None if templated else ["\nUser:"]
    gens = generator.generate(
        [_chat_prompt(tokenizer, c, cfg) for c in conversations],
        max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, do_sample=cfg.do_sample,
        temperature=cfg.temperature, top_p=cfg.top_p, max_prompt_length=cfg.max_prompt_length,
        stop_strings=stop, add_special_tokens=not templated, seed=cfg.seed, progress_bar=cfg.progress_bar,
    )
    texts = []
    for g in gens:
        text = g.text
        if stop and text.endswith(stop[0]):
            text = text[: -len(stop[0])]
        texts.append(text.strip())
    return texts


def _judge_config(cfg: QAEvalConfig):
    return JudgeConfig(
        model=cfg.judge_model, base_url=cfg.judge_base_url, api_key_env=cfg.judge_api_key_env,
        concurrency=cfg.judge_concurrency, max_retries=cfg.judge_max_retries, max_tokens=cfg.judge_max_tokens,
    )


def _predictions(path: str, output_field: str, ids: list[str], keys: list[str] | None = None) -> list[Any]:
    """The outputs in ``path`` (JSONL or a JSON list) for each record: matched by id when the file's rows have
    ids; otherwise by the ``instruction`` field when ``keys`` (the records' instructions) are given, so
    AlpacaEval's own ``model_outputs.json`` (``[{instruction, output, generator}]``) works as is; otherwise by
    position."""
    rows = load_records(path)
    for i, rec in enumerate(rows):
        if output_field not in rec:
            raise DataError(f"{path}: record {i} has no field {output_field!r} (fields: {sorted(rec)}); set --prediction_field")
    # record_id falls back to the position; "-1" means the row has no id of its own
    has_ids = all(record_id(rec, -1) != "-1" for rec in rows)
    if keys is not None and not has_ids and all("instruction" in rec for rec in rows):
        return _lookup({str(rec["instruction"]): rec[output_field] for rec in rows}, keys, path)
    if not has_ids and len(rows) != len(ids):
        raise DataError(f"{path} has no ids and {len(rows)} rows for {len(ids)} records; add an id (or instruction) field")
    return _lookup({record_id(rec, i): rec[output_field] for i, rec in enumerate(rows)}, ids, path)


def _lookup(table: dict[str, Any], ids: list[str], source: str) -> list[Any]:
    missing = [i for i in ids if i not in table]
    if missing:
        raise DataError(f"{source} lacks entries for {len(missing)} of {len(ids)} records (e.g. ids {missing[:5]})")
    return [table[i] for i in ids]


def evaluate_alpaca_eval(cfg: QAEvalConfig) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """AlpacaEval 2.0 style pairwise judging against a baseline; returns ``(results, report_rows, per_item_rows)``."""
    required = (cfg.instruction_field,) + (() if cfg.baseline_predictions else (cfg.baseline_field,))
    records = _load(cfg, required=required)
    ids = [record_id(r, i) for i, r in enumerate(records)]
    instructions = [str(r[cfg.instruction_field]) for r in records]
    if cfg.baseline_predictions:
        baseline = [str(x) for x in _predictions(cfg.baseline_predictions, cfg.prediction_field, ids, instructions)]
    else:
        baseline = [str(r[cfg.baseline_field]) for r in records]
    if cfg.predictions_file:
        outputs = [str(x) for x in _predictions(cfg.predictions_file, cfg.prediction_field, ids, instructions)]
    else:
        outputs = _generate_turn(load_generator(cfg), [[{"role": "user", "content": x}] for x in instructions], cfg)
    items = [PairwiseItem(i, ins, out, base) for i, ins, out, base in zip(ids, instructions, outputs, baseline)]
    judgments = judge_pairwise(items, _judge_config(cfg), load_prompt(cfg.judge_prompt or _DEFAULT_JUDGE_PROMPTS["alpaca_eval"]), cfg.judge_seed, cfg.progress_bar)
    summary = win_rate_summary(judgments)
    system = _system_label(cfg)
    if cfg.length_controlled:
        indices = [int(r["index"]) if isinstance(r.get("index"), int) else k for k, r in enumerate(records)]
        lc, lc_note = length_controlled_win_rate(judgments, items, indices, candidate_name=system, baseline_name=cfg.baseline_name)
    else:
        lc, lc_note = None, "length control switched off (--length_controlled false); the win rate is raw"
    results = {"task": "alpaca_eval", "system": system, "baseline": cfg.baseline_name, "data": cfg.dataset_path, "judge_model": cfg.judge_model}
    results |= summary | {"length_controlled_win_rate": lc}
    results["mean_output_chars"] = sum(map(len, outputs)) / len(outputs)
    results["mean_baseline_chars"] = sum(map(len, baseline)) / len(baseline)
    results["notes"] = [
        f"Raw win rate vs {cfg.baseline_name} = (wins + 0.5 ties) / valid = {summary['win_rate']:.4f} over {summary['n_valid']} of "
        f"{summary['n_items']} items ({summary['wins']} wins, {summary['ties']} ties, {summary['losses']} losses; "
        f"{summary['unparseable']} unparseable, {summary['failed']} failed); judge {cfg.judge_model}, A/B order randomized per item.",
        "Length-controlled: " + lc_note + ".",
        "Judge prompt: " + (cfg.judge_prompt or _DEFAULT_JUDGE_PROMPTS["alpaca_eval"]) + " (not AlpacaEval's official annotator; "
        "comparable across our runs, not with the public leaderboard).",
    ]
    rows = [
        {"metric": f"Win rate vs {cfg.baseline_name} (raw)", "value": summary["win_rate"], "n": summary["n_valid"]},
        {"metric": "Length-controlled win rate (alpaca-eval)", "value": lc, "n": summary["n_valid"] if lc is not None else None},
        {"metric": "Standard error of the raw win rate", "value": summary["standard_error"], "n": summary["n_valid"]},
        {"metric": "Mean output length (chars) policy / baseline",
         "value": f"{results['mean_output_chars']:.0f} / {results['mean_baseline_chars']:.0f}", "n": len(outputs)},
    ]
    per_item = [
        {"id": it.id, "instruction": it.instruction, "prediction": it.candidate, "baseline": it.baseline} | j.to_dict()
        for it, j in zip(items, judgments)
    ]
    return results, rows, per_item


def evaluate_mt_bench(cfg: QAEvalConfig) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """MT-Bench style multi-turn answering and 1-10 grading; returns ``(results, report_rows, per_item_rows)``."""
    records = _load(cfg)
    ids = [record_id(r, i) for i, r in enumerate(records)]
    turns: list[list[str]] = []
    for rid, rec in zip(ids, records):
        t = rec.get("turns", rec.get("prompt", rec.get("instruction")))
        t = [t] if isinstance(t, str) else t
        if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
            raise DataError(f"record {rid!r}: needs 'turns' (a list of user messages) or a 'prompt' string; fields: {sorted(rec)}")
        turns.append(t)
    if cfg.predictions_file:
        answers = [[a] if isinstance(a, str) else list(a) for a in _predictions(cfg.predictions_file, cfg.prediction_field, ids)]
        for rid, t, a in zip(ids, turns, answers):
            if len(a) != len(t):
                raise DataError(f"{cfg.predictions_file}: record {rid!r} has {len(a)} answers for {len(t)} turns")
    else:
        generator = load_generator(cfg)
        answers = [[] for _ in records]
        for turn in range(max(map(len, turns))):
            active = [k for k, t in enumerate(turns) if len(t) > turn]
            conversations = [_conversation(turns[k][: turn + 1], answers[k]) for k in active]
            for k, text in zip(active, _generate_turn(generator, conversations, cfg)):
                answers[k].append(text)
    items = []
    for rid, rec, t, a in zip(ids, records, turns, answers):
        refs = rec.get("reference") or []
        refs = [refs] if isinstance(refs, str) else refs
        for turn in range(len(t)):
            messages = _conversation(t[: turn + 1], a[: turn + 1])
            items.append(SingleItem(rid, tuple(messages), refs[turn] if turn < len(refs) else None, rec.get("category"), turn + 1))
    grades = judge_single(items, _judge_config(cfg), load_prompt(cfg.judge_prompt or _DEFAULT_JUDGE_PROMPTS["mt_bench"]), cfg.progress_bar)
    summary = grade_summary(grades)
    results = {"task": "mt_bench", "system": _system_label(cfg), "data": cfg.dataset_path, "judge_model": cfg.judge_model} | summary
    results["notes"] = [
        f"Score = mean 1-10 rating over {summary['n_valid']} of {summary['n_items']} graded turns "
        f"({summary['unparseable']} unparseable, {summary['failed']} failed); judge {cfg.judge_model} with "
        f"{cfg.judge_prompt or _DEFAULT_JUDGE_PROMPTS['mt_bench']}; each turn graded in the context of the conversation so far.",
    ]
    rows = [{"metric": "MT-Bench-style score (1-10)", "value": summary["score"], "n": summary["n_valid"]}]
    rows += [{"metric": f"turn {t}", "value": v, "n": sum(g.turn == int(t) and g.score is not None for g in grades)} for t, v in summary["per_turn"].items()]
    rows += [{"metric": f"category {c}", "value": v, "n": sum(g.category == c and g.score is not None for g in grades)} for c, v in summary["per_category"].items()]
    per_item = [g.to_dict() | {"messages": list(it.messages)} for g, it in zip(grades, items)]
    return results, rows, per_item


def _conversation(user_turns: Sequence[str], answers: Sequence[str]) -> list[dict]:
    messages = []
    for k, question in enumerate(user_turns):
        messages.append({"role": "user", "content": question})
        if k < len(answers):
            messages.append({"role": "assistant", "content": answers[k]})
    return messages


def evaluate_qa(cfg: QAEvalConfig) -> dict[str, Any]:
    """Run the configured task, write ``<name>.json``, ``<name>.md`` and ``<name>_items.jsonl``; return the results."""
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = cfg.name or cfg.task
    save_config(cfg, out_dir / f"{name}_config.yaml")
    runner = {"arc": evaluate_arc, "alpaca_eval": evaluate_alpaca_eval, "mt_bench": evaluate_mt_bench}[cfg.task]
    results, rows, per_item = runner(cfg)
    write_jsonl(out_dir / f"{name}_items.jsonl", per_item)
    titles = {"arc": "ARC (multiple choice, log-likelihood)", "alpaca_eval": "AlpacaEval 2.0 style", "mt_bench": "MT-Bench style"}
    json_path, md_path = write_report(out_dir, name, results, rows, title=f"{titles[cfg.task]}: {results['system']}")
    results["report_json"], results["report_md"] = str(json_path), str(md_path)
    return results


def main(argv: list[str] | None = None) -> int:
    return run_cli(QAEvalConfig, evaluate_qa, argv)


if __name__ == "__main__":
    sys.exit(main())
