"""Fixtures for the evaluation tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


class UnigramLM(torch.nn.Module):
    """Ignores the context: every position predicts softmax(weights). Log-probs are computable by hand."""

    def __init__(self, vocab_size: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weights = torch.nn.Parameter(torch.randn(vocab_size, generator=g))
        self.calls: list[dict] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0):
        self.calls.append({"shape": tuple(input_ids.shape), "logits_to_keep": logits_to_keep})
        logits = self.weights.expand(*input_ids.shape, -1)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)


@pytest.fixture
def unigram_lm():
    """A factory for `UnigramLM` (context-free LM whose log-probs a test can compute by hand)."""
    return UnigramLM


@pytest.fixture
def saved_policy(tmp_path, bpe_tokenizer, tiny_llama):
    """The tiny Llama and its tokenizer saved as a policy directory, as the evaluation CLIs load one."""
    path = tmp_path / "policy"
    tiny_llama.save_pretrained(path)
    bpe_tokenizer.save_pretrained(path)
    return path
