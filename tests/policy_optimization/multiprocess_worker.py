"""One process of the multi-process PPO tests, started by a launcher (``accelerate launch`` / ``torchrun``):

    accelerate launch ... -m tests.policy_optimization.multiprocess_worker [--seeded_rollouts] <train-policy flags>

It builds the trainer exactly as ``python -m policy_optimization.train`` does, writes where each of this
process's models sits to ``<output_dir>/placement-rank<k>.json``, then trains. The reward models are placed by a
device resolver that maps local rank k to ``cpu:k``: on a CPU the index is the only trace of which rank a device
was meant for, so a model built for the wrong rank (e.g. every rank's copy on device 0) shows up.

``--real_devices`` keeps the project's own placement instead (on a GPU node: ``cuda:<LOCAL_RANK>``).

``--seeded_rollouts`` samples each prompt on its own with a seed made from the prompt and the iteration, so a
prompt gets the same response whichever process samples it (the trainer's sampling streams differ per process by
design); the world-size comparison needs that.

With ``--generation_backend vllm`` it also writes ``<output_dir>/vllm-rank<k>.json``: the process's engine
placement, what its engine's worker reports from inside (its process id, KV-cache size and CPU affinity), the
process's own refresh check (``vllm/logprob_abs_diff`` before it is averaged over processes) per iteration, and
what that check reads with an engine left on the initial policy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import zlib
from pathlib import Path

import torch

import policy_optimization.vllm_rollouts as vllm_rollouts_module
from policy_optimization.distributed import policy_for_generation
from policy_optimization.ppo_config import PPOConfig
from policy_optimization.train import build_trainer
from policy_optimization.rollout import pack_rollout
from policy_optimization.trainer import NLGradientPPOTrainer
from policy_optimization.vllm_rollouts import sampled_logprob_gap
from text2grad.core.cli import exit_process
from text2grad.core.config import parse_config
from text2grad.core.generation import Generation, generate
from text2grad.core.modeling import end_distributed
from text2grad.core.placement import local_rank, set_device_resolver


def rank_device() -> torch.device:
    """``cpu:<LOCAL_RANK>``: usable on a CPU, and the index says which rank asked."""
    return torch.device("cpu", local_rank() or 0)


def seeded_generate(self: NLGradientPPOTrainer, prompts: list[str]) -> list[Generation]:
    cfg = self.config
    self.model.eval()
    with policy_for_generation(self.model, self.accelerator, self.zero_stage) as policy:
        return [
            generate(policy, self.tokenizer, [prompt], max_new_tokens=cfg.response_length, do_sample=True,
                     temperature=cfg.temperature, max_prompt_length=cfg.max_prompt_length,
                     generator_seed=zlib.crc32(f"{self.state.step}:{prompt}".encode()))[0]
            for prompt in prompts
        ]


def devices(module: torch.nn.Module | None) -> list[str]:
    return sorted({str(p.device) for p in module.parameters()}) if module is not None else []


def placement(trainer: NLGradientPPOTrainer) -> dict:
    acc = trainer.accelerator
    unwrapped = acc.unwrap_model(trainer.model)
    critic = getattr(trainer, "critic", None)
    scorer = trainer.score_fn
    return {
        "local_rank": local_rank(), "process_index": acc.process_index, "num_processes": acc.num_processes,
        "accelerator_device": str(acc.device), "zero_stage": trainer.zero_stage, "mixed_precision": acc.mixed_precision,
        "critic": str(critic.device) if getattr(critic, "device", None) is not None else None,
        "scalar_reward_model": str(scorer.device) if getattr(scorer, "device", None) is not None else None,
        "policy": devices(unwrapped.policy), "value": devices(unwrapped.value_model),
        "reference": devices(getattr(trainer.ref_model, "module", trainer.ref_model)),
        "rollouts_per_process": trainer.batch.rollouts,
    }


def engine_facts(worker) -> dict:
    """Runs inside the engine's worker process (`vllm.LLM.collective_rpc`): what the engine itself was given."""
    return {"pid": os.getpid(), "parent_pid": os.getppid(), "kv_cache_bytes": worker.cache_config.kv_cache_memory_bytes,
            "cpu_affinity": sorted(os.sched_getaffinity(0)), "device": str(getattr(worker, "device", None))}


def stale_engine_gap(trainer: NLGradientPPOTrainer, measure) -> float:
    """What the refresh check reads when the engine was not refreshed: this process's engine samples from its base
    weights (the policy before any update: LoRA B starts at zero) and the trained policy scores the samples."""
    rollouts = trainer.vllm_rollouts
    prompts = [r["prompt"] for r in trainer._next_items()]
    current, rollouts._weights = rollouts._weights, None
    try:
        generations = rollouts.sample(prompts, trainer._prompt_special_tokens)
    finally:
        rollouts._weights = current
    logprobs = trainer._rollout_forward(pack_rollout(generations, trainer.tokenizer.pad_token_id, trainer.accelerator.device))[0]
    return measure(generations, logprobs)


def record_own_logprob_gaps() -> list[float]:
    """Keep this process's own refresh check of every iteration (the trainer logs the mean over processes)."""
    gaps: list[float] = []
    measure = vllm_rollouts_module.sampled_logprob_gap

    def recording(generations, logprobs):
        gaps.append(measure(generations, logprobs))
        return gaps[-1]

    vllm_rollouts_module.sampled_logprob_gap = recording
    return gaps


def vllm_record(trainer: NLGradientPPOTrainer, gaps: list[float]) -> dict:
    engine = trainer.vllm_rollouts.engine
    return {"rank_pid": os.getpid(), "placement": dataclasses.asdict(engine.placement),
            "engine": engine.llm.collective_rpc(engine_facts)[0], "own_logprob_abs_diff": gaps,
            "stale_logprob_abs_diff": stale_engine_gap(trainer, sampled_logprob_gap)}


def main(argv: list[str]) -> int:
    if "--seeded_rollouts" in argv:
        argv = [a for a in argv if a != "--seeded_rollouts"]
        NLGradientPPOTrainer._generate = seeded_generate
    if "--real_devices" in argv:  # on GPUs: the project's own placement (cuda:<LOCAL_RANK>), not the CPU stand-in
        argv = [a for a in argv if a != "--real_devices"]
    else:
        set_device_resolver(rank_device)
    cfg = parse_config(PPOConfig, argv)
    trainer = build_trainer(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank = trainer.accelerator.process_index
    (out / f"placement-rank{rank}.json").write_text(json.dumps(placement(trainer)))
    gaps = record_own_logprob_gaps() if cfg.generation_backend == "vllm" else []
    trainer.train()
    if trainer.rm_refresh is not None:  # what this rank's reward model holds after the refreshes
        weights = [p.detach().double().sum().item() for p in trainer.rm_refresh.rm.model.parameters()]
        (out / f"rm-rank{rank}.json").write_text(json.dumps(weights))
    if cfg.generation_backend == "vllm":
        (out / f"vllm-rank{rank}.json").write_text(json.dumps(vllm_record(trainer, gaps)))
    end_distributed()
    return 0


if __name__ == "__main__":  # a launched rank: exit_process skips the teardown that can abort it after its work
    exit_process(main(sys.argv[1:]))
