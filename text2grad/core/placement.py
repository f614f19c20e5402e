"""Which device a process puts its models on, in a single process and under a distributed launcher.

A launcher (``accelerate launch``, ``torchrun``, ``deepspeed``) starts one process per GPU and tells each its
rank on the machine in ``LOCAL_RANK``. Every model a process builds (policy, reference, value model, generative
and scalar reward models) belongs on that process's own GPU, ``cuda:<LOCAL_RANK>``. A bare ``"cuda"`` means
"the current CUDA device", which is GPU 0 until someone calls ``torch.cuda.set_device``; models built before the
trainer's `accelerate.Accelerator` exists would all land on GPU 0. So model-loading code asks `process_device`
instead of writing ``"cuda"``.

`process_device` is a pure function of its arguments (the environment and whether CUDA is usable), so the
mapping is tested without a GPU; `set_device_resolver` lets a test or an unusual cluster layout replace it
(e.g. one reward-model GPU per node).

Layouts that cannot work are refused before any model loads, with a `PlacementError` (a `ConfigError`: every
command prints ``error: ...`` and exits 2) naming the numbers and the fix: more processes on a machine than it has
visible GPUs (`check_process_gpus`, which every trainer calls before its accelerator exists: accelerate would put
two ranks on one GPU and then crash in its first barrier with "invalid device ordinal"), a ``LOCAL_RANK`` beyond the
visible GPUs, and a ``cuda:N`` (or ``cuda`` without CUDA) that this process cannot see (`check_device`).

A vLLM engine is placed by `engine_placement`, also pure: each process's engine on that process's own GPU with the
configured share of it, or on a CPU machine a slice of the KV-cache budget (and of the CPU cores) per process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from text2grad.core.config import ConfigError

__all__ = [
    "EnginePlacement", "PlacementError", "check_device", "check_process_gpus", "engine_placement",
    "local_rank", "local_world_size", "misplaced", "process_device", "resolve_device",
    "set_device_resolver", "visible_gpus", "world_size",
]


class PlacementError(ConfigError):
    """Processes, ranks or devices that this machine's GPUs cannot serve; the message names the numbers and the fix."""


def local_rank(env: Mapping[str, str] | None = None) -> int | None:
    """This process's rank on its machine from ``LOCAL_RANK`` (set by every launcher), or None outside one."""
    value = (os.environ if env is None else env).get("LOCAL_RANK")
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"LOCAL_RANK must be an integer, got {value!r} (set by the launcher; unset it to run alone)") from None


def _process_count(name: str, value: str) -> int:
    """``value`` of the launcher's variable ``name`` as a process count (an integer >= 1), or a ValueError naming it."""
    try:
        size = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if size < 1:
        raise ValueError(f"{name} must be >= 1, got {size}")
    return size


def world_size(env: Mapping[str, str] | None = None) -> int:
    """The number of processes of this run, from ``WORLD_SIZE`` (1 outside a launcher)."""
    return _process_count("WORLD_SIZE", (os.environ if env is None else env).get("WORLD_SIZE") or "1")


def local_world_size(env: Mapping[str, str] | None = None) -> int:
    """The number of processes on this machine: ``LOCAL_WORLD_SIZE`` (torchrun, accelerate) or ``LOCAL_SIZE``
    (the DeepSpeed launcher); a launcher that sets neither is taken to run on one machine (``WORLD_SIZE``)."""
    env = os.environ if env is None else env
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        value = env.get(name)
        if value:
            return _process_count(name, value)
    return world_size(env)


def visible_gpus(env: Mapping[str, str] | None = None, cuda_available: bool | None = None,
                 cuda_device_count: int | None = None) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs), or
    ``["0", ..., "<count-1>"]`` when it is unset; empty without CUDA. Position i is what torch calls ``cuda:i``."""
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        return []
    count = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    listed = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [name.strip() for name in listed.split(",") if name.strip()][:count]


def _visible_description(env: Mapping[str, str] | None, count: int) -> str:
    listed = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    names = f"cuda:0..cuda:{count - 1}" if count > 1 else "cuda:0" if count == 1 else "none"
    return f"{count} visible GPU(s) ({names}; CUDA_VISIBLE_DEVICES={'unset' if listed is None else repr(listed)})"


def check_process_gpus(env: Mapping[str, str] | None = None, cuda_available: bool | None = None,
                       cuda_device_count: int | None = None) -> None:
    """Refuse a launch this machine's GPUs cannot serve: more processes on the machine (``LOCAL_WORLD_SIZE`` /
    ``LOCAL_SIZE``) than visible GPUs, or a ``LOCAL_RANK`` beyond them. Each process trains on a GPU of its own;
    accelerate would put two ranks on one GPU and crash in its first barrier ("invalid device ordinal").

    Nothing is checked without CUDA (processes on the CPU share its cores). ``env``, ``cuda_available`` and
    ``cuda_device_count`` default to the real ones, so a test gives the counts of any machine.

    Raises:
        PlacementError: naming the process count, the rank and the visible GPUs, and how to launch instead.
    """
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        return
    count = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    processes, rank = local_world_size(env), local_rank(env) or 0
    fix = (f"Launch at most {count} process(es) per machine (accelerate launch --num_processes {count}, torchrun "
           f"--nproc_per_node {count}, deepspeed --num_gpus {count}), make more GPUs visible to every process (the "
           "launcher gives each its own GPU by LOCAL_RANK), or hide the GPUs with CUDA_VISIBLE_DEVICES=\"\" to run "
           "every process on the CPU")
    if processes > count:
        raise PlacementError(f"{processes} processes on this machine but {_visible_description(env, count)}: "
                             f"each process needs a GPU of its own. {fix}")
    if rank >= count:
        raise PlacementError(f"LOCAL_RANK={rank} has no GPU of its own: this process sees "
                             f"{_visible_description(env, count)}. {fix}")


def check_device(device: str | torch.device, env: Mapping[str, str] | None = None, cuda_available: bool | None = None,
                 cuda_device_count: int | None = None) -> torch.device:
    """``device`` as a `torch.device` if this process can use it; a ``cuda`` without CUDA or a ``cuda:N`` beyond
    the visible GPUs raises `PlacementError` naming what is visible (the counts default to the real ones)."""
    try:
        placed = torch.device(device)
    except RuntimeError as exc:
        raise PlacementError(f"device {device!r} is not a torch device ({exc}); use cpu, cuda or cuda:<index>") from None
    if placed.type != "cuda":
        return placed
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        raise PlacementError(
            f"device {str(placed)!r} asked for, but CUDA is not available to this process (torch {torch.__version__}, "
            f"CUDA_VISIBLE_DEVICES={(os.environ if env is None else env).get('CUDA_VISIBLE_DEVICES', 'unset')!r}): "
            "use device cpu, or install a CUDA build of torch (README: On a GPU node)"
        )
    count = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    if placed.index is not None and placed.index >= count:
        raise PlacementError(
            f"device cuda:{placed.index} does not exist: this process sees {_visible_description(env, count)}. "
            "Pick one of those, or leave the device unset for this process's own GPU (cuda:<LOCAL_RANK>)"
        )
    return placed


def process_device(env: Mapping[str, str] | None = None, cuda_available: bool | None = None,
                   cuda_device_count: int | None = None) -> torch.device:
    """The device of this process's models: ``cuda:<LOCAL_RANK>`` under a launcher with CUDA, ``cuda:0`` in a
    single process with CUDA, else ``cpu``.

    ``env``, ``cuda_available`` and ``cuda_device_count`` default to the real environment. More processes on
    the machine than visible GPUs, or a local rank beyond them, raise `PlacementError` (`check_process_gpus`):
    the processes would share a GPU by accident.
    """
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        return torch.device("cpu")
    check_process_gpus(env, available, cuda_device_count)
    return torch.device("cuda", local_rank(env) or 0)


def misplaced(process: torch.device, placed: Mapping[str, torch.device | None]) -> list[str]:
    """``"<name> on <device>"`` for each model in ``placed`` that sits on another GPU than ``process``, the device
    this process trains on. On a multi-GPU node that usually means every rank's copy landed on one GPU. CPU
    placements, a bare ``cuda`` (the current device) and unknown ones (None) are not reported."""
    if process.type != "cuda":
        return []
    return [
        f"{name} on {device}" for name, device in placed.items()
        if device is not None and device.type == "cuda" and device.index is not None and device.index != process.index
    ]


_resolver: Callable[[], torch.device] = process_device


def set_device_resolver(resolver: Callable[[], torch.device] | None) -> None:
    """Replace how `resolve_device` picks a device (None restores `process_device`)."""
    global _resolver
    _resolver = resolver or process_device


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` if the caller chose one (checked by `check_device`: it must exist here), else this process's own
    device (`process_device`, or the resolver installed with `set_device_resolver`)."""
    if device is not None:
        return check_device(device)
    return _resolver()


# ---------------------------------------------------------------------------------------------------
# vLLM engines: one per process
# ---------------------------------------------------------------------------------------------------

_GIB = 1 << 30
# vLLM's CPU build runs the model eagerly here (enforce_eager) but still passes a few helpers through torch.compile,
# whose inductor backend builds C++ with g++. The one our requests reach ranks each sampled token's log-probability
# among the vocabulary's, an integer count that eager torch computes identically; with dynamo off an engine skips
# that build (cold on a fresh machine) and dynamo's tracing in every engine process. A value set in the environment
# is kept.
NO_COMPILE_ENV = "TORCHDYNAMO_DISABLE"


@dataclass(frozen=True)
class EnginePlacement:
    """Where one process's vLLM engine runs and how much memory it takes.

    Attributes:
        gpu_index: on a GPU machine, the engine's GPU as torch in this process numbers it (``cuda:<gpu_index>``,
            a position in ``CUDA_VISIBLE_DEVICES``); None on a CPU.
        physical_gpu: that GPU as ``CUDA_VISIBLE_DEVICES`` (or ``nvidia-smi``, when it is unset) names it.
        gpu_memory_utilization: the share of that GPU the engine takes (weights + KV cache); None: vLLM's default.
        cpu_kv_cache_bytes: on a CPU, this engine's KV cache in bytes; None on a GPU.
        cpu_cores: on a CPU, the cores this engine's threads are bound to (None: vLLM's own choice).
        pinned: True when several processes share the machine, so the engine must be told its GPU (a lone
            process's engine takes the first visible GPU, which is already its own).
    """

    gpu_index: int | None
    physical_gpu: str | None
    gpu_memory_utilization: float | None
    cpu_kv_cache_bytes: int | None
    cpu_cores: tuple[int, ...] | None
    pinned: bool

    def engine_kwargs(self) -> dict[str, Any]:
        """Arguments for `vllm.LLM` (vLLM 0.32: ``device_ids`` indexes ``CUDA_VISIBLE_DEVICES`` when it is set)."""
        kwargs: dict[str, Any] = {}
        if self.gpu_index is not None:
            if self.pinned:
                kwargs["device_ids"] = [self.gpu_index]
            if self.gpu_memory_utilization is not None:
                kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.cpu_kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.cpu_kv_cache_bytes
        return kwargs

    def environment(self) -> dict[str, str | None]:
        """Environment variables to hold while the engine starts (its processes inherit them); None removes one.
        vLLM's CPU build reads ``VLLM_CPU_KVCACHE_SPACE`` as whole GiB per engine and lets it override
        ``kv_cache_memory_bytes``, so it is removed while the engine starts (its value is already split here). On a
        CPU the engine also runs with torch.compile off (``NO_COMPILE_ENV``; see there why)."""
        if self.cpu_kv_cache_bytes is None:
            return {}
        env: dict[str, str | None] = {"VLLM_CPU_KVCACHE_SPACE": None, NO_COMPILE_ENV: os.environ.get(NO_COMPILE_ENV, "1")}
        if self.cpu_cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in self.cpu_cores)
        return env

    def describe(self) -> str:
        """One line for the log."""
        if self.gpu_index is None:
            cores = "vLLM's choice" if self.cpu_cores is None else ",".join(map(str, self.cpu_cores))
            return f"CPU, KV cache {self.cpu_kv_cache_bytes / _GIB:.3g} GiB, cores {cores}"
        share = "vLLM's default share" if self.gpu_memory_utilization is None else f"{self.gpu_memory_utilization:g} of it"
        return f"cuda:{self.gpu_index} (physical GPU {self.physical_gpu}), {share}"


def engine_placement(
    local_rank: int,
    local_world_size: int,
    visible_gpus: Sequence[str],
    gpu_memory_utilization: float | None,
    cpu_kv_cache_gb: float,
    cpu_cores: Sequence[int] = (),
) -> EnginePlacement:
    """Place the vLLM engine of the process with rank ``local_rank`` among ``local_world_size`` processes on
    this machine.

    On a GPU machine (``visible_gpus`` non-empty, as `visible_gpus` lists them) process k's engine goes on
    visible GPU k, the GPU its models train on (`process_device`), and takes ``gpu_memory_utilization`` of it. On a CPU machine
    the engines share ``cpu_kv_cache_gb`` GiB of KV cache evenly, and, when ``cpu_cores`` lists at least one core
    per process, process k's engine gets the k-th contiguous slice of them, so the engines do not all bind their
    threads to the same cores; a process alone gets all of them (vLLM's own binding would keep one core for its
    scheduler: half of a 2-core machine, where decoding then ran 1.55x slower).

    Raises ValueError naming the setting to change: a share outside (0, 1], a non-positive KV budget, a rank
    outside the machine's processes, or (`PlacementError`) more processes than visible GPUs.
    """
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is not one of this machine's {local_world_size} process(es) "
                         "(LOCAL_RANK / LOCAL_WORLD_SIZE as the launcher sets them)")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"the vLLM engine's GPU memory share (vllm_gpu_memory_utilization / gpu_memory_utilization) must be in "
            f"(0, 1], got {gpu_memory_utilization}: it is the fraction of its GPU each process's engine takes "
            "(weights + KV cache), e.g. 0.3, leaving the rest to the models that train on that GPU"
        )
    if visible_gpus:
        if local_world_size > len(visible_gpus):
            raise PlacementError(
                f"{local_world_size} processes on this machine but {len(visible_gpus)} visible GPUs "
                f"(CUDA_VISIBLE_DEVICES={','.join(visible_gpus)}): each process's vLLM engine needs a GPU of its own. "
                f"Launch at most {len(visible_gpus)} processes per machine (--num_processes / --nproc_per_node) or "
                "make more GPUs visible"
            )
        index = local_rank
        return EnginePlacement(index, visible_gpus[index], gpu_memory_utilization, None, None, local_world_size > 1)
    if not cpu_kv_cache_gb > 0:
        raise ValueError(f"the vLLM KV cache on a CPU (vllm_cpu_kv_cache_gb / VLLM_CPU_KVCACHE_SPACE) must be > 0 GiB, "
                         f"got {cpu_kv_cache_gb}")
    cores = None
    if cpu_cores and len(cpu_cores) >= local_world_size:
        ordered = sorted(cpu_cores)
        start, stop = (len(ordered) * local_rank) // local_world_size, (len(ordered) * (local_rank + 1)) // local_world_size
        cores = tuple(ordered[start:stop])
    return EnginePlacement(None, None, None, int(cpu_kv_cache_gb * _GIB) // local_world_size, cores, local_world_size > 1)
