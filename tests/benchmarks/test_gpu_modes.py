"""The GPU modes of the benchmarks, their CPU-side logic: a GPU asked for where there is none exits 2 saying so, and
the overhead benchmark's two modes score the same sampled responses."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks import ppo_token_level_overhead as overhead  # noqa: E402
from benchmarks import value_memory, vllm_generation  # noqa: E402


@pytest.mark.parametrize("module, argv", [
    (overhead, ["--preset", "gpu-1b"]),
    (overhead, ["--device", "cuda"]),
    (value_memory, ["--preset", "gpu-1b"]),
    (vllm_generation, ["--device", "cuda"]),
])
def test_a_gpu_mode_without_a_gpu_exits_2_saying_so(module, argv, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what torch says on a machine without a GPU
    monkeypatch.setattr(sys, "argv", [module.__file__, *argv])
    try:
        code = module.main()
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert "error: --device cuda, but torch" in err and "sees no CUDA GPU" in err


class FakeTrainer:
    def __init__(self):
        self.sampled = []

    def _generate(self, prompts):
        self.sampled.append(list(prompts))
        return [f"response to {p} #{len(self.sampled)}" for p in prompts]


def test_the_second_mode_replays_the_first_modes_generations():
    a, b = FakeTrainer(), FakeTrainer()
    counts = overhead.share_responses({"nl_gradient": a, "scalar": b})
    first = a._generate(["p1", "p2"])
    assert b._generate(["p1", "p2"]) == first and b.sampled == []  # the same responses, not sampled again
    second = b._generate(["p3"])  # the order alternates: now the other mode samples
    assert a._generate(["p3"]) == second and a.sampled == [["p1", "p2"]]
    assert b._generate(["p4"]) != a._generate(["p5"])  # different prompts: each samples its own
    assert counts == {"shared": 2, "alone": 0, "sampled": 4}


def test_one_mode_alone_samples_every_batch():
    solo = FakeTrainer()
    counts = overhead.share_responses({"scalar": solo})
    solo._generate(["p1"])
    solo._generate(["p1"])
    assert solo.sampled == [["p1"], ["p1"]] and counts == {"shared": 0, "alone": 2, "sampled": 2}


def test_the_gpu_preset_is_a_one_gpu_bf16_run_of_about_a_billion_parameters():
    preset = overhead.PRESETS["gpu-1b"]
    assert (preset["device"], preset["precision"], preset["clock"]) == ("cuda", "bf16", "wall")
    config = LlamaConfig(vocab_size=512, hidden_size=preset["hidden"], num_hidden_layers=preset["layers"],
                         num_attention_heads=preset["heads"], intermediate_size=4 * preset["hidden"])
    with torch.device("meta"):  # counted without allocating: build_tiny_llama's shape at the preset's sizes
        parameters = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert 0.8e9 < parameters < 1.3e9, parameters
