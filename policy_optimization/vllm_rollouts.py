"""PPO rollouts sampled by a vLLM engine that holds the current policy (``--generation_backend vllm``).

Before every iteration's sampling the engine gets the policy as it is now, so the rollouts are on-policy:

- **LoRA policy, engine serving LoRA requests** (``vllm_lora_mode`` "adapter", the default on a GPU): the adapter
  is saved (a few MB) and served as a new `LoRARequest` (a new id each time, so vLLM loads the new weights instead
  of its cached adapter); the engine holds the base model the adapter sits on.
- **LoRA policy, merged** ("merged", the default on a CPU): the adapter is folded into whole weights on the host
  (`text2grad.core.modeling.merged_weights`, the training model untouched), which the engine loads in place.
- **Full fine-tuning**: the policy's whole weights, loaded in place the same way.

Whole weights are written once per iteration (`text2grad.core.vllm_engine.VLLMEngine.weights`) and loaded when
the engine holds other weights (e.g. after a reward model on the same engine wrote its critiques).

The PPO step itself does not change: old log-probs, values and reference log-probs still come from the training
model's forward pass on the sampled ids. vLLM's own log-probs of the sampled tokens come back with every row
(``Generation.sampled_logprobs``); the trainer logs their mean absolute difference to the training model's
(``vllm/logprob_abs_diff``), which stays small while the engine holds the current policy and grows when it does
not.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

import torch

from policy_optimization.ppo_config import PPOConfig
from text2grad.core.generation import Generation, encode_prompt_ids
from text2grad.core.modeling import merged_weights
from text2grad.core.vllm_engine import VLLMEngine, shared_engine

__all__ = ["VLLMRollouts", "sampled_logprob_gap", "start_vllm_rollouts"]

logger = logging.getLogger(__name__)


class VLLMRollouts:
    """Samples a PPO iteration's responses with vLLM from the policy as it is now.

    Args:
        config: the run's `PPOConfig` (sampling settings, ``vllm_*`` engine settings).
        tokenizer: the policy's tokenizer (prompts are encoded here, with the special tokens rule).
        base_model_path: the weights the engine starts from: the base the LoRA adapter sits on, or the initial
            policy for full fine-tuning.
        lora_rank: the policy adapter's rank, or None for full fine-tuning.
    """

    def __init__(self, config: PPOConfig, tokenizer, base_model_path: str, lora_rank: int | None):
        self.config = config
        self.tokenizer = tokenizer
        self.base_model_path = base_model_path
        self.lora_rank = lora_rank
        self._engine: VLLMEngine | None = None
        self._weights = None  # what the engine serves the policy from: a LoRA request or whole weights
        self._work = Path(tempfile.mkdtemp(prefix="text2grad-vllm-policy-"))
        self._refreshes = 0
        self.last_refresh_seconds = 0.0

    @property
    def engine(self) -> VLLMEngine:
        """The engine, started on first use (this process's shared engine when one with these settings runs)."""
        if self._engine is None:
            cfg = self.config
            self._engine = shared_engine(
                self.base_model_path, tokenizer=cfg.tokenizer_name_or_path or None, dtype=cfg.dtype,
                max_lora_rank=self.lora_rank, lora_mode=cfg.vllm_lora_mode,
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, cpu_kv_cache_gb=cfg.vllm_cpu_kv_cache_gb,
                **cfg.vllm_kwargs,
            )
        return self._engine

    @property
    def refreshes_adapter_only(self) -> bool:
        """True when `refresh` reads only the policy's LoRA adapter (served as a LoRA request), False when it reads
        all its weights (merged, or full fine-tuning): under ZeRO-3 that is what must be gathered."""
        return self.lora_rank is not None and self.engine.serves_lora_requests

    def refresh(self, policy) -> None:
        """Put ``policy``'s current weights into the engine (see the module docstring)."""
        start = time.perf_counter()
        engine = self.engine
        self._refreshes += 1
        if self.refreshes_adapter_only:
            folder = self._work / f"policy-{self._refreshes}"
            policy.save_pretrained(str(folder))  # the adapter only (a PeftModel)
            self._weights = engine.adapter(folder, name=f"policy-{self._refreshes}")
            previous = self._work / f"policy-{self._refreshes - 1}"
            shutil.rmtree(previous, ignore_errors=True)  # served from the engine's memory since the last sampling
        else:
            self._weights = engine.weights(merged_weights(policy), name="policy")
        self.last_refresh_seconds = time.perf_counter() - start

    def sample(self, prompts: list[str], add_special_tokens: bool | None) -> list[Generation]:
        """One sampled response per prompt from the engine's current policy (call `refresh` first), with vLLM's
        log-probs of the sampled tokens. Sampling follows the engine's own random stream (no per-request seeds:
        on CPU, vLLM 0.32 fails a seeded request whose prompt is prefilled in chunks, as long batches are)."""
        cfg = self.config
        ids = encode_prompt_ids(self.tokenizer, prompts, add_special_tokens, cfg.max_prompt_length)
        return self.engine.generate(
            self.tokenizer, ids, max_new_tokens=cfg.response_length, do_sample=True, temperature=cfg.temperature,
            top_p=cfg.top_p, top_k=cfg.top_k, stop_strings=cfg.stop_strings, weights=self._weights, logprobs=True,
        )

    def metrics(self, generations: list[Generation], logprobs: torch.Tensor, accelerator) -> dict[str, float]:
        """The refresh check: vLLM's log-probs of the sampled tokens against the training model's ``logprobs``
        (B, T) (small while the engine holds the current policy), and the time the refresh took. Each process
        checks its own engine: the mean over processes, the worst process's gap, and the slowest refresh."""
        gap = sampled_logprob_gap(generations, logprobs)
        mine = torch.tensor([[float("nan") if gap is None else gap, self.last_refresh_seconds]],
                            dtype=torch.float64, device=accelerator.device)
        every = accelerator.gather(mine) if accelerator.num_processes > 1 else mine
        gaps, seconds = every[:, 0], every[:, 1]
        return {"vllm/logprob_abs_diff": float(gaps.nanmean()), "vllm/logprob_abs_diff_max": float(gaps.max()),
                "time/vllm_refresh": float(seconds.max())}

    def close(self) -> None:
        """Remove the saved policy copies (the shared engine stays up for whoever uses it next)."""
        shutil.rmtree(self._work, ignore_errors=True)


def start_vllm_rollouts(config: PPOConfig, tokenizer, zero_stage: int, base_model_path: str | None,
                        lora_rank: int | None) -> VLLMRollouts:
    """The vLLM sampler of ``generation_backend: vllm``, started from the policy's weights on disk
    (``base_model_path``: the base a LoRA policy of rank ``lora_rank`` sits on, or the initial policy). Under a
    launcher every process has its own engine on its own device (`text2grad.core.placement.engine_placement`),
    samples its own share of the batch and refreshes it from its own copy of the policy (gathered under ZeRO-3)."""
    if zero_stage == 3 and not config.ds3_gather_for_generation:
        raise ValueError(
            "generation_backend vllm keeps a whole copy of the policy in every process's engine, but "
            "ds3_gather_for_generation false asks that no GPU ever hold the whole policy: set "
            "ds3_gather_for_generation true to sample with vLLM under ZeRO-3, or use generation_backend hf"
        )
    if not base_model_path:
        raise ValueError("generation_backend vllm starts its engine from the policy's weights on disk: pass "
                         "base_model_path (or set model_name_or_path)")
    return VLLMRollouts(config, tokenizer, str(base_model_path), lora_rank)


def sampled_logprob_gap(generations: list[Generation], logprobs: torch.Tensor) -> float | None:
    """Mean |engine log-prob - training model log-prob| over the sampled tokens of the rows whose engine reported
    log-probs (``Generation.sampled_logprobs``), or None when no row has them. ``logprobs``: (B, T), the training
    model's log-probs of the same response ids at the same temperature."""
    gaps = [
        (logprobs[row, : len(g.sampled_logprobs)].detach().float().cpu() - torch.tensor(g.sampled_logprobs)).abs()
        for row, g in enumerate(generations) if g.sampled_logprobs
    ]
    return float(torch.cat(gaps).mean()) if gaps else None
