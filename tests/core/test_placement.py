"""Which device each process's models go on (`text2grad.core.placement`), without a GPU."""

from __future__ import annotations

import os
import time

import pytest
import torch

from policy_optimization.train import main as ppo_main
from text2grad.core.cli import (
    EXIT_USAGE, guarded, hide_gpus_for_cpu_ranks, stale_extension_locks, warn_stale_extension_locks,
)
from text2grad.core.placement import (
    EnginePlacement, PlacementError, check_device, check_process_gpus, engine_placement, local_rank, local_world_size,
    misplaced, process_device, resolve_device, set_device_resolver, visible_gpus, world_size,
)
from text2grad.core.vllm_engine import place_engine

GIB = 1 << 30


@pytest.mark.parametrize(
    "env, available, count, expected",
    [
        ({}, False, 0, torch.device("cpu")),
        ({"LOCAL_RANK": "3"}, False, 0, torch.device("cpu")),  # CPU launches (gloo): every rank on the CPU
        ({}, True, 8, torch.device("cuda", 0)),  # one process: the first GPU, not "the current device"
        ({"LOCAL_RANK": "0"}, True, 8, torch.device("cuda", 0)),
        ({"LOCAL_RANK": "5"}, True, 8, torch.device("cuda", 5)),  # rank 5 of a node with 8 GPUs: its own GPU
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, True, 2, torch.device("cuda", 1)),
    ],
)
def test_process_device_maps_the_local_rank_to_its_own_gpu(env, available, count, expected):
    assert process_device(env, cuda_available=available, cuda_device_count=count) == expected


def test_a_rank_beyond_the_visible_gpus_is_refused():
    with pytest.raises(PlacementError, match=r"LOCAL_RANK=4 has no GPU of its own: this process sees 2 visible GPU\(s\) "
                                             r"\(cuda:0..cuda:1; CUDA_VISIBLE_DEVICES=unset\)"):
        process_device({"LOCAL_RANK": "4"}, cuda_available=True, cuda_device_count=2)
    with pytest.raises(PlacementError, match="LOCAL_RANK=5 has no GPU of its own"):  # one visible GPU per process:
        # accelerate's barrier would still address cuda:<LOCAL_RANK> and crash ("invalid device ordinal")
        process_device({"LOCAL_RANK": "5"}, cuda_available=True, cuda_device_count=1)


ONE_GPU_TWO_PROCESSES = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0"}


def test_more_processes_than_gpus_exit_2_naming_both_numbers_and_the_fix(capsys):
    expected = (r"2 processes on this machine but 1 visible GPU\(s\) \(cuda:0; CUDA_VISIBLE_DEVICES='0'\): each process "
                r"needs a GPU of its own. Launch at most 1 process\(es\) per machine \(accelerate launch --num_processes 1")
    for rank in ("0", "1"):  # every rank refuses, not only the one without a GPU
        with pytest.raises(PlacementError, match=expected):
            check_process_gpus({**ONE_GPU_TWO_PROCESSES, "LOCAL_RANK": rank}, cuda_available=True, cuda_device_count=1)
    with pytest.raises(PlacementError, match=r"8 processes on this machine but 4 visible GPU\(s\)"):
        check_process_gpus({"LOCAL_SIZE": "8", "LOCAL_RANK": "0"}, cuda_available=True, cuda_device_count=4)  # deepspeed
    assert guarded(lambda: check_process_gpus(ONE_GPU_TWO_PROCESSES, True, 1)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: 2 processes on this machine but 1 visible GPU(s)") and 'CUDA_VISIBLE_DEVICES=""' in err
    # what works is not refused: as many processes as GPUs, fewer, or CPU ranks (no CUDA visible)
    check_process_gpus({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, cuda_available=True, cuda_device_count=2)
    check_process_gpus({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, cuda_available=True, cuda_device_count=8)
    check_process_gpus(ONE_GPU_TWO_PROCESSES, cuda_available=False, cuda_device_count=0)


def test_the_ppo_command_on_a_one_gpu_node_with_two_processes_exits_2_before_loading_a_model(monkeypatch, tmp_path, capsys):
    for name, value in ONE_GPU_TWO_PROCESSES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code = ppo_main(["--model_name_or_path", str(tmp_path / "no-model"), "--dataset_path", str(tmp_path / "no.jsonl"),
                     "--output_dir", str(tmp_path / "out")])
    assert code == EXIT_USAGE
    assert "error: 2 processes on this machine but 1 visible GPU(s)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "env, changed, visible",
    [
        ({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "0,1"}, True, ""),  # what DeepSpeed's launcher writes
        ({"DS_ACCELERATOR": "cpu"}, True, ""),
        ({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}, False, ""),
        ({"DS_ACCELERATOR": "cuda", "CUDA_VISIBLE_DEVICES": "0,1"}, False, "0,1"),
        ({"CUDA_VISIBLE_DEVICES": "3"}, False, "3"),
    ],
)
def test_deepspeed_cpu_ranks_hide_the_gpus_the_launcher_listed(env, changed, visible):
    assert hide_gpus_for_cpu_ranks(env) is changed
    assert env.get("CUDA_VISIBLE_DEVICES", "3") == visible


def test_a_deepspeed_cpu_rank_on_a_gpu_node_is_not_refused_for_its_gpus(monkeypatch, tmp_path, capsys):
    # DeepSpeed's launcher with --num_gpus 2 and DS_ACCELERATOR=cpu on a one-GPU node: rank 1 must run on the CPU.
    for name, value in {**ONE_GPU_TWO_PROCESSES, "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1", "DS_ACCELERATOR": "cpu"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: os.environ["CUDA_VISIBLE_DEVICES"] != "")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if os.environ["CUDA_VISIBLE_DEVICES"] else 0)
    code = ppo_main(["--model_name_or_path", str(tmp_path / "no-model"), "--dataset_path", str(tmp_path / "no.jsonl"),
                     "--output_dir", str(tmp_path / "out"), "--num_iterations", "1"])
    err = capsys.readouterr().err
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert code == EXIT_USAGE and "no-model" in err and "visible GPU" not in err  # refused for its input, not its GPU


def _lock(path, age_s, now):
    path.parent.mkdir(parents=True)
    path.write_text("")
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_build_locks_a_killed_deepspeed_op_build_left_behind_are_named_with_their_fix(tmp_path, capsys):
    now = 1_000_000.0
    home = tmp_path / "home"
    killed = _lock(home / ".cache" / "torch_extensions" / "py311_cpu" / "deepspeed_shm_comm" / "lock", 3600, now)
    _lock(home / ".cache" / "torch_extensions" / "py311_cpu" / "building_now" / "lock", 20, now)  # a build in progress
    older = _lock(home / ".cache" / "torch_extensions" / "py311_cu128" / "fused_adam" / "lock", 7200, now)
    assert stale_extension_locks({"HOME": str(home)}, now) == [(older, 7200), (killed, 3600)]
    # TORCH_EXTENSIONS_DIR holds the ops directly; XDG_CACHE_HOME moves the default
    own = _lock(tmp_path / "ext" / "deepspeed_shm_comm" / "lock", 900, now)
    assert stale_extension_locks({"HOME": str(home), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}, now) == [(own, 900)]
    assert stale_extension_locks({"XDG_CACHE_HOME": str(home / ".cache")}, now)[0][0] == older

    deepspeed_cpu = {"HOME": str(home), "DS_ACCELERATOR": "cpu", "LOCAL_RANK": "0"}
    assert warn_stale_extension_locks(deepspeed_cpu, now) == [older, killed]
    err = capsys.readouterr().err
    assert f"warning: {killed} is 60 minutes old" in err and f"rm {killed}" in err and "building_now" not in err
    assert warn_stale_extension_locks({**deepspeed_cpu, "LOCAL_RANK": "1"}, now) == []  # one warning per machine
    assert warn_stale_extension_locks({"HOME": str(home), "ACCELERATE_USE_DEEPSPEED": "true"}, now) == [older, killed]
    assert warn_stale_extension_locks({"HOME": str(home)}, now) == []  # no DeepSpeed, no op build to wait on
    capsys.readouterr()


def test_a_deepspeed_command_warns_about_a_stale_build_lock_before_it_starts(monkeypatch, tmp_path, capsys):
    lock = _lock(tmp_path / "ext" / "deepspeed_shm_comm" / "lock", 3600, time.time())
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code = ppo_main(["--model_name_or_path", str(tmp_path / "no-model"), "--dataset_path", str(tmp_path / "no.jsonl"),
                     "--output_dir", str(tmp_path / "out"), "--num_iterations", "1"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and f"warning: {lock} is 60 minutes old" in err and "no-model" in err
    assert lock.exists()  # only named: it may belong to a build that is still running


@pytest.mark.parametrize(
    "device, available, count, message",
    [
        ("cuda:1", True, 1, r"device cuda:1 does not exist: this process sees 1 visible GPU\(s\) \(cuda:0;"),
        ("cuda:8", True, 8, r"device cuda:8 does not exist: this process sees 8 visible GPU\(s\) \(cuda:0..cuda:7;"),
        ("cuda", False, 0, r"device 'cuda' asked for, but CUDA is not available to this process"),
        ("cuda:0", False, 0, r"device 'cuda:0' asked for, but CUDA is not available .* use device cpu"),
        ("gpu0", True, 1, r"device 'gpu0' is not a torch device"),
    ],
)
def test_a_device_this_process_cannot_see_is_refused(device, available, count, message):
    with pytest.raises(PlacementError, match=message):
        check_device(device, {}, cuda_available=available, cuda_device_count=count)


def test_a_device_that_exists_is_returned():
    assert check_device("cuda:7", {}, cuda_available=True, cuda_device_count=8) == torch.device("cuda", 7)
    assert check_device("cuda", {}, cuda_available=True, cuda_device_count=1) == torch.device("cuda")
    assert check_device("cpu", {}, cuda_available=False, cuda_device_count=0) == torch.device("cpu")


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


# ---- vLLM engines: one per process ----------------------------------------------------------------


def test_the_launcher_environment_gives_the_processes_per_machine_and_the_visible_gpus():
    assert local_world_size({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16"}) == 8  # torchrun / accelerate
    assert local_world_size({"LOCAL_SIZE": "4", "WORLD_SIZE": "8"}) == 4  # the DeepSpeed launcher
    assert local_world_size({"WORLD_SIZE": "2"}) == 2 and local_world_size({}) == 1
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be >= 1"):
        local_world_size({"LOCAL_WORLD_SIZE": "0"})
    with pytest.raises(ValueError, match="LOCAL_SIZE must be an integer, got 'two'"):
        local_world_size({"LOCAL_SIZE": "two"})
    with pytest.raises(ValueError, match="WORLD_SIZE must be an integer, got '2.5'"):
        world_size({"WORLD_SIZE": "2.5"})
    assert visible_gpus({}, cuda_available=False, cuda_device_count=0) == []
    assert visible_gpus({}, cuda_available=True, cuda_device_count=3) == ["0", "1", "2"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4, 5,6,7"}, cuda_available=True, cuda_device_count=4) == ["4", "5", "6", "7"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, cuda_available=True, cuda_device_count=2) == ["GPU-aa", "GPU-bb"]


@pytest.mark.parametrize(
    "rank, processes, gpus, index, physical",
    [
        (3, 4, ["4", "5", "6", "7"], 3, "7"),  # rank 3 of 4 with CUDA_VISIBLE_DEVICES=4,5,6,7: physical GPU 7
        (0, 8, [str(i) for i in range(8)], 0, "0"),
        (5, 8, [str(i) for i in range(8)], 5, "5"),  # the GPU its models train on (process_device: cuda:5)
        (2, 4, [str(i) for i in range(8)], 2, "2"),  # fewer processes than GPUs: the first ones
        (1, 2, ["GPU-a", "MIG-b"], 1, "MIG-b"),  # UUIDs as CUDA_VISIBLE_DEVICES names them
    ],
)
def test_each_process_engine_goes_on_its_own_gpu_with_the_configured_share(rank, processes, gpus, index, physical):
    placed = engine_placement(rank, processes, gpus, 0.3, cpu_kv_cache_gb=4.0)
    assert placed == EnginePlacement(index, physical, 0.3, None, None, pinned=True)
    # vLLM 0.32's device_ids counts within CUDA_VISIBLE_DEVICES, as torch's cuda:<index> does
    assert placed.engine_kwargs() == {"device_ids": [index], "gpu_memory_utilization": 0.3}
    assert placed.environment() == {}  # nothing changes the training process's environment on a GPU
    assert placed.describe() == f"cuda:{index} (physical GPU {physical}), 0.3 of it"


def test_a_lone_process_engine_keeps_vllms_own_gpu_choice():
    placed = engine_placement(0, 1, ["0", "1"], None, cpu_kv_cache_gb=1.0)
    assert (placed.gpu_index, placed.pinned) == (0, False)
    assert placed.engine_kwargs() == {}  # vLLM's first visible GPU and its default share, as before launchers


@pytest.mark.parametrize(
    "rank, processes, cores, budget, kv_bytes, bound",
    [
        (0, 1, [0, 1], 1.0, GIB, (0, 1)),  # one process: the whole budget and every core (no core kept back)
        (0, 1, [], 1.0, GIB, None),  # cores unknown: vLLM binds its threads itself
        (1, 2, [0, 1], 1.0, GIB // 2, (1,)),  # two engines share 1 GiB and the two cores
        (0, 2, [0, 1], 1.0, GIB // 2, (0,)),
        (2, 3, list(range(8)), 3.0, GIB, (5, 6, 7)),  # 8 cores over 3 processes: 2, 3 and 3
        (0, 3, list(range(8)), 3.0, GIB, (0, 1)),
        (1, 4, [0, 1], 2.0, GIB // 2, None),  # fewer cores than engines: vLLM's own binding
        (1, 2, [6, 2, 4, 8], 0.5, GIB // 4, (6, 8)),  # the affinity set in order
    ],
)
def test_cpu_engines_split_the_kv_cache_budget_and_the_cores(rank, processes, cores, budget, kv_bytes, bound, monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    placed = engine_placement(rank, processes, [], None, budget, cores)
    assert placed == EnginePlacement(None, None, None, kv_bytes, bound, pinned=processes > 1)
    assert placed.engine_kwargs() == {"kv_cache_memory_bytes": kv_bytes}
    # whole GiB per engine in vLLM's CPU build: split here instead; and no torch.compile in the engine
    expected_env = {"VLLM_CPU_KVCACHE_SPACE": None, "TORCHDYNAMO_DISABLE": "1"}
    if bound is not None:
        expected_env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, bound))
    assert placed.environment() == expected_env


def test_a_cpu_engine_keeps_a_torch_compile_switch_the_user_set(monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")
    assert engine_placement(0, 1, [], None, 1.0, [0]).environment()["TORCHDYNAMO_DISABLE"] == "0"


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 2, ["0"], 0.0, 1.0), r"memory share .* must be in \(0, 1\], got 0.0"),
        ((0, 2, ["0"], 1.5, 1.0), r"must be in \(0, 1\], got 1.5: it is the fraction of its GPU"),
        ((0, 2, [], -0.1, 1.0), r"must be in \(0, 1\], got -0.1"),
        ((3, 8, ["4", "5", "6", "7"], 0.3, 1.0),
         r"8 processes on this machine but 4 visible GPUs \(CUDA_VISIBLE_DEVICES=4,5,6,7\).*Launch at most 4 processes"),
        ((1, 2, ["GPU-a"], 0.3, 1.0), r"2 processes on this machine but 1 visible GPUs .*Launch at most 1 processes"),
        ((2, 2, ["0", "1"], 0.3, 1.0), r"local rank 2 is not one of this machine's 2 process"),
        ((0, 2, [], None, 0.0), r"KV cache on a CPU .* must be > 0 GiB, got 0.0"),
    ],
)
def test_bad_engine_placements_are_refused_saying_what_to_change(args, message):
    with pytest.raises(ValueError, match=message):
        engine_placement(*args)


def test_this_process_engine_is_placed_from_the_launcher_environment(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert place_engine(0.4, 1.0) == EnginePlacement(1, "1", 0.4, None, None, pinned=True)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # the user's budget for the machine wins over the config's
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert place_engine(None, 1.0) == EnginePlacement(None, None, None, 3 * GIB // 2, (2, 3), pinned=True)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|2-3")  # the user's own binding is left to vLLM
    assert place_engine(None, 1.0).cpu_cores is None
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "lots")
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE must be a number of GiB, got 'lots'"):
        place_engine(None, 1.0)
