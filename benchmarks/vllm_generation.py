"""transformers' generate vs the vLLM engine on SmolLM2-135M-Instruct, side by side in one run.

    python benchmarks/vllm_generation.py [--iterations 2] [--out benchmarks/results/vllm_generation.json]

Measured, each with the same prompts and settings on every backend (fp32, one after the other):

1. engine start-up (once per engine; not counted in anything below);
2. rollouts per second at batch 16 and 64: quickstart task prompts through SmolLM2's chat template, sampled at
   temperature 0.7, 40 new tokens (the ``--preset smollm2`` PPO settings);
3. critiques per second: a LoRA reward model (rank 16 on SmolLM2, as the preset trains one) asked for 128 new tokens
   on 32 (post, summary) pairs, greedy. Its adapter is random, not trained, so every backend writes to the token
   limit: the worst case, and the same work on all;
4. one whole PPO iteration of the preset's shape (LoRA rank 16, batch 8, 2 minibatches x 2 epochs, 40 tokens),
   with that reward model as the critic: ``generation_backend hf`` + the "hf" reward model vs
   ``generation_backend vllm`` + the "vllm" reward model, one engine serving both. The first iteration of each
   backend is a warm-up and not counted. Grounded span decoding is off (its default) on every backend.

vLLM runs twice: with ``lora_mode`` "merged" (the adapters folded into whole weights that the engine swaps in: the
default on a CPU) and "adapter" (vLLM LoRA requests: the default on a GPU), each on its own engine. On a CPU a third
engine, bound to the cores vLLM's own way (one kept for its scheduler), samples the batch-64 rollouts again.

On a GPU (``--device cuda``, the default where one is visible) transformers generates on that GPU too, vLLM serves
adapters as LoRA requests by default, and the peak GPU memory of the measuring process (the training models and
transformers' generation; the engine runs in its own process with ``gpu_memory_utilization`` 0.3 of the GPU) is
reported; about three minutes on one GPU with ``--iterations 1``.

Needs the vllm extra (env.sh installs it by default on CPU-only Linux). The engine runs in a spawned process,
hence the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.trainer import NLGradientPPOTrainer
from reward_model.inference import GenerativeRewardModel
from text2grad.apps.quickstart.results import cpu_name
from text2grad.apps.quickstart.task import TaskConfig, generate_task
from text2grad.core.assets import smollm2_path
from text2grad.core.generation import apply_chat_template, encode_prompt_ids, generate
from text2grad.core.vllm_engine import CPU_WORKER_SPIN_SECONDS, close_shared_engine, shared_engine, vllm_available

RESPONSE_LENGTH = 40  # the quickstart's response_length
GOAL = 1.5  # the PPO iteration speed-up vLLM is expected to bring
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


def critiques(adapter: Path, path: Path, posts: list[str], summaries: list[str], backend: str,
              vllm_options: dict) -> float:
    """Seconds for one batch of critiques of ``posts``/``summaries`` by the reward model on ``backend``."""
    options = dict(max_new_tokens=CRITIQUE_TOKENS, dtype="fp32", tokenizer_name_or_path=str(path))
    if backend == "hf":
        model = GenerativeRewardModel.from_pretrained(str(adapter), batch_size=len(posts), **options)
    else:
        model = GenerativeRewardModel.from_pretrained(str(adapter), backend="vllm", vllm_kwargs=vllm_options, **options)
    _, seconds = timed(lambda: model.feedback(posts, summaries))
    return seconds


def idle_spin(engine, tokenizer, prompts: list[str]) -> dict:
    """CPU seconds the engine's processes use in the 2 s after a request, with vLLM's 1 s spin of its worker's
    queue readers and with the engine's short one (`text2grad.core.vllm_engine`); 0 on a GPU engine (not changed)."""
    if engine.placement.gpu_index is not None:
        return {}
    processes = psutil.Process().children(recursive=True)
    ids = encode_prompt_ids(tokenizer, prompts[:8], add_special_tokens=False)

    def after_a_request() -> float:
        engine.generate(tokenizer, ids, max_new_tokens=8)
        before = sum(sum(p.cpu_times()[:2]) for p in processes)
        time.sleep(2.0)
        return sum(sum(p.cpu_times()[:2]) for p in processes) - before

    out = {}
    for label, seconds in (("vllm_spin", 1.0), ("short_spin", CPU_WORKER_SPIN_SECONDS)):
        engine.set_worker_spin(seconds)
        out[label] = {"spin_seconds": seconds, "cpu_seconds_in_2s": after_a_request()}
    return out


def ppo_iterations(backend: str, path: Path, adapter: Path, items: list[dict], iterations: int, vllm_options: dict,
                   work: Path) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    policy = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    engine_backend = "vllm" if backend.startswith("vllm") else "hf"
    cfg = PPOConfig(
        model_name_or_path=str(path), generation_backend=engine_backend, dtype="fp32", use_lora=True, lora_r=16,
        lora_alpha=32, num_iterations=iterations + 1, batch_size=8, num_mini_batches=2, num_ppo_epochs=2,
        response_length=RESPONSE_LENGTH, temperature=0.7, learning_rate=1e-4, kl_coef=0.05, adaptive_kl=False,
        lam=0.0, seed=0, save_steps=0, progress_bar=False, log_samples=0, max_feedback_error_rate=1.0,
        vllm_lora_mode=vllm_options.get("lora_mode", "auto"), vllm_gpu_memory_utilization=vllm_options["gpu_memory_utilization"],
        vllm_cpu_kv_cache_gb=vllm_options["cpu_kv_cache_gb"], output_dir=str(work / f"ppo-{backend}"),
    )
    critic = GenerativeRewardModel.from_pretrained(
        str(adapter), max_new_tokens=CRITIQUE_TOKENS, batch_size=64, dtype="fp32", tokenizer_name_or_path=str(path),
        backend=engine_backend, **({"vllm_kwargs": vllm_options} if engine_backend == "vllm" else {}),
    )
    trainer = NLGradientPPOTrainer(cfg, tokenizer, policy, None, None, critic, items, base_model_path=str(path))
    runs = [trainer.step() for _ in range(iterations + 1)][1:]  # the first is a warm-up
    keys = ("time/total", "time/generation", "time/feedback", "time/forward", "time/update")
    out = {k.removeprefix("time/"): statistics.mean(m[k] for m in runs) for k in keys}
    out["totals"] = [m["time/total"] for m in runs]  # each timed iteration, for the spread
    if engine_backend == "vllm":
        out["refresh"] = statistics.mean(m["time/vllm_refresh"] for m in runs)
        out["logprob_abs_diff"] = [m["vllm/logprob_abs_diff"] for m in runs]
    if trainer.vllm_rollouts is not None:
        trainer.vllm_rollouts.close()
    return out


def report(results: dict) -> str:
    """The benchmark notes' markdown for ``results`` (what `main` measured): the table and every sentence that reads
    a number, generated from the numbers."""
    ppo, crit, roll = results["ppo_iteration"], results["critiques"], results["rollouts"]
    hf, merged, adapter = ppo["hf"], ppo["vllm-merged"], ppo["vllm-adapter"]
    pairs = crit["pairs"]
    rate = {b: pairs / crit["seconds"][b] for b in ("hf", "vllm-merged", "vllm-adapter")}
    start = results["engine_startup_seconds"]
    lines = [
        f"Measured on {results['machine']}; {results['model']}.",
        "",
        "| what | transformers (`hf`) | vLLM, merged weights | vLLM, LoRA requests |",
        "|---|---:|---:|---:|",
        f"| engine start-up | - | {start['merged']:.1f} s | {start['adapter']:.1f} s |",
    ]
    for row in roll:
        lines.append(f"| rollouts, batch {row['batch']}, {RESPONSE_LENGTH} tokens (base weights) | "
                     f"{row['hf_rollouts_per_s']:.2f} /s | {row['vllm_rollouts_per_s']:.2f} /s ({row['speedup']:.2f}x) | - |")
    lines.append(f"| critiques, {pairs} pairs x {CRITIQUE_TOKENS} tokens, LoRA rank 16 | {rate['hf']:.2f} /s | "
                 f"{rate['vllm-merged']:.2f} /s ({rate['vllm-merged'] / rate['hf']:.2f}x) | "
                 f"{rate['vllm-adapter']:.2f} /s ({rate['vllm-adapter'] / rate['hf']:.2f}x) |")
    for key, label in (("total", "one PPO iteration (LoRA r16, batch 8, reward model as critic)"),
                       ("generation", "... rollouts (with the engine refresh)"), ("feedback", "... critiques"),
                       ("forward", "... forward passes"), ("update", "... PPO update")):
        lines.append(f"| {label} | {hf[key]:.1f} s | {merged[key]:.1f} s | {adapter[key]:.1f} s |")
    ratio_merged, ratio_adapter = hf["total"] / merged["total"], hf["total"] / adapter["total"]
    training = merged["forward"] + merged["update"]
    bound = hf["total"] / training
    verdict = "meets" if ratio_merged >= GOAL else "does not meet"
    lines += [
        "",
        f"A whole LoRA PPO iteration took {hf['total']:.1f} s with transformers, {merged['total']:.1f} s with vLLM "
        f"serving merged weights ({ratio_merged:.2f}x) and {adapter['total']:.1f} s with vLLM's LoRA requests "
        f"({ratio_adapter:.2f}x); the merged engine {verdict} the {GOAL}x goal on this machine.",
        *([f"Over its {len(merged['totals'])} timed iterations per backend the ratio of one iteration's times ranged "
           f"from {min(hf['totals']) / max(merged['totals']):.2f}x (the fastest transformers iteration against the "
           f"slowest vLLM one) to {max(hf['totals']) / min(merged['totals']):.2f}x."] if "totals" in merged else []),
        f"Its forward passes and PPO update ({training:.1f} s), which vLLM does not touch, bound the speed-up: with "
        f"rollouts and critiques taking no time at all the iteration would be {bound:.2f}x faster than with "
        "transformers.",
        f"The refresh (the policy's adapter folded into whole weights, written and loaded into the engine) took "
        f"{merged['refresh']:.2f} s per iteration, and vLLM's log-probs of the sampled tokens differed from the "
        f"training model's by at most {max(merged['logprob_abs_diff'] + adapter['logprob_abs_diff']):.1e} nats on "
        "average: the engine held the current policy.",
        f"With LoRA requests the engine's critiques ran at {rate['vllm-adapter'] / rate['hf']:.2f}x the transformers "
        f"rate, with merged weights at {rate['vllm-merged'] / rate['hf']:.2f}x.",
    ]
    spin = results.get("idle_spin")
    if spin:
        lines.append(
            f"In the 2 s after a request the engine's processes used {spin['vllm_spin']['cpu_seconds_in_2s']:.2f} CPU "
            f"seconds while its worker's queue readers spun for vLLM's {spin['vllm_spin']['spin_seconds']:g} s, and "
            f"{spin['short_spin']['cpu_seconds_in_2s']:.2f} with the engine's {spin['short_spin']['spin_seconds']:g} "
            "s: CPU time the PPO steps between requests get back."
        )
    binding = results.get("thread_binding")
    if binding:
        slower = binding["vllm_binding_seconds"] / binding["all_cores_seconds"]
        lines.append(
            f"Bound vLLM's own way (one of the {binding['cores']} cores kept for its scheduler), the engine took "
            f"{binding['vllm_binding_seconds']:.1f} s instead of {binding['all_cores_seconds']:.1f} s for the batch-"
            f"{binding['batch']} rollouts ("
            + (f"{slower:.2f}x slower), which is why a process's engine is bound to all of its cores." if slower > 1 else
               f"{1 / slower:.2f}x faster): binding all of a process's cores did not pay on this machine.")
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2, help="Timed PPO iterations per backend (after one warm-up).")
    parser.add_argument("--out", default=None, help="Also write the figures to this JSON file (and the notes' "
                        "markdown next to it, .md).")
    parser.add_argument("--report_from", default=None, help="Only print the markdown of a JSON file an earlier run wrote.")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: cuda when a GPU is visible; cpu hides the GPUs (from the engine too)")
    args = parser.parse_args()
    if args.report_from:
        print(report(json.loads(Path(args.report_from).read_text())), end="")
        return
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything initialises CUDA; the engine inherits it
    elif args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda, but torch {torch.__version__} sees no CUDA GPU (README: On a GPU node)", file=sys.stderr)
        raise SystemExit(2)
    if not vllm_available():
        raise SystemExit("vllm is not importable: install the vllm extra (see env.sh)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device).eval()
    splits = generate_task(TaskConfig(seed=0, n_train=8, n_rl=64, n_eval=1))
    rl = splits["rl"]
    prompts = [apply_chat_template(tokenizer, r["prompt"]) for r in rl]
    vllm_options = dict(gpu_memory_utilization=0.3, cpu_kv_cache_gb=1.0)
    results: dict = {
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} torch threads",
        "model": "SmolLM2-135M-Instruct, fp32",
        "date": time.strftime("%Y-%m-%d"), "load_before": list(os.getloadavg()),  # read by benchmarks/results_tables.py
        "command": " ".join(["python", "benchmarks/vllm_generation.py", *sys.argv[1:]]),
        **({"gpu": torch.cuda.get_device_name(0)} if device.type == "cuda" else {}),
        "engine_startup_seconds": {}, "critiques": {"pairs": 32, "seconds": {}}, "ppo_iteration": {},
    }

    def start(mode: str, label: str | None = None):
        close_shared_engine()
        options = dict(vllm_options, lora_mode=mode)
        engine, seconds = timed(lambda: shared_engine(path, dtype="fp32", max_lora_rank=16, **options))
        results["engine_startup_seconds"][label or mode] = seconds
        print(f"engine start-up ({label or mode}): {seconds:.1f} s", flush=True)
        engine.generate(tokenizer, encode_prompt_ids(tokenizer, prompts[:2], add_special_tokens=False), max_new_tokens=4)
        return engine, options

    engine, merged_options = start("merged")
    generate(model, tokenizer, prompts[:2], max_new_tokens=4, add_special_tokens=False)  # warm both up
    results["idle_spin"] = idle_spin(engine, tokenizer, prompts)
    results["rollouts"] = []
    for batch in (16, 64):
        row = rollouts(model, tokenizer, engine, prompts, batch)
        results["rollouts"].append(row)
        print(f"rollouts batch {batch}: hf {row['hf_rollouts_per_s']:.2f}/s, vllm {row['vllm_rollouts_per_s']:.2f}/s "
              f"({row['speedup']:.2f}x)", flush=True)
    del model

    with tempfile.TemporaryDirectory() as tmp:
        adapter = make_adapter(path, Path(tmp) / "rm")
        posts = [r["prompt"] for r in rl[:32]]
        summaries = [r["completion"] for r in rl[:32]]
        items = [{"prompt": p, "feedback_prompt": r["prompt"]} for p, r in zip(prompts, rl)]
        seconds = results["critiques"]["seconds"]

        def measure(backend: str, options: dict) -> None:
            seconds[backend] = critiques(adapter, path, posts, summaries, backend.split("-")[0], options)
            print(f"critiques ({backend}): {len(posts) / seconds[backend]:.2f}/s", flush=True)
            results["ppo_iteration"][backend] = ppo_iterations(backend, path, adapter, items, args.iterations,
                                                               options, Path(tmp))
            print(f"PPO iteration ({backend}): {results['ppo_iteration'][backend]}", flush=True)

        measure("hf", vllm_options)
        measure("vllm-merged", merged_options)
        _, adapter_options = start("adapter")
        measure("vllm-adapter", adapter_options)

    if engine.placement.gpu_index is None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        # The engine binds its threads to all of this process's cores (text2grad.core.placement); vLLM's own
        # binding keeps one core for its scheduler. The batch-64 rollouts again, on an engine bound vLLM's way.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
        auto_engine, _ = start("merged", label="vllm-binding")
        batch = (prompts * 2)[:64]
        ids = encode_prompt_ids(tokenizer, batch, add_special_tokens=False)
        _, seconds_auto = timed(lambda: auto_engine.generate(tokenizer, ids, max_new_tokens=RESPONSE_LENGTH,
                                                             do_sample=True, temperature=0.7))
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]
        results["thread_binding"] = {"cores": len(engine.placement.cpu_cores or ()), "batch": 64,
                                     "all_cores_seconds": results["rollouts"][-1]["vllm_seconds"],
                                     "vllm_binding_seconds": seconds_auto}
    close_shared_engine()

    hf = results["ppo_iteration"]["hf"]["total"]
    results["ppo_iteration"]["speedup"] = {b: hf / results["ppo_iteration"][b]["total"] for b in ("vllm-merged", "vllm-adapter")}
    results["critiques"]["speedup"] = {b: seconds["hf"] / seconds[b] for b in ("vllm-merged", "vllm-adapter")}
    print(f"PPO iteration speed-up over hf: {results['ppo_iteration']['speedup']}; critiques: {results['critiques']['speedup']}")
    if device.type == "cuda":
        results["peak_gpu_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        print(f"peak GPU memory of this process (not the engine's): {results['peak_gpu_allocated_mb']:.0f} MiB on "
              f"{results['gpu']}", flush=True)

    print(report(results), end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
        Path(args.out).with_suffix(".md").write_text(report(results))


if __name__ == "__main__":
    main()
