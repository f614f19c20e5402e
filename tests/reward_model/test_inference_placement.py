"""Where a process's generative reward model goes under a launcher (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from reward_model.inference import GenerativeRewardModel
from text2grad.core.modeling import build_tiny_llama
from text2grad.core.placement import set_device_resolver


@pytest.fixture
def saved_model(bpe_tokenizer, tmp_path):
    build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(tmp_path)
    bpe_tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_each_process_loads_its_reward_model_onto_its_own_device(saved_model, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    set_device_resolver(lambda: torch.device("cpu", 1))  # stands in for cuda:1 on a GPU node
    try:
        rm = GenerativeRewardModel.from_critic_kwargs(path=str(saved_model), max_new_tokens=4)
    finally:
        set_device_resolver(None)
    assert rm.device == torch.device("cpu", 1)
    assert GenerativeRewardModel.from_critic_kwargs(path=str(saved_model), device="cpu").device == torch.device("cpu")


def test_the_vllm_backend_starts_this_processes_own_engine_under_a_launcher(saved_model, monkeypatch):
    """Rank 1 of 2 on a GPU node asks for its own engine with its memory share; the engine places itself on the
    rank's GPU (`text2grad.core.vllm_engine.place_engine`, tested in tests/core/test_placement.py)."""
    asked = {}

    class Engine:
        def generate(self, *args, **kwargs):
            return []

    def fake_shared_engine(model, **kwargs):
        asked.update(model=model, **kwargs)
        return Engine()

    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1", "RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("reward_model.inference.shared_engine", fake_shared_engine)
    rm = GenerativeRewardModel.from_pretrained(str(saved_model), backend="vllm",
                                               vllm_kwargs={"gpu_memory_utilization": 0.25})
    assert rm.backend == "vllm" and asked["model"] == str(saved_model) and asked["gpu_memory_utilization"] == 0.25
