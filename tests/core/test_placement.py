"""Which device each process's models go on (`text2grad.core.placement`), without a GPU."""

from __future__ import annotations

import pytest
import torch

from text2grad.core.placement import (
    local_rank, misplaced, process_device, resolve_device, set_device_resolver, world_size,
)


@pytest.mark.parametrize(
    "env, available, count, expected",
    [
        ({}, False, 0, torch.device("cpu")),
        ({"LOCAL_RANK": "3"}, False, 0, torch.device("cpu")),  # CPU launches (gloo): every rank on the CPU
        ({}, True, 8, torch.device("cuda", 0)),  # one process: the first GPU, not "the current device"
        ({"LOCAL_RANK": "0"}, True, 8, torch.device("cuda", 0)),
        ({"LOCAL_RANK": "5"}, True, 8, torch.device("cuda", 5)),  # rank 5 of a node with 8 GPUs: its own GPU
        ({"LOCAL_RANK": "5"}, True, 1, torch.device("cuda", 0)),  # a scheduler gave each process one visible GPU
    ],
)
def test_process_device_maps_the_local_rank_to_its_own_gpu(env, available, count, expected):
    assert process_device(env, cuda_available=available, cuda_device_count=count) == expected


def test_a_rank_beyond_the_visible_gpus_is_refused():
    with pytest.raises(ValueError, match="local rank 4 has no GPU of its own: this machine shows 2 GPU"):
        process_device({"LOCAL_RANK": "4"}, cuda_available=True, cuda_device_count=2)


def test_ranks_and_world_size_from_the_launcher_environment():
    assert local_rank({}) is None and local_rank({"LOCAL_RANK": "1"}) == 1
    assert world_size({}) == 1 and world_size({"WORLD_SIZE": "16"}) == 16
    with pytest.raises(ValueError, match="LOCAL_RANK must be an integer"):
        local_rank({"LOCAL_RANK": "one"})
    with pytest.raises(ValueError, match="WORLD_SIZE must be >= 1"):
        world_size({"WORLD_SIZE": "0"})


def test_an_explicit_device_wins_and_the_resolver_can_be_replaced():
    assert resolve_device("cpu") == torch.device("cpu")
    set_device_resolver(lambda: torch.device("cpu", 7))
    try:
        assert resolve_device() == torch.device("cpu", 7)
        assert resolve_device("cpu") == torch.device("cpu")
    finally:
        set_device_resolver(None)
    assert resolve_device() == process_device()


def test_models_on_another_gpu_than_the_process_are_named():
    rank3 = torch.device("cuda", 3)
    placed = {"critic": torch.device("cuda", 0), "scorer": torch.device("cuda", 3), "cpu model": torch.device("cpu"),
              "current device": torch.device("cuda"), "vLLM": None}
    assert misplaced(rank3, placed) == ["critic on cuda:0"]
    assert misplaced(torch.device("cpu"), placed) == []  # a CPU run has no GPU to be wrong about
