"""An offline tiny world for smoke runs: ``python -m text2grad.apps.tiny --dataset slf5k --output_dir DIR``.

Writes, for one of the paper's datasets:

- ``DIR/model``: a tokenizer trained on the generated text and a tiny, randomly initialised Llama, saved with
  ``save_pretrained`` so every phase can load it as a local path exactly like a hub checkpoint;
- ``DIR/data/train.jsonl`` and ``DIR/data/eval.jsonl``: records in the dataset's native field names
  (slf5k: id, title, post, summary, feedback, reference; kodcode: id, question, solution, test;
  ultrafeedback: id, prompt, chosen, rejected, response);
- ``DIR/annotations.jsonl``: annotation records (prompt, response, critique, good/poor spans) for
  reward-model training, with spans that are exact quotes of the response.

The per-dataset shell scripts use it when ``TEXT2GRAD_TINY=1``, so CI proves the scripts themselves run.
The model is untrained: this is for checking plumbing, not results (the quickstart trains a real toy policy).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["make_records", "make_tiny_world", "main"]

DATASETS = ("slf5k", "kodcode", "ultrafeedback")

_NAMES = ["Alex", "Sam", "Jordan", "Taylor", "Riley", "Morgan"]
_CITIES = ["Berlin", "Lisbon", "Oslo", "Denver", "Kyoto", "Austin"]
_THINGS = ["a new job", "a used car", "a rescue dog", "an old piano", "a small flat", "a bike"]
_OPS = [("add", "a + b", "+"), ("sub", "a - b", "-"), ("mul", "a * b", "*"), ("max2", "max(a, b)", "max")]


def _slf5k(i: int, rng: random.Random) -> dict:
    name, city, thing = rng.choice(_NAMES), rng.choice(_CITIES), rng.choice(_THINGS)
    months = rng.randint(2, 11)
    post = (
        f"I ({name}, {rng.randint(19, 40)}) moved to {city} {months} months ago. I am thinking about getting "
        f"{thing} but my partner worries about money. Should I wait until we have saved more?"
    )
    reference = f"{name} moved to {city} and wants {thing}, but the partner worries about money."
    wrong_city = rng.choice([c for c in _CITIES if c != city])
    summary = f"{name} moved to {wrong_city} and wants {thing}."
    return {
        "id": f"slf5k-{i}",
        "title": f"Should I get {thing}?",
        "post": post,
        "summary": summary,
        "feedback": f"The summary gets the city wrong: it is {city}, not {wrong_city}, and omits the partner's worry.",
        "reference": reference,
        "_good": [f"wants {thing}"],
        "_poor": [wrong_city],
    }


def _kodcode(i: int, rng: random.Random) -> dict:
    name, expr, sym = _OPS[i % len(_OPS)]
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    expected = eval(expr, {"a": a, "b": b, "max": max})  # noqa: S307 - our own constant expression
    solution = f"def {name}(a, b):\n    return {expr}\n"
    test = f"from solution import {name}\n\n\ndef test_{name}():\n    assert {name}({a}, {b}) == {expected}\n"
    return {
        "id": f"kodcode-{i}",
        "question": f"Write a function {name}(a, b) that returns {expr} ({sym} of two integers).",
        "solution": solution,
        "test": test,
        "_good": [f"return {expr}"],
        "_poor": [],
    }


def _ultrafeedback(i: int, rng: random.Random) -> dict:
    city = rng.choice(_CITIES)
    thing = rng.choice(_THINGS)
    chosen = f"In {city}, look for {thing} on local listings and compare prices before you buy."
    rejected = f"Just buy {thing} anywhere; prices are the same everywhere."
    return {
        "id": f"ultrafeedback-{i}",
        "prompt": f"How do I find {thing} in {city}?",
        "chosen": chosen,
        "rejected": rejected,
        "response": chosen if i % 2 == 0 else rejected,
        "_good": ["compare prices"] if i % 2 == 0 else [],
        "_poor": [] if i % 2 == 0 else ["prices are the same everywhere"],
    }


_MAKERS = {"slf5k": _slf5k, "kodcode": _kodcode, "ultrafeedback": _ultrafeedback}


def make_records(dataset: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` records of ``dataset`` in its native field names (plus private ``_good``/``_poor`` quotes)."""
    if dataset not in _MAKERS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(DATASETS)}")
    rng = random.Random(seed)
    return [_MAKERS[dataset](i, rng) for i in range(n)]


def _annotation(dataset: str, rec: dict) -> dict:
    prompt, response = {
        "slf5k": (rec.get("post"), rec.get("summary")),
        "kodcode": (rec.get("question"), rec.get("solution")),
        "ultrafeedback": (rec.get("prompt"), rec.get("response")),
    }[dataset]
    good = [s for s in rec["_good"] if s in response]
    poor = [s for s in rec["_poor"] if s in response]
    critique = " ".join(
        [f"The response correctly says '{g}'." for g in good] + [f"'{p}' is wrong." for p in poor]
    ) or "The response is acceptable."
    return {
        "id": rec["id"],
        "prompt": prompt,
        "response": response,
        "critique": critique,
        "good_spans": good,
        "poor_spans": poor,
        "unmatched_spans": {"good": [], "poor": []},
        "source": "tiny-rule",
        "meta": {},
    }


def make_tiny_world(dataset: str, output_dir: str | Path, n_train: int = 24, n_eval: int = 8, seed: int = 0) -> Path:
    """Write the tiny model, data and annotations for ``dataset`` under ``output_dir`` (idempotent)."""
    from text2grad.core.data import write_jsonl
    from text2grad.core.modeling import build_tiny_llama, train_tokenizer

    out = Path(output_dir)
    done = out / ".complete"
    if done.exists() and json.loads(done.read_text()) == {"dataset": dataset, "seed": seed}:
        return out
    records = make_records(dataset, n_train + n_eval, seed)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in records]
    write_jsonl(out / "data" / "train.jsonl", public[:n_train])
    write_jsonl(out / "data" / "eval.jsonl", public[n_train:])
    write_jsonl(out / "annotations.jsonl", [_annotation(dataset, r) for r in records])
    corpus = [json.dumps(r) for r in records] + [
        '{"good_spans": [], "poor_spans": []} The summary is correct. The response is wrong.'
    ]
    tokenizer = train_tokenizer(corpus, vocab_size=600, kind="bpe")
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=seed)
    tokenizer.save_pretrained(out / "model")
    model.save_pretrained(out / "model")
    done.write_text(json.dumps({"dataset": dataset, "seed": seed}))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=DATASETS, help="which dataset's field layout to imitate")
    parser.add_argument("--output_dir", required=True, help="where to write model/, data/ and annotations.jsonl")
    parser.add_argument("--n_train", type=int, default=24, help="training records")
    parser.add_argument("--n_eval", type=int, default=8, help="evaluation records")
    parser.add_argument("--seed", type=int, default=0, help="random seed for data and weights")
    args = parser.parse_args(argv)
    out = make_tiny_world(args.dataset, args.output_dir, args.n_train, args.n_eval, args.seed)
    print(f"tiny {args.dataset} world in {out}: model/, data/train.jsonl, data/eval.jsonl, annotations.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
