"""Plain helpers shared by the reward-model tests (kept out of conftest.py so tests import them by a unique name)."""

from __future__ import annotations

import json
from pathlib import Path

from reward_model.serialization import PLAIN_TEMPLATE, target_text
from text2grad.core.feedback import Feedback

INSTRUCTION = "Critique the response, then list good and poor spans as JSON."

RECORDS = [
    {
        "id": "a",
        "prompt": "Summarize: Alex moved to Berlin for a job and loves the food.",
        "response": "Alex moved to Oslo for a job.",
        "critique": "The city is wrong: it is Berlin.",
        "good_spans": ["for a job"],
        "poor_spans": ["Oslo"],
    },
    {
        "id": "b",
        "prompt": "Write add(a, b) that returns the sum.",
        "response": "def add(a, b):\n    return a - b",
        "critique": "It subtracts instead of adding.",
        "good_spans": ["def add(a, b):"],
        "poor_spans": ["return a - b"],
    },
    {
        "id": "c",
        "prompt": "How do I find a bike in Lisbon?",
        "response": "Check local listings and compare prices.",
        "critique": "Useful and concrete advice.",
        "good_spans": ["compare prices"],
        "poor_spans": [],
    },
    {
        "id": "d",
        "prompt": "Summarize: Sam wants a dog but the landlord says no.",
        "response": "Sam wants a cat.",
        "critique": "The pet is wrong: it is a dog.",
        "good_spans": [],
        "poor_spans": ["a cat"],
    },
]


def corpus() -> list[str]:
    texts = []
    for r in RECORDS:
        texts.append(PLAIN_TEMPLATE.format(instruction=INSTRUCTION, prompt=r["prompt"], response=r["response"]))
        texts.append(target_text(Feedback.from_dict(r)))
    return texts * 10


def write_records(path: Path, records=RECORDS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def train_args(world: Path, out: Path, **overrides) -> list[str]:
    """Command-line flags for reward_model.train on the tiny world (overrides as --key value)."""
    args = {
        "model_name_or_path": str(world / "base"),
        "dataset_path": str(world / "train.jsonl"),
        "output_dir": str(out),
        "instruction": INSTRUCTION,
        "max_length": 128,
        "per_device_train_batch_size": 4,
        "learning_rate": 3e-3,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "logging_steps": 1,
        "save_steps": 1000,
        "progress_bar": False,
        "dtype": "fp32",
        "seed": 0,
    }
    args.update(overrides)
    flags = []
    for k, v in args.items():
        flags += [f"--{k}", str(v)]
    return flags
