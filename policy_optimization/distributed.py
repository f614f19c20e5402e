"""How the PPO trainer's models meet `accelerate` and DeepSpeed: the accelerator, the LoRA wrap, the frozen
reference model (partitioned by an inference engine under ZeRO-3), the policy gathered for generation, and the
statistics taken over every process (whitening, explained variance, metric means, stop flags).

Kept apart from `policy_optimization.trainer` so the PPO step there reads top to bottom without the
device plumbing.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import uuid
from pathlib import Path
from typing import Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, broadcast_object_list
from peft import LoraConfig, PeftModel, get_peft_model
from trl.models.utils import add_hooks, remove_hooks

from policy_optimization.ppo_config import PPOConfig
from text2grad.core.placement import check_process_gpus
from text2grad.core.ppo_math import (
    explained_variance,
    explained_variance_from_moments,
    masked_moments,
    masked_whiten,
    whiten_with_moments,
)

__all__ = [
    "is_peft", "wrap_lora", "make_accelerator", "prepare_reference", "policy_for_generation", "policy_for_saving",
    "save_policy_and_value", "check_shared_directory", "any_process", "mean_over_processes", "batch_whiten",
    "batch_explained_variance",
]


def is_peft(model) -> bool:
    """Whether ``model`` is a peft ``PeftModel``."""
    return isinstance(model, PeftModel)


def wrap_lora(policy, config: PPOConfig):
    """``policy`` with a fresh LoRA adapter of the config's rank, alpha, dropout and target modules."""
    targets = config.lora_target_modules
    target_modules = "all-linear" if list(targets) == ["all-linear"] else list(targets)
    lora = LoraConfig(
        r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
        target_modules=target_modules, task_type="CAUSAL_LM", bias="none",
    )
    return get_peft_model(policy, lora)


def make_accelerator(config: PPOConfig):
    """An `accelerate.Accelerator` for the config (trackers, gloo for DeepSpeed on CPU). A launch with more
    processes than visible GPUs is refused first (`check_process_gpus`)."""
    check_process_gpus()
    if config.report_to != "none":
        needed = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}[config.report_to]
        if not any(importlib.util.find_spec(name) for name in needed):
            raise ValueError(
                f"report_to={config.report_to!r} needs the {needed[0]} package: pip install {needed[0]} "
                "(or pip install 'text2grad[tensorboard]' / 'text2grad[wandb]'); metrics.jsonl is always written"
            )
    handlers = []
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and not torch.cuda.is_available():
        # accelerate picks no process-group backend for DeepSpeed without a GPU; gloo makes CPU runs work.
        handlers.append(InitProcessGroupKwargs(backend="gloo"))
    acc = Accelerator(
        log_with=None if config.report_to == "none" else config.report_to,
        project_dir=config.output_dir,
        step_scheduler_with_optimizer=False,
        kwargs_handlers=handlers,
    )
    acc.gradient_accumulation_steps = config.gradient_accumulation_steps
    return acc


def prepare_reference(ref_policy, accelerator, zero_stage: int):
    """A frozen reference model on the right device; under ZeRO-3 partitioned by an inference engine."""
    ref_policy.eval()
    for p in ref_policy.parameters():
        p.requires_grad_(False)
    if zero_stage == 3:
        import deepspeed

        ds = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
        ds.pop("optimizer", None)
        ds.pop("scheduler", None)
        engine, *_ = deepspeed.initialize(model=ref_policy, config=ds)
        engine.eval()
        return engine
    return ref_policy.to(accelerator.device)


@contextlib.contextmanager
def policy_for_saving(model, accelerator, zero_stage: int, adapter_only: bool) -> Iterator[torch.nn.Module]:
    """The unwrapped policy of the prepared `PolicyAndValue` with whole weights, for ``save_pretrained`` by every
    process (e.g. into its own vLLM engine). Under ZeRO-3 each process holds a shard of every weight, so the
    weights are gathered for the duration: only the trainable ones with ``adapter_only`` (a LoRA adapter, a few
    MB), else all of them. Must be entered by every process at once under ZeRO-3."""
    policy = accelerator.unwrap_model(model).policy
    if zero_stage != 3:
        yield policy
        return
    import deepspeed

    params = [p for p in policy.parameters() if p.requires_grad] if adapter_only else list(policy.parameters())
    with deepspeed.zero.GatheredParameters(params):
        yield policy


@contextlib.contextmanager
def policy_for_generation(model, accelerator, zero_stage: int, gather: bool = True) -> Iterator[torch.nn.Module]:
    """The unwrapped policy of the prepared `PolicyAndValue`; under ZeRO-3 with ``gather`` its partitioned weights
    are gathered for the duration (and the ZeRO hooks removed, so generation does not re-gather per layer). Without
    ``gather`` the ZeRO-3 hooks fetch each layer's weights as generation reaches it: no process ever holds the whole
    policy, and every process must keep stepping until all have finished (``generate(..., synced_gpus=True)``)."""
    policy = accelerator.unwrap_model(model).policy
    if zero_stage != 3 or not gather:
        yield policy
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(policy.parameters())):
        remove_hooks(model)
        try:
            yield policy
        finally:
            add_hooks(model)


def check_shared_directory(accelerator, directory: Path) -> None:
    """Stop every process with a clear error if ``directory`` is not one directory that all processes see (a
    multi-machine run whose output_dir is on each machine's local disk). Checkpoints are written collectively
    (DeepSpeed: one shard per process) and every process reads them back on resume, so output_dir must be shared.
    Must be called on every process."""
    if accelerator.num_processes == 1:
        return
    token = [uuid.uuid4().hex if accelerator.is_main_process else ""]
    broadcast_object_list(token, from_process=0)
    marker = directory / f".text2grad-shared-check-{token[0]}"
    if accelerator.is_main_process:
        directory.mkdir(parents=True, exist_ok=True)
        marker.write_text(token[0])
    accelerator.wait_for_everyone()
    blind = accelerator.reduce(torch.tensor([0.0 if marker.is_file() else 1.0], device=accelerator.device), "sum")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        marker.unlink(missing_ok=True)
    if float(blind) > 0:
        raise RuntimeError(
            f"output_dir {directory} is not shared between the processes: {int(blind)} of {accelerator.num_processes} "
            "cannot see a file the main process just wrote there. Put output_dir on a filesystem that every machine "
            "mounts at the same path (NFS, Lustre, ...): checkpoints are written by every process and read back by "
            "every process on resume."
        )


def save_policy_and_value(accelerator, model, tokenizer, out: Path, adapter_base: str | None) -> None:
    """Write ``out/policy`` (LoRA adapter, or full model) with the tokenizer, and ``out/value_model``, from the
    prepared `PolicyAndValue` ``model``. ``adapter_base`` is recorded as the adapter's base model. Must be called
    on every process (ZeRO-3 gathers the weights)."""
    state = accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        accelerator.wait_for_everyone()
        return
    unwrapped = accelerator.unwrap_model(model)
    policy_state = {k[len("policy."):]: v for k, v in state.items() if k.startswith("policy.")}
    value_state = {k[len("value_model."):]: v for k, v in state.items() if k.startswith("value_model.")}
    policy = unwrapped.policy
    if adapter_base:
        for peft_config in policy.peft_config.values():
            peft_config.base_model_name_or_path = str(adapter_base)
    policy.save_pretrained(out / "policy", state_dict=policy_state)
    tokenizer.save_pretrained(out / "policy")
    unwrapped.value_model.save_pretrained(out / "value_model", state_dict=value_state)
    accelerator.wait_for_everyone()


# -------------------------------------------------------------------------------------------------
# Statistics over every process: what one process computes, reduced so all of them agree
# -------------------------------------------------------------------------------------------------

def any_process(accelerator, flag: bool) -> bool:
    """Whether ``flag`` is true on at least one process (every process gets the same answer)."""
    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return float(accelerator.reduce(t, "sum")) > 0


def mean_over_processes(accelerator, stats: dict[str, float], sums: frozenset[str] = frozenset()) -> dict[str, float]:
    """``stats`` averaged over the processes; the keys in ``sums`` are summed instead."""
    if accelerator.num_processes == 1:
        return dict(stats)
    keys = sorted(stats)
    t = accelerator.reduce(torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=accelerator.device), "sum")
    return {k: float(v) if k in sums else float(v) / accelerator.num_processes for k, v in zip(keys, t.tolist())}


def batch_whiten(accelerator, x: torch.Tensor, mask: torch.Tensor, scope: str, shift_mean: bool = True) -> torch.Tensor:
    """`masked_whiten` of ``x`` [B, T] under ``mask`` [B, T], with the moments of the whole global batch (``scope``
    "global": the processes' moments are summed) or of this process's share ("process")."""
    if scope == "process" or accelerator.num_processes == 1:
        return masked_whiten(x, mask, shift_mean=shift_mean)
    return whiten_with_moments(x, mask, accelerator.reduce(masked_moments(x, mask), "sum"), shift_mean=shift_mean)


def batch_explained_variance(accelerator, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                             scope: str) -> float:
    """`explained_variance` of ``values`` against ``returns`` (both [B, T] under ``mask``) over the global batch
    (``scope`` "global") or the mean of the processes' own ("process")."""
    if accelerator.num_processes == 1:
        return float(explained_variance(values, returns, mask))
    if scope == "process":
        return mean_over_processes(accelerator, {"ev": float(explained_variance(values, returns, mask))})["ev"]
    moments = accelerator.reduce(torch.stack([masked_moments(returns, mask), masked_moments(returns - values, mask)]), "sum")
    return explained_variance_from_moments(moments[0], moments[1])
