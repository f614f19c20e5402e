"""Offline fixtures for the reward-model tests: a tokenizer trained on the test data, a tiny Llama saved to
disk like a hub checkpoint, four annotation records, and (once per session) a reward model trained to
memorize them."""

from __future__ import annotations


import pytest
import torch

from tests.reward_model.rm_testlib import corpus, train_args, write_records

from reward_model.train import main
from text2grad.core.modeling import build_tiny_llama, train_tokenizer


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models train 10x faster on one thread than on two when the CPU is shared (no oversubscription)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def rm_tokenizer():
    return train_tokenizer(corpus(), vocab_size=400, kind="bpe")


@pytest.fixture(scope="session")
def rm_world(tmp_path_factory, rm_tokenizer):
    """A directory with ``base`` (tiny Llama + tokenizer, saved) and ``train.jsonl`` (the four records)."""
    root = tmp_path_factory.mktemp("rm_world")
    model = build_tiny_llama(rm_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=0)
    model.save_pretrained(root / "base")
    rm_tokenizer.save_pretrained(root / "base")
    write_records(root / "train.jsonl")
    return root


@pytest.fixture(scope="session")
def memorized_rm(rm_world):
    """A full fine-tune of the tiny Llama that reproduces the four targets under greedy decoding."""
    out = rm_world / "memorized"
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # session fixtures run outside the per-test one_torch_thread fixture
    try:
        rc = main(train_args(rm_world, out, use_lora=False, max_steps=80, learning_rate=1e-2))
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    return out
