"""Offline fixtures for the reward-model tests: a tokenizer trained on the test data, a tiny Llama saved to
disk like a hub checkpoint, four annotation records, and (once per session) a reward model trained to
memorize them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    from reward_model.serialization import PLAIN_TEMPLATE, target_text
    from text2grad.feedback import Feedback

    texts = []
    for r in RECORDS:
        texts.append(PLAIN_TEMPLATE.format(instruction=INSTRUCTION, prompt=r["prompt"], response=r["response"]))
        texts.append(target_text(Feedback.from_dict(r)))
    return texts * 10


def write_records(path: Path, records=RECORDS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models train 10x faster on one thread than on two when the CPU is shared (no oversubscription)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def rm_tokenizer():
    from text2grad.modeling import train_tokenizer

    return train_tokenizer(corpus(), vocab_size=400, kind="bpe")


@pytest.fixture(scope="session")
def rm_world(tmp_path_factory, rm_tokenizer):
    """A directory with ``base`` (tiny Llama + tokenizer, saved) and ``train.jsonl`` (the four records)."""
    from text2grad.modeling import build_tiny_llama

    root = tmp_path_factory.mktemp("rm_world")
    model = build_tiny_llama(rm_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=0)
    model.save_pretrained(root / "base")
    rm_tokenizer.save_pretrained(root / "base")
    write_records(root / "train.jsonl")
    return root


def train_args(world: Path, out: Path, **overrides) -> list[str]:
    """Command-line flags for reward_model.train on the tiny world (overrides as --key value)."""
    args = {
        "model_name_or_path": str(world / "base"),
        "train_file": str(world / "train.jsonl"),
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
        "disable_tqdm": True,
        "dtype": "fp32",
        "seed": 0,
    }
    args.update(overrides)
    flags = []
    for k, v in args.items():
        flags += [f"--{k}", str(v)]
    return flags


@pytest.fixture(scope="session")
def memorized_rm(rm_world):
    """A full fine-tune of the tiny Llama that reproduces the four targets under greedy decoding."""
    import torch

    from reward_model.train import main

    out = rm_world / "memorized"
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # session fixtures run outside the per-test one_torch_thread fixture
    try:
        rc = main(train_args(rm_world, out, use_lora=False, max_steps=80, learning_rate=1e-2))
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    return out
