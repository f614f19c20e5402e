"""transformers' generate vs the vLLM engine on SmolLM2-135M-Instruct, side by side in one run.

    python benchmarks/vllm_generation.py [--iterations 2] [--out benchmarks/results/vllm_generation.json]

Measured, each with the same prompts and settings on both backends (fp32, one after the other):

1. engine start-up (once; not counted in anything below);
2. rollouts per second at batch 16 and 64: quickstart task prompts through SmolLM2's chat template, sampled at
   temperature 0.7, 40 new tokens (the ``--preset smollm2`` PPO settings);
3. critiques per second: a LoRA reward model (rank 16 on SmolLM2, as the preset trains one) asked for 128 new tokens
   on 32 (post, summary) pairs, greedy. Its adapter is random, not trained, so both backends write to the token
   limit: the worst case, and the same work on both;
4. one whole PPO iteration of the preset's shape (LoRA rank 16, batch 8, 2 minibatches x 2 epochs, 40 tokens),
   with that reward model as the critic: ``generation_backend hf`` + the "hf" reward model vs
   ``generation_backend vllm`` + the "vllm" reward model (one engine serves both as LoRA requests). Grounded span
   decoding is off in both (vLLM has none; see reward_model/README.md). The first iteration of each backend is
   a warm-up and not counted.

Needs the vllm extra (env.sh installs it by default on CPU-only Linux). The engine runs in a spawned process,
hence the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.trainer import NLGradientPPOTrainer
from reward_model.inference import GenerativeRewardModel
from text2grad.apps.quickstart.task import TaskConfig, generate_task
from text2grad.core.assets import smollm2_path
from text2grad.core.generation import apply_chat_template, encode_prompt_ids, generate
from text2grad.core.vllm_engine import shared_engine, vllm_available

RESPONSE_LENGTH = 40  # the quickstart's response_length
CRITIQUE_TOKENS = 128  # the quickstart's reward-model critic max_new_tokens


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def make_adapter(path: Path, out: Path, rank: int = 16) -> Path:
    """A rank-16 LoRA adapter on SmolLM2 with small random weights (what a short training run leaves)."""
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(path)).save_pretrained(str(out))
    return out


def rollouts(model, tokenizer, engine, prompts: list[str], batch: int) -> dict:
    chosen = (prompts * (batch // len(prompts) + 1))[:batch]
    hf, t_hf = timed(lambda: generate(model, tokenizer, chosen, max_new_tokens=RESPONSE_LENGTH, batch_size=batch,
                                      do_sample=True, temperature=0.7, add_special_tokens=False, generator_seed=0))
    ids = encode_prompt_ids(tokenizer, chosen, add_special_tokens=False)
    vl, t_vl = timed(lambda: engine.generate(tokenizer, ids, max_new_tokens=RESPONSE_LENGTH, do_sample=True,
                                             temperature=0.7))
    tokens = lambda rows: sum(len(r.response_ids) for r in rows)  # noqa: E731
    return {"batch": batch, "hf_seconds": t_hf, "vllm_seconds": t_vl, "hf_rollouts_per_s": batch / t_hf,
            "vllm_rollouts_per_s": batch / t_vl, "hf_tokens": tokens(hf), "vllm_tokens": tokens(vl),
            "speedup": t_hf / t_vl}


def critiques(adapter: Path, path: Path, posts: list[str], summaries: list[str], vllm_options: dict) -> dict:
    options = dict(max_new_tokens=CRITIQUE_TOKENS, dtype="fp32", tokenizer_name_or_path=str(path))
    hf_rm = GenerativeRewardModel.from_pretrained(str(adapter), batch_size=len(posts), **options)
    vl_rm = GenerativeRewardModel.from_pretrained(str(adapter), backend="vllm", vllm_kwargs=vllm_options, **options)
    _, t_hf = timed(lambda: hf_rm.feedback(posts, summaries))
    _, t_vl = timed(lambda: vl_rm.feedback(posts, summaries))
    n = len(posts)
    return {"pairs": n, "hf_seconds": t_hf, "vllm_seconds": t_vl, "hf_critiques_per_s": n / t_hf,
            "vllm_critiques_per_s": n / t_vl, "speedup": t_hf / t_vl}


def ppo_iterations(backend: str, path: Path, adapter: Path, items: list[dict], iterations: int, vllm_options: dict,
                   work: Path) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    policy = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    cfg = PPOConfig(
        model_name_or_path=str(path), generation_backend=backend, dtype="fp32", use_lora=True, lora_r=16, lora_alpha=32,
        num_iterations=iterations + 1, batch_size=8, num_mini_batches=2, num_ppo_epochs=2,
        response_length=RESPONSE_LENGTH, temperature=0.7, learning_rate=1e-4, kl_coef=0.05, adaptive_kl=False,
        lam=0.0, seed=0, save_steps=0, progress_bar=False, log_samples=0, max_feedback_error_rate=1.0,
        output_dir=str(work / f"ppo-{backend}"),
    )
    critic = GenerativeRewardModel.from_pretrained(
        str(adapter), max_new_tokens=CRITIQUE_TOKENS, batch_size=64, dtype="fp32", tokenizer_name_or_path=str(path),
        backend=backend, **({"vllm_kwargs": vllm_options} if backend == "vllm" else {}),
    )
    trainer = NLGradientPPOTrainer(cfg, tokenizer, policy, None, None, critic, items, base_model_path=str(path))
    runs = [trainer.step() for _ in range(iterations + 1)][1:]  # the first is a warm-up
    keys = ("time/total", "time/generation", "time/feedback", "time/forward", "time/update")
    out = {k.removeprefix("time/"): statistics.mean(m[k] for m in runs) for k in keys}
    if backend == "vllm":
        out["refresh"] = statistics.mean(m["time/vllm_refresh"] for m in runs)
        out["logprob_abs_diff"] = [m["vllm/logprob_abs_diff"] for m in runs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2, help="Timed PPO iterations per backend (after one warm-up).")
    parser.add_argument("--out", default=None, help="Also write the figures to this JSON file.")
    args = parser.parse_args()
    if not vllm_available():
        raise SystemExit("vllm is not importable: install the vllm extra (see env.sh)")

    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    splits = generate_task(TaskConfig(seed=0, n_train=8, n_rl=64, n_eval=1))
    rl = splits["rl"]
    prompts = [apply_chat_template(tokenizer, r["prompt"]) for r in rl]
    vllm_options = dict(gpu_memory_utilization=0.3, cpu_kv_cache_gb=1.0)
    results: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} torch threads",
        "model": "SmolLM2-135M-Instruct, fp32",
    }

    engine, t_start = timed(lambda: shared_engine(path, dtype="fp32", max_lora_rank=16, **vllm_options))
    results["engine_startup_seconds"] = t_start
    print(f"engine start-up: {t_start:.1f} s", flush=True)
    engine.generate(tokenizer, encode_prompt_ids(tokenizer, prompts[:2], add_special_tokens=False), max_new_tokens=4)
    generate(model, tokenizer, prompts[:2], max_new_tokens=4, add_special_tokens=False)  # warm both up

    results["rollouts"] = []
    for batch in (16, 64):
        row = rollouts(model, tokenizer, engine, prompts, batch)
        results["rollouts"].append(row)
        print(f"rollouts batch {batch}: hf {row['hf_rollouts_per_s']:.2f}/s, vllm {row['vllm_rollouts_per_s']:.2f}/s "
              f"({row['speedup']:.2f}x)", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        adapter = make_adapter(path, Path(tmp) / "rm")
        posts = [r["prompt"] for r in rl[:32]]
        summaries = [r["completion"] for r in rl[:32]]
        results["critiques"] = critiques(adapter, path, posts, summaries, vllm_options)
        c = results["critiques"]
        print(f"critiques ({c['pairs']} pairs, {CRITIQUE_TOKENS} tokens): hf {c['hf_critiques_per_s']:.2f}/s, "
              f"vllm {c['vllm_critiques_per_s']:.2f}/s ({c['speedup']:.2f}x)", flush=True)

        items = [{"prompt": p, "feedback_prompt": r["prompt"]} for p, r in zip(prompts, rl)]
        del model
        results["ppo_iteration"] = {}
        for backend in ("hf", "vllm"):
            results["ppo_iteration"][backend] = ppo_iterations(backend, path, adapter, items, args.iterations,
                                                               vllm_options, Path(tmp))
            print(f"PPO iteration ({backend}): {results['ppo_iteration'][backend]}", flush=True)
        hf, vl = results["ppo_iteration"]["hf"], results["ppo_iteration"]["vllm"]
        results["ppo_iteration"]["speedup"] = hf["total"] / vl["total"]
        print(f"PPO iteration: hf {hf['total']:.1f} s, vllm {vl['total']:.1f} s ({hf['total'] / vl['total']:.2f}x)")

    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
