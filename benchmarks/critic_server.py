"""A PPO iteration with the reward model in the PPO process vs behind vLLM's OpenAI server, side by side on one machine.

    python benchmarks/critic_server.py [--iterations 2] [--critique_tokens 128] [--setups ...] [--torch_threads N]
        [--out benchmarks/results/critic_server/critic_server.json]

The same PPO iteration three times over, one after the other: SmolLM2-135M-Instruct as a LoRA policy (rank 16,
batch 8, 2 minibatches x 2 epochs, 40 new tokens, sampled with transformers), and as the critic a LoRA reward model
on SmolLM2 (rank 16, random adapter: it writes to its token limit, 128 by default, the worst case and the same work
everywhere):

- ``in-process hf``: the reward model on transformers in the PPO process (``backend: hf``);
- ``in-process vllm``: on this process's vLLM engine (``backend: vllm``; on a CPU the adapter merged in its weights);
- ``server``: behind ``text2grad serve-critic`` (vLLM's OpenAI server, the adapter merged on a CPU) on this same
  machine, asked through ``backend: openai``.

The first iteration of each is a warm-up and not counted; the server's start-up is reported apart. The machine's
load average is recorded before and after each: on a shared machine the figures move with the load. On one machine
the server competes with PPO for the same cores, so this measures the cost of the HTTP hop and of a second process,
not the gain of a separate GPU pool (where the critic's time leaves the PPO machine altogether).

Needs the vllm extra (env.sh installs it); the vLLM engine runs in a spawned process, hence the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.results_tables import SHARED_LOAD  # the load above which a result is marked shared
from benchmarks.vllm_generation import make_adapter  # the same random-LoRA reward model as that benchmark
from policy_optimization.ppo_config import PPOConfig
from policy_optimization.trainer import NLGradientPPOTrainer
from reward_model.inference import GenerativeRewardModel
from reward_model.serve import CriticServer
from reward_model.serve_config import ServeCriticConfig
from text2grad.apps.quickstart.results import cpu_name
from text2grad.apps.quickstart.task import TaskConfig, generate_task
from text2grad.core.assets import smollm2_path
from text2grad.core.generation import apply_chat_template
from text2grad.core.vllm_engine import close_shared_engine, vllm_available

RESPONSE_LENGTH = 40
CRITIQUE_TOKENS = 128
SETUPS = ("in-process hf", "in-process vllm", "server")


def ppo_iterations(critic, path: Path, items: list[dict], iterations: int, work: Path) -> dict:
    """Mean seconds of ``iterations`` PPO iterations (after one warm-up) with ``critic``, split by phase."""
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    policy = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    cfg = PPOConfig(
        model_name_or_path=str(path), dtype="fp32", use_lora=True, lora_r=16, lora_alpha=32,
        num_iterations=iterations + 1, batch_size=8, num_mini_batches=2, num_ppo_epochs=2,
        response_length=RESPONSE_LENGTH, temperature=0.7, learning_rate=1e-4, kl_coef=0.05, adaptive_kl=False, lam=0.0,
        seed=0, save_steps=0, progress_bar=False, log_samples=0, max_feedback_error_rate=1.0, output_dir=str(work),
    )
    trainer = NLGradientPPOTrainer(cfg, tokenizer, policy, None, None, critic, items, base_model_path=str(path))
    load_before = os.getloadavg()
    runs = [trainer.step() for _ in range(iterations + 1)][1:]  # the first is a warm-up
    out = {k.removeprefix("time/"): statistics.mean(m[k] for m in runs)
           for k in ("time/total", "time/generation", "time/feedback", "time/forward", "time/update")}
    out["totals"] = [m["time/total"] for m in runs]
    out["load_average_1min"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    return out


def report(results: dict) -> str:
    """The benchmark notes' markdown, every number and sentence from ``results``."""
    ppo = results["ppo_iteration"]
    rows = [f"| {name} | {r['total']:.1f} s | {r['feedback']:.1f} s | {r['generation']:.1f} s | "
            f"{', '.join(f'{t:.1f}' for t in r['totals'])} | {r['load_average_1min'][0]:.1f} -> {r['load_average_1min'][1]:.1f} |"
            for name, r in ppo.items()]
    base, served = ppo["in-process hf"]["total"], ppo["server"]["total"]
    ratio = served / base
    verdict = ("slower than" if ratio > 1.05 else "faster than" if ratio < 0.95 else "within 5 % of")
    load = results.get("load_before")
    state = ("" if load is None else
             f" The machine was {'shared with other work' if load[0] > SHARED_LOAD else 'idle'} (1-minute load average "
             f"{load[0]:.1f} at the start, {results['load_after'][0]:.1f} at the end).")
    lines = [
        f"Measured {results['date']} on {results['machine']}; {results['model']}.{state} The 1-minute load average "
        "before and after each setup's iterations is in the last column: the figures move with it.",
        "",
        f"Critiques of up to {results['critique_tokens']} tokens; mean of {results['timed_iterations']} timed "
        "iteration(s) per setup after one warm-up.",
        "",
        "| critic | PPO iteration | of which feedback | of which rollouts | timed iterations | load average |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"The server's start-up (merge, engine, /health): {results['server_startup_seconds']:.0f} s, once per server, "
        "not in the iterations.",
        f"Behind the server on the same machine a PPO iteration is {verdict} the in-process transformers critic "
        f"({served:.1f} s vs {base:.1f} s, {ratio:.2f}x); its feedback phase took {ppo['server']['feedback']:.1f} s "
        f"against {ppo['in-process hf']['feedback']:.1f} s in-process (transformers)"
        + (f" and {ppo['in-process vllm']['feedback']:.1f} s in-process (vLLM)." if "in-process vllm" in ppo else "."),
    ]
    if "in-process vllm" in ppo:  # the same engine in and out of the process: what the HTTP hop and second process cost
        engine = ppo["in-process vllm"]["total"]
        lines.append(f"Against the same vLLM engine in the PPO process ({engine:.1f} s) the served critic's iteration "
                     f"took {served / engine:.2f}x as long.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2, help="Timed PPO iterations per setup (after one warm-up).")
    parser.add_argument("--out", default=None, help="Also write the figures to this JSON file (and the notes' "
                        "markdown next to it, .md).")
    parser.add_argument("--critique_tokens", type=int, default=CRITIQUE_TOKENS,
                        help="The reward model's max_new_tokens (its random adapter writes to the limit).")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=SETUPS,
                        help="Which critics to run (in-process hf and server at least, for the comparison).")
    parser.add_argument("--torch_threads", type=int, default=None,
                        help="torch threads of the PPO process (default: torch's, one per core); 1 avoids threads "
                        "spinning for descheduled siblings on a machine whose cores other jobs hold.")
    parser.add_argument("--report_from", default=None, help="Only print the markdown of a JSON file an earlier run wrote.")
    args = parser.parse_args()
    if args.report_from:
        print(report(json.loads(Path(args.report_from).read_text())), end="")
        return
    if not vllm_available():
        raise SystemExit("vllm is not importable: install the vllm extra (see env.sh)")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    rl = generate_task(TaskConfig(seed=0, n_train=8, n_rl=64, n_eval=1))["rl"]
    items = [{"prompt": apply_chat_template(tokenizer, r["prompt"]), "feedback_prompt": r["prompt"]} for r in rl]
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "command": shlex.join(["python", "benchmarks/critic_server.py", *sys.argv[1:]]),
        "load_before": [round(x, 2) for x in os.getloadavg()],  # benchmarks/results_tables.py reads it: idle or shared
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} torch threads",
        "model": "SmolLM2-135M-Instruct policy (LoRA r16) and reward model (LoRA r16), fp32",
        "ppo_iteration": {},
    }
    options = dict(max_new_tokens=args.critique_tokens, dtype="fp32", tokenizer_name_or_path=str(path))
    results["critique_tokens"], results["timed_iterations"] = args.critique_tokens, args.iterations
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        adapter = make_adapter(path, work / "rm")
        for setup in [s for s in SETUPS if s in args.setups]:
            server = None
            if setup == "in-process hf":
                critic = GenerativeRewardModel.from_pretrained(str(adapter), batch_size=64, **options)
            elif setup == "in-process vllm":
                critic = GenerativeRewardModel.from_pretrained(
                    str(adapter), backend="vllm", vllm_kwargs=dict(gpu_memory_utilization=0.3, cpu_kv_cache_gb=1.0), **options)
            else:
                close_shared_engine()  # the in-process engine's cores go back before the server starts
                cfg = ServeCriticConfig(reward_model=str(adapter), served_model_name="bench-critic", port=0,
                                        dtype="float32", max_model_len=2048, cpu_kv_cache_gb=1)
                with (work / "server.log").open("w") as log:
                    server = CriticServer(cfg, log=log)
                    start = time.perf_counter()
                    base_url = server.start()
                results["server_startup_seconds"] = time.perf_counter() - start
                critic = GenerativeRewardModel.from_pretrained(str(adapter), backend="openai", base_url=base_url,
                                                               model="bench-critic", **options)
            try:
                results["ppo_iteration"][setup] = ppo_iterations(critic, path, items, args.iterations, work / setup)
            finally:
                if server is not None:
                    server.stop()
            print(f"{setup}: {results['ppo_iteration'][setup]}", flush=True)
    close_shared_engine()
    results["load_after"] = [round(x, 2) for x in os.getloadavg()]
    notes = report(results)
    print(notes, end="")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        out.with_suffix(".md").write_text(notes)


if __name__ == "__main__":
    main()
