"""What does the token-level path cost? Text2Grad PPO (``nl_gradient``) vs scalar PPO (``scalar``), same run.

Both modes use the same model, prompts, seed and critic (the reference-summary critic, so the
feedback call itself is cheap and the comparison isolates the trainer). ``scalar`` puts one score at the last
token and does no span alignment; ``nl_gradient`` decodes every sampled id with offsets, locates the quoted
spans and builds per-token rewards. Timing: one process holds a trainer per mode and alternates their
iterations (so load drift on a shared machine hits both alike; the first iteration of each is a discarded
warm-up). Memory: one more process per mode, so each peak is that mode's alone.

    python benchmarks/ppo_token_level_overhead.py                    # defaults below, a few minutes on 2 cores
    python benchmarks/ppo_token_level_overhead.py --hidden 512 --layers 8 --response_length 128

Timings are CPU seconds of the worker process by default (``--clock cpu`` with one torch thread), which
other jobs on a shared machine do not inflate; ``--clock wall`` gives wall-clock time on a quiet machine or GPU.
Printed figures: seconds per iteration (total, feedback, reward building, everything else), the overhead of
nl_gradient beyond the feedback call, ``(iter - feedback)_nl / (iter - feedback)_scalar - 1``, the reward-
building time as a share of the scalar iteration, and the peak resident memory of each process (peak GPU
memory too on CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.result_file import run_context, write_result  # noqa: E402

import policy_optimization.trainer as trainer_module  # noqa: E402
from annotation.critics import ReferenceSummaryCritic  # noqa: E402
from policy_optimization.ppo_config import PPOConfig  # noqa: E402
from policy_optimization.models import ValueModel  # noqa: E402
from policy_optimization.trainer import NLGradientPPOTrainer  # noqa: E402
from text2grad.core.modeling import build_tiny_llama, train_tokenizer  # noqa: E402

WORDS = (
    "the author moved to berlin last year and wants a new job but the partner worries about money rent savings "
    "city friends family work weekend plans dog car flat piano bike summer winter school teacher doctor"
).split()


def make_records(n: int) -> list[dict]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        post = " ".join(rng.choice(WORDS) for _ in range(40))
        reference = " ".join(rng.choice(WORDS) for _ in range(20))
        out.append({"id": str(i), "prompt": f"POST: {post}\nTL;DR:", "reference": reference})
    return out


def build_trainer(args: argparse.Namespace, mode: str, out: str):
    records = make_records(64)
    tok = train_tokenizer([r["prompt"] + " " + r["reference"] for r in records], vocab_size=args.vocab, kind="bpe")
    size = dict(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads)
    policy = build_tiny_llama(tok, **size, seed=0)
    value = ValueModel.from_causal_lm(build_tiny_llama(tok, **size, seed=1))
    critic = ReferenceSummaryCritic({r["prompt"]: r["reference"] for r in records}, min_ngram=1)
    cfg = PPOConfig(
        output_dir=out, overwrite_output_dir=True, reward_mode=mode, num_iterations=args.iterations + 1,
        batch_size=args.batch_size, num_mini_batches=2, num_ppo_epochs=2, response_length=args.response_length,
        temperature=1.0, learning_rate=1e-4, seed=0, save_steps=0, progress_bar=False, log_samples=0,
    )
    trainer = NLGradientPPOTrainer(cfg, tok, policy, None, value, critic, [{"prompt": r["prompt"]} for r in records])
    trainer._start_run()
    return trainer


KEYS = ("time/total", "time/feedback", "time/rewards", "time/generation", "time/forward", "time/update", "response/length_mean")


def worker(args: argparse.Namespace) -> None:
    """``--worker timing``: both modes in this process, steps alternating (machine-load drift hits both alike).
    ``--worker <mode>``: one mode alone, for its peak memory. Prints one JSON line."""
    torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        # The trainer times its phases with time.perf_counter; on a shared machine wall-clock time measures the
        # neighbours. CPU time of this process (one thread) measures the work.
        trainer_module.time.perf_counter = time.process_time
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = ("nl_gradient", "scalar") if args.worker == "timing" else (args.worker,)
    trainers = {m: build_trainer(args, m, str(Path(args.out) / m)) for m in modes}
    for t in trainers.values():
        t.step()  # warm-up: first-call allocations and lazy initialisation
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(args.iterations):
        for m in modes if i % 2 == 0 else modes[::-1]:
            rows[m].append(trainers[m].step())
    result = {m: {k: [r[k] for r in rows[m]] for k in KEYS} for m in modes}
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    result["device"] = device
    print("RESULT " + json.dumps(result), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--response_length", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=8, help="measured iterations per mode per timing process")
    parser.add_argument("--rounds", type=int, default=1, help="timing processes")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="cpu: process CPU time (robust to other load; use with 1 thread); wall: wall-clock")
    parser.add_argument("--worker", choices=["timing", "nl_gradient", "scalar"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--output_json", default=None, help="also write the figures with machine, date, command and load averages here (a result "
                             "file for benchmarks/results/, read by benchmarks/results_tables.py)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    root = Path(__file__).resolve().parents[1]
    context = run_context()

    def run(kind: str, iterations: int, tmp: str) -> dict:
        cmd = [sys.executable, __file__, "--worker", kind, "--out", str(Path(tmp) / kind), f"--iterations={iterations}"]
        cmd += [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "heads", "vocab", "batch_size", "response_length", "threads", "clock")]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"worker {kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        print(f"{kind}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        return json.loads(line[len("RESULT "):])

    with tempfile.TemporaryDirectory() as tmp:
        timing = [run("timing", args.iterations, f"{tmp}/t{r}") for r in range(args.rounds)]
        memory = {m: run(m, 2, f"{tmp}/m") for m in ("nl_gradient", "scalar")}

    def mean(mode: str, key: str) -> float:
        return statistics.mean(v for res in timing for v in res[mode][key])

    table = {}
    for mode in ("nl_gradient", "scalar"):
        total, feedback, rewards = mean(mode, "time/total"), mean(mode, "time/feedback"), mean(mode, "time/rewards")
        table[mode] = dict(
            total=total, feedback=feedback, rewards=rewards, generation=mean(mode, "time/generation"),
            update=mean(mode, "time/update"), length=mean(mode, "response/length_mean"),
            rss=memory[mode]["peak_rss_mb"], cuda=memory[mode]["peak_cuda_mb"],
        )
    nl, sc = table["nl_gradient"], table["scalar"]
    overhead = (nl["total"] - nl["feedback"]) / (sc["total"] - sc["feedback"]) - 1
    reward_share = (nl["rewards"] - sc["rewards"]) / (sc["total"] - sc["feedback"])
    # Iterations i of the two modes ran back to back, so their ratio cancels most load drift; report the median.
    paired = [
        (a - fa) / (b - fb) - 1
        for res in timing
        for a, fa, b, fb in zip(res["nl_gradient"]["time/total"], res["nl_gradient"]["time/feedback"],
                                res["scalar"]["time/total"], res["scalar"]["time/feedback"])
    ]
    n_iter = args.iterations * args.rounds
    cuda_col = sc["cuda"] is not None
    print(f"\nPPO iteration, nl_gradient vs scalar, same critic (the reference critic), {n_iter} measured iterations "
          f"per mode, alternating in one process ({args.rounds} process(es)); peak memory from one process per mode")
    print(f"model: Llama hidden={args.hidden} layers={args.layers} vocab={args.vocab}; batch={args.batch_size}, "
          f"response_length={args.response_length}, 2 minibatches x 2 PPO epochs; device={timing[0]['device']}, "
          f"threads={args.threads}, clock={args.clock}, python {platform.python_version()}")
    print("\n| mode | s / iteration | feedback call | reward building | generation | update | mean response tokens | peak RSS (MB) |"
          + (" peak CUDA (MB) |" if cuda_col else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if cuda_col else ""))
    for mode, row in table.items():
        cuda = f" {row['cuda']:.0f} |" if cuda_col else ""
        print(f"| {mode} | {row['total']:.3f} | {row['feedback']:.4f} | {row['rewards']:.4f} | {row['generation']:.3f} | "
              f"{row['update']:.3f} | {row['length']:.1f} | {row['rss']:.0f} |{cuda}")
    print(f"\noverhead of nl_gradient beyond the feedback call: {100 * overhead:+.1f} % "
          "((iteration - feedback)_nl / (iteration - feedback)_scalar - 1; goal < 5 %)")
    print(f"median over back-to-back iteration pairs: {100 * statistics.median(paired):+.1f} % "
          f"(min {100 * min(paired):+.1f} %, max {100 * max(paired):+.1f} %)")
    print(f"token-level reward building alone: {100 * reward_share:.2f} % of a scalar iteration (without its feedback call)")
    print(f"peak RSS difference: {nl['rss'] - sc['rss']:+.0f} MB")
    if args.output_json:
        settings = {k: getattr(args, k) for k in ("hidden", "layers", "heads", "vocab", "batch_size", "response_length",
                                                  "iterations", "rounds", "threads", "clock")}
        write_result(args.output_json, context, {
            "settings": settings, "modes": table, "overhead_beyond_feedback": overhead,
            "paired_overhead_median": statistics.median(paired), "reward_building_share": reward_share,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
