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
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

import torch

__all__ = ["local_rank", "misplaced", "process_device", "resolve_device", "set_device_resolver", "world_size"]


def local_rank(env: Mapping[str, str] | None = None) -> int | None:
    """This process's rank on its machine from ``LOCAL_RANK`` (set by every launcher), or None outside one."""
    value = (os.environ if env is None else env).get("LOCAL_RANK")
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"LOCAL_RANK must be an integer, got {value!r} (set by the launcher; unset it to run alone)") from None


def world_size(env: Mapping[str, str] | None = None) -> int:
    """The number of processes of this run, from ``WORLD_SIZE`` (1 outside a launcher)."""
    value = (os.environ if env is None else env).get("WORLD_SIZE") or "1"
    try:
        size = int(value)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, got {value!r}") from None
    if size < 1:
        raise ValueError(f"WORLD_SIZE must be >= 1, got {size}")
    return size


def process_device(env: Mapping[str, str] | None = None, cuda_available: bool | None = None,
                   cuda_device_count: int | None = None) -> torch.device:
    """The device of this process's models: ``cuda:<LOCAL_RANK>`` under a launcher with CUDA, ``cuda:0`` in a
    single process with CUDA, else ``cpu``.

    ``env``, ``cuda_available`` and ``cuda_device_count`` default to the real environment. A process that sees
    exactly one GPU uses it (schedulers such as SLURM give each process its own ``CUDA_VISIBLE_DEVICES``). A
    local rank beyond the visible GPUs is an error: the processes would share a GPU by accident.
    """
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        return torch.device("cpu")
    rank = local_rank(env) or 0
    count = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    if count == 1:
        return torch.device("cuda", 0)
    if rank >= count:
        raise ValueError(
            f"local rank {rank} has no GPU of its own: this machine shows {count} GPU(s) "
            "(CUDA_VISIBLE_DEVICES). Launch at most one process per GPU (--num_processes / --nproc_per_node)."
        )
    return torch.device("cuda", rank)


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
    """``device`` if the caller chose one, else this process's own device (`process_device`, or the resolver
    installed with `set_device_resolver`)."""
    if device is not None:
        return torch.device(device)
    return _resolver()
