"""An offline tiny world for smoke runs: ``python -m text2grad.apps.tiny --dataset slf5k --output_dir DIR``.

Writes, for one of the paper's datasets:

- ``DIR/raw/``: generated rows in the dataset's NATIVE layout, with its exact column names, types and split
  names, as files named like the hub repository's:
  slf5k: ``train.jsonl``, ``development.jsonl``, ``validation.jsonl``, ``test.jsonl`` with SLF5K's 12 columns
  (``comparison_preference`` "Summary A" / "Summary B");
  ultrafeedback: ``data/<split>-00000-of-00001.parquet`` for train_prefs, test_prefs, train_sft, test_sft,
  train_gen, test_gen, with ``chosen`` / ``rejected`` / ``messages`` as lists of ``{role, content}`` messages;
  kodcode: ``data/train-00000-of-00001.parquet`` with ``question_id``, ``question``, ``solution``, ``test``
  (``from solution import f``), ``test_info`` (a list of dicts) and the ``gpt_*`` columns;
- ``DIR/completions.jsonl`` (kodcode): weaker-model style completions, some right and some wrong, keyed by
  ``question_id`` (the ``--completions`` input of prepare-data);
- ``DIR/data/``: ``text2grad prepare-data`` run on ``DIR/raw`` (the same code a user runs on the real data;
  ``--prepare false`` leaves it to the caller, as the per-dataset scripts do);
- ``DIR/model``: a tokenizer trained on the generated text and a tiny, randomly initialised Llama, saved with
  ``save_pretrained`` so every phase loads it as a local path exactly like a hub checkpoint;
- ``DIR/annotations.jsonl``: annotation records (prompt, response, critique, good/poor spans) for
  reward-model training, with spans that are exact quotes of the response.

The per-dataset shell scripts use it when ``TEXT2GRAD_TINY=1``, so CI proves the scripts, the field maps and
prepare-data run on the real layouts. The model is untrained: this is for plumbing, not results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any, Sequence

from datasets import Dataset

from text2grad.apps.prepare_data import main as prepare_data
from text2grad.apps.prepare_data.kodcode import policy_prompt
from text2grad.core.cli import guarded
from text2grad.core.config import CliParser, program_name
from text2grad.core.data import write_jsonl
from text2grad.core.modeling import build_tiny_llama, train_tokenizer

__all__ = ["make_records", "make_tiny_world", "write_native", "main"]

DATASETS = ("slf5k", "kodcode", "ultrafeedback")

_NAMES = ["Alex", "Sam", "Jordan", "Taylor", "Riley", "Morgan"]
_CITIES = ["Berlin", "Lisbon", "Oslo", "Denver", "Kyoto", "Austin"]
_THINGS = ["a new job", "a used car", "a rescue dog", "an old piano", "a small flat", "a bike"]
_OPS = [("add", "a + b", "a - b", "the sum"), ("sub", "a - b", "b - a", "the difference a minus b"),
        ("mul", "a * b", "a + b", "the product"), ("max2", "max(a, b)", "min(a, b)", "the larger")]


def _slf5k(i: int, rng: random.Random) -> dict[str, Any]:
    name, city, thing = rng.choice(_NAMES), rng.choice(_CITIES), rng.choice(_THINGS)
    wrong_city = rng.choice([c for c in _CITIES if c != city])
    title = f"Should I get {thing}?"
    post = (
        f"I ({name}, {rng.randint(19, 40)}) moved to {city} {rng.randint(2, 11)} months ago. I am thinking about "
        f"getting {thing} but my partner worries about money. Should I wait until we have saved more?"
    )
    ideal = f"{name} moved to {city} and wants {thing}, but the partner worries about money."
    generated = f" {name} moved to {wrong_city} and wants {thing}."
    better, worse = f" {name} in {city} wants {thing}; the partner worries about money.", f" {name} wants things."
    a_first = i % 2 == 0
    return {
        "id": f"t3_tiny{i:04d}",
        "subreddit": "relationships",
        "title": title,
        "post": post,
        "summary_prompt": f"Title: {title}\n\nText: {post}\n\nTL;DR:",
        "generated_summary_for_feedback": generated,
        "feedback": f"The summary gets the city wrong: it is {city}, not {wrong_city}, and omits the partner's worry.",
        "feedback_class": "Accuracy",
        "ideal_human_summary": ideal,
        "generated_summary_for_comparison_A": better if a_first else worse,
        "generated_summary_for_comparison_B": worse if a_first else better,
        "comparison_preference": "Summary A" if a_first else "Summary B",
        "_good": [f"wants {thing}"],
        "_poor": [wrong_city],
    }


def _kodcode(i: int, rng: random.Random) -> dict[str, Any]:
    name, expr, wrong, what = _OPS[i % len(_OPS)]
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    expected = eval(expr, {"a": a, "b": b, "max": max})  # noqa: S307 - our own constant expression
    solution = f"def {name}(a, b):\n    return {expr}\n"
    test = (f"from solution import {name}\n\n\ndef test_{name}():\n    assert {name}({a}, {b}) == {expected}\n\n\n"
            f"def test_{name}_zero():\n    assert {name}(0, 0) == 0\n")
    qid = f"Prefill_{1000 + i}_I"
    return {
        "version": "v1.0", "style": "instruct", "subset": "Prefill", "question_id": qid,
        "question": f"Write a function {name}(a, b) that returns {what} of two integers a and b.",
        "solution": solution, "test": test,
        "test_info": [{"function_name": name, "function_declaration": f"def {name}(a, b):", "parameter_list": "(a, b)",
                       "docstring": f"Returns {what} of a and b."}],
        "gpt_pass_sequence": [1, 1, 1], "gpt_pass_trial_num": 3, "gpt_difficulty": "easy", "gpt_pass_percentage": 1.0,
        # a weaker model's answer: right for odd i, the wrong operator for even i
        "_completion": f"```python\ndef {name}(a, b):\n    result = {expr if i % 2 else wrong}\n    return result\n```",
        "_good": [f"return {expr}"],
        "_poor": [],
    }


def _ultrafeedback(i: int, rng: random.Random) -> dict[str, Any]:
    city, thing = rng.choice(_CITIES), rng.choice(_THINGS)
    prompt = f"How do I find {thing} in {city}? (question {i})"
    good = f"In {city}, look for {thing} on local listings and compare prices before you buy."
    bad = f"Just buy {thing} anywhere; prices are the same everywhere."
    chosen = [{"role": "user", "content": prompt}, {"role": "assistant", "content": good}]
    rejected = [{"role": "user", "content": prompt}, {"role": "assistant", "content": bad}]
    return {
        "prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
        "chosen": chosen, "rejected": rejected, "messages": chosen,
        "score_chosen": float(rng.choice([8, 9, 10])), "score_rejected": float(rng.choice([1, 2, 3])),
        "_good": ["compare prices"], "_poor": ["prices are the same everywhere"],
    }


_MAKERS = {"slf5k": _slf5k, "kodcode": _kodcode, "ultrafeedback": _ultrafeedback}


def make_records(dataset: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows of ``dataset`` in its native columns (plus private ``_``-prefixed keys for the annotations)."""
    if dataset not in _MAKERS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(DATASETS)}")
    rng = random.Random(seed)
    return [_MAKERS[dataset](i, rng) for i in range(n)]


def _public(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def write_native(dataset: str, raw_dir: str | Path, n_train: int = 24, n_eval: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """Write the native files of ``dataset`` under ``raw_dir`` (see the module docstring); returns every row."""
    raw = Path(raw_dir)
    if dataset == "slf5k":
        sizes = {"train": n_train, "development": max(2, n_eval // 2), "validation": n_eval, "test": n_eval}
    elif dataset == "ultrafeedback":
        sizes = {"train_prefs": n_train, "test_prefs": n_eval, "train_sft": n_eval, "test_sft": n_eval // 2 or 1,
                 "train_gen": n_eval, "test_gen": n_eval // 2 or 1}
    else:
        sizes = {"train": n_train + n_eval}
    rows = make_records(dataset, sum(sizes.values()), seed)
    start = 0
    for split, size in sizes.items():
        part = _public(rows[start:start + size])
        start += size
        if dataset == "slf5k":  # the SLF5K repository's own files are JSONL
            write_jsonl(raw / f"{split}.jsonl", part)
        else:  # the others are parquet repositories: data/<split>-00000-of-00001.parquet
            (raw / "data").mkdir(parents=True, exist_ok=True)
            Dataset.from_list(part).to_parquet(str(raw / "data" / f"{split}-00000-of-00001.parquet"))
    return rows


def _annotation(dataset: str, row: dict[str, Any], response_kind: str = "") -> dict[str, Any]:
    if dataset == "slf5k":
        rid, prompt, response = row["id"], row["post"], row["generated_summary_for_feedback"]
    elif dataset == "kodcode":
        rid, prompt = f"{row['question_id']}:reference", policy_prompt(row["question"], row["test_info"])
        response = f"```python\n{row['solution'].rstrip()}\n```"
    else:
        rid, prompt = f"{row['prompt_id']}:{response_kind}", row["prompt"]
        response = row[response_kind][-1]["content"]
    good = [s for s in row["_good"] if s in response]
    poor = [s for s in row["_poor"] if s in response]
    critique = " ".join([f"The response correctly says '{g}'." for g in good] + [f"'{p}' is wrong." for p in poor])
    return {"id": rid, "prompt": prompt, "response": response, "critique": critique or "The response is acceptable.",
            "good_spans": good, "poor_spans": poor, "unmatched_spans": {"good": [], "poor": []}, "source": "tiny-rule",
            "meta": {}}


def make_tiny_world(dataset: str, output_dir: str | Path, n_train: int = 24, n_eval: int = 8, seed: int = 0,
                    prepare: bool = True) -> Path:
    """Write the tiny model, native data and annotations for ``dataset`` under ``output_dir`` (idempotent), and
    with ``prepare`` run prepare-data on the native data into ``output_dir/data``."""
    out = Path(output_dir)
    done = out / ".complete"
    stamp = {"dataset": dataset, "seed": seed, "n_train": n_train, "n_eval": n_eval}
    if not (done.exists() and json.loads(done.read_text()) == stamp):
        rows = write_native(dataset, out / "raw", n_train, n_eval, seed)
        if dataset == "kodcode":
            write_jsonl(out / "completions.jsonl",
                        [{"question_id": r["question_id"], "completion": r["_completion"]} for r in rows])
        kinds = ("chosen", "rejected") if dataset == "ultrafeedback" else ("",)
        write_jsonl(out / "annotations.jsonl", [_annotation(dataset, r, k) for r in rows for k in kinds])
        corpus = [json.dumps(r) for r in rows] + [
            '{"good_spans": [], "poor_spans": []} The summary is correct. The response is wrong.'
        ]
        tokenizer = train_tokenizer(corpus, vocab_size=600, kind="bpe")
        model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=seed)
        tokenizer.save_pretrained(out / "model")
        model.save_pretrained(out / "model")
        done.write_text(json.dumps(stamp))
    if prepare and not (out / "data" / "prepare_report.json").exists():
        argv = ["--dataset", dataset, "--dataset_path", str(out / "raw"), "--output_dir", str(out / "data"), "--seed", str(seed)]
        if dataset == "kodcode":
            argv += ["--completions", str(out / "completions.jsonl")]
        if prepare_data(argv) != 0:
            raise RuntimeError(f"prepare-data failed on the tiny {dataset} data in {out / 'raw'}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    return guarded(lambda: _run(argv))


def _run(argv: Sequence[str] | None) -> int:
    parser = CliParser(prog=program_name(), description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=DATASETS, help="which dataset's native layout to write")
    parser.add_argument("--output_dir", required=True, help="where to write raw/, model/, annotations.jsonl (and data/)")
    parser.add_argument("--n_train", type=int, default=24, help="rows of the main training split")
    parser.add_argument("--n_eval", type=int, default=8, help="rows of each evaluation split")
    parser.add_argument("--seed", type=int, default=0, help="random seed for data and weights")
    parser.add_argument("--prepare", default="true", choices=["true", "false"],
                        help="run prepare-data on raw/ into data/ (the scripts pass false and run it themselves)")
    args = parser.parse_args(argv)
    out = make_tiny_world(args.dataset, args.output_dir, args.n_train, args.n_eval, args.seed, args.prepare == "true")
    print(f"tiny {args.dataset} world in {out}: raw/ (native layout), model/, annotations.jsonl"
          + (", data/ (prepare-data output)" if args.prepare == "true" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
