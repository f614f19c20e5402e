"""Shared offline fixtures: tokenizers trained on the fly and tiny Llama models built from a config."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest
import torch

from text2grad.core.modeling import build_tiny_llama, train_tokenizer  # after the offline switches above
from tests.critic_server import critic_server  # noqa: F401  (the session's vLLM server fixture)

torch.set_num_threads(min(2, torch.get_num_threads()))

CORPUS = [
    "The author wrote a 200 page unpublished novel and is looking for a good editor.",
    "My roommate keeps eating my food; I asked her to stop but she didn't listen.",
    "def add(a, b):\n    return a + b\n",
    "The café’s owner — a first-time author — said “hello” to everyone.",
    "Summary: a student wants advice about moving to Berlin for a job in software.",
    "Good spans: clear and concise. Poor spans: missing the key fact about the deadline.",
    "Emoji test 🙂 and accents: naïve résumé façade, Straße, 東京.",
] * 20


@pytest.fixture(scope="session", autouse=True)
def stop_the_vllm_engine_at_the_end():
    """The vLLM tests share one engine for the whole session (tests/vllm_testlib.py); stop it while pytest still
    owns the output streams (at interpreter exit its shutdown messages would hit closed files)."""
    yield
    engine_module = sys.modules.get("text2grad.core.vllm_engine")
    if engine_module is not None:
        engine_module.close_shared_engine()


@pytest.fixture(scope="session")
def bpe_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=400, kind="bpe")


@pytest.fixture(scope="session")
def unigram_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300, kind="unigram")


@pytest.fixture(params=["bpe", "unigram"])
def any_tokenizer(request, bpe_tokenizer, unigram_tokenizer):
    return bpe_tokenizer if request.param == "bpe" else unigram_tokenizer


@pytest.fixture
def tiny_llama(bpe_tokenizer):
    return build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2)
