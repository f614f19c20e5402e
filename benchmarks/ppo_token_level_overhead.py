"""What does the token-level path cost? Text2Grad PPO (``nl_gradient``) vs scalar PPO (``scalar``), same run.

Both modes use the same model, prompts, seed and critic (the reference-summary critic, so the
feedback call itself is cheap and the comparison isolates the trainer). ``scalar`` puts one score at the last
token and does no span alignment; ``nl_gradient`` decodes every sampled id with offsets, locates the quoted
spans and builds per-token rewards. Timing: one process holds a trainer per mode and alternates their
iterations (so load drift on a shared machine hits both alike; the first iteration of each is a discarded
warm-up). Memory: one more process per mode, so each peak is that mode's alone.

    python benchmarks/ppo_token_level_overhead.py                    # defaults below, a few minutes on 2 cores
    python benchmarks/ppo_token_level_overhead.py --hidden 512 --layers 8 --response_length 128
    python benchmarks/ppo_token_level_overhead.py --preset gpu-1b     # one GPU, bf16, 2.2 B parameters: ~2 minutes

On a GPU (``--device cuda``) the two modes score the SAME sampled responses (``--same_responses``: whichever mode
samples an iteration's prompts first, the other replays those generations), so the compared time, the iteration
without its feedback call and without generation, runs on identical token sequences; response length cannot pass
for overhead. Peak GPU memory is read in the timing process around each step (``--memory_phase off``, the GPU
default: a second process per mode at this size would double the run time); the CPU default keeps the separate
memory processes. Each worker prints every iteration as it goes and has its own time limit (``--worker_timeout_s``).

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
import math
import os
import platform
import random
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

import policy_optimization.trainer as trainer_module  # noqa: E402
from annotation.critics import ReferenceSummaryCritic  # noqa: E402
from benchmarks.result_file import peak_rss_mb, run_context, write_result  # noqa: E402
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
    trainer.start_run()
    return trainer


def share_responses(trainers: dict[str, NLGradientPPOTrainer]) -> dict[str, int]:
    """Make the trainers score the same sampled responses: the first to ask for a batch of prompts samples it, the
    next one asking for the same prompts replays those generations. Returns counters (batches shared, sampled
    alone) that fill in as the run goes, so the report says how many comparisons ran on identical responses."""
    pending: dict[tuple[str, ...], list] = {}
    counts = {"shared": 0, "alone": 0, "sampled": 0}
    for trainer in trainers.values():
        sample = trainer._generate

        def replay(prompts, sample=sample):
            key = tuple(prompts)
            if key in pending:
                counts["shared"] += 1
                return pending.pop(key)
            generations = sample(prompts)
            counts["sampled"] += 1
            if len(trainers) > 1:
                pending.clear()  # a batch the other mode never asked for is not kept around
                pending[key] = generations
            else:
                counts["alone"] += 1
            return generations

        trainer._generate = replay
    return counts


def parameter_count(trainer: NLGradientPPOTrainer) -> int:
    return sum(p.numel() for p in trainer.accelerator.unwrap_model(trainer.model).parameters())


KEYS = ("time/total", "time/feedback", "time/rewards", "time/generation", "time/forward", "time/update", "response/length_mean",
        "sampled")


def worker(args: argparse.Namespace) -> None:
    """``--worker timing``: both modes in this process, steps alternating (machine-load drift hits both alike).
    ``--worker <mode>``: one mode alone, for its peak memory. Prints one JSON line, and each iteration on stderr."""
    torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        # The trainer times its phases with time.perf_counter; on a shared machine wall-clock time measures the
        # neighbours. CPU time of this process (one thread) measures the work.
        trainer_module.time.perf_counter = time.process_time
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = ("nl_gradient", "scalar") if args.worker == "timing" else (args.worker,)
    trainers = {m: build_trainer(args, m, str(Path(args.out) / m)) for m in modes}
    shared = share_responses(trainers) if args.same_responses == "on" else None
    params = parameter_count(next(iter(trainers.values())))
    print(f"[{args.worker}] {len(trainers)} trainer(s) of {params / 1e6:.0f} M parameters each on {device}", file=sys.stderr, flush=True)
    for m, t in trainers.items():
        t0 = time.perf_counter()
        t.step()  # warm-up: first-call allocations and lazy initialisation
        print(f"[{args.worker}] warm-up {m}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if shared is not None:
        shared.update(shared=0, alone=0, sampled=0)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    step_peak_mb: dict[str, float] = {m: 0.0 for m in modes}
    for i in range(args.iterations):
        for m in modes if i % 2 == 0 else modes[::-1]:
            if device == "cuda":
                torch.cuda.synchronize()
                resident = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            sampled_before = shared["sampled"] if shared is not None else 0
            row = dict(trainers[m].step())
            row["sampled"] = float(shared is None or shared["sampled"] > sampled_before)
            if device == "cuda":
                torch.cuda.synchronize()
                step_peak_mb[m] = max(step_peak_mb[m], (torch.cuda.max_memory_allocated() - resident) / 2**20)
            rows[m].append(row)
            print(f"[{args.worker}] iteration {i + 1}/{args.iterations} {m}: {row['time/total']:.3f} s "
                  f"(generation {row['time/generation']:.3f}, feedback {row['time/feedback']:.4f}, rewards "
                  f"{row['time/rewards']:.4f}), {row['response/length_mean']:.1f} response tokens", file=sys.stderr, flush=True)
    result = {m: {k: [r[k] for r in rows[m]] for k in KEYS} for m in modes}
    result["peak_rss_mb"] = peak_rss_mb()
    result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    result["resident_cuda_mb"] = torch.cuda.memory_allocated() / 2**20 if device == "cuda" else None
    result["step_peak_cuda_mb"] = step_peak_mb if device == "cuda" else None
    result["device"] = device
    result["gpu"] = torch.cuda.get_device_name(0) if device == "cuda" else None
    result["parameters_per_model"] = params
    result["responses"] = shared
    print("RESULT " + json.dumps(result), flush=True)


PRESETS = {
    # A Llama built from a config, hidden 2048, 16 layers, vocabulary 32k: 2.16 B parameters per model as measured
    # on an H200, fully trained (no LoRA), bf16 autocast: 113 s there for both modes, warm-up included.
    "gpu-1b": dict(hidden=2048, layers=16, heads=16, vocab=32000, batch_size=16, response_length=64, iterations=3,
                   clock="wall", device="cuda", precision="bf16"),
}


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
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: cuda when a GPU is visible; cpu hides the GPUs from the workers")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (accelerate)")
    parser.add_argument("--same_responses", choices=["auto", "on", "off"], default="auto",
                        help="both modes score the same sampled responses (auto: on with cuda, off on cpu)")
    parser.add_argument("--memory_phase", choices=["auto", "on", "off"], default="auto",
                        help="one more process per mode for its own peak memory (auto: on for cpu, off for cuda)")
    parser.add_argument("--worker_timeout_s", type=float, default=1800.0, help="time limit of each worker process")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="sizes and settings for a GPU (overrides the flags)")
    parser.add_argument("--output_json", default=None, help="also write the figures with machine, date, command and load averages here (a result "
                             "file for benchmarks/results/, read by benchmarks/results_tables.py)")
    parser.add_argument("--worker", choices=["timing", "nl_gradient", "scalar"], help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.preset:
        for key, value in PRESETS[args.preset].items():
            setattr(args, key, value)
    if args.worker:
        worker(args)
        return 0
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda, but torch {torch.__version__} sees no CUDA GPU (README: On a GPU node)", file=sys.stderr)
        return 2
    on_gpu = args.device == "cuda"
    if args.same_responses == "auto":
        args.same_responses = "on" if on_gpu else "off"
    if args.memory_phase == "auto":
        args.memory_phase = "off" if on_gpu else "on"
    worker_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_MIXED_PRECISION": "bf16" if args.precision == "bf16" else "no"}
    if not on_gpu:
        worker_env["CUDA_VISIBLE_DEVICES"] = ""

    root = ROOT
    context = run_context()

    def run(kind: str, iterations: int, tmp: str) -> dict:
        cmd = [sys.executable, __file__, "--worker", kind, "--out", str(Path(tmp) / kind), f"--iterations={iterations}"]
        cmd += [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "heads", "vocab", "batch_size", "response_length",
                                                      "threads", "clock", "same_responses")]
        t0 = time.perf_counter()
        print(f"{kind}: started (time limit {args.worker_timeout_s:.0f} s)", file=sys.stderr, flush=True)
        try:  # the worker's progress goes straight to our stderr; its result line comes on stdout
            proc = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, text=True, env=worker_env,
                                  timeout=args.worker_timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"worker {kind} ran past --worker_timeout_s {args.worker_timeout_s:.0f} s: use smaller sizes "
                               "or fewer --iterations") from None
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"worker {kind} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
        print(f"{kind}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        return json.loads(line[len("RESULT "):])

    with tempfile.TemporaryDirectory() as tmp:
        timing = [run("timing", args.iterations, f"{tmp}/t{r}") for r in range(args.rounds)]
        print_table(args, timing, None)  # the timing figures now, in case the memory phase is cut
        memory = {m: run(m, 2, f"{tmp}/m") for m in ("nl_gradient", "scalar")} if args.memory_phase == "on" else None
    if memory is not None:
        figures = print_table(args, timing, memory)
    else:
        figures = print_table(args, timing, None, quiet=True)
    if args.output_json:
        write_result(args.output_json, context, figures)
    return 0


def print_table(args: argparse.Namespace, timing: list[dict], memory: dict | None, quiet: bool = False) -> dict:
    """Print the comparison (timing, and the memory columns once ``memory`` is in) and return its figures."""
    emit = (lambda *a, **k: None) if quiet else print

    def mean(mode: str, key: str) -> float:
        return statistics.mean(v for res in timing for v in res[mode][key])

    first = timing[0]
    table = {}
    for mode in ("nl_gradient", "scalar"):
        total, feedback, rewards = mean(mode, "time/total"), mean(mode, "time/feedback"), mean(mode, "time/rewards")
        length = mean(mode, "response/length_mean")
        table[mode] = dict(
            total=total, feedback=feedback, rewards=rewards, generation=mean(mode, "time/generation"),
            update=mean(mode, "time/update"), length=length, tokens_per_s=args.batch_size * length / total,
            rss=memory[mode]["peak_rss_mb"] if memory else first["peak_rss_mb"],
            cuda=memory[mode]["peak_cuda_mb"] if memory else (first["step_peak_cuda_mb"] or {}).get(mode),
        )
    nl, sc = table["nl_gradient"], table["scalar"]
    overhead = (nl["total"] - nl["feedback"]) / (sc["total"] - sc["feedback"]) - 1
    reward_share = (nl["rewards"] - sc["rewards"]) / (sc["total"] - sc["feedback"])
    # Without generation and the feedback call: on the same responses (--same_responses on), identical sequences.
    rest = {m: table[m]["total"] - table[m]["feedback"] - table[m]["generation"] for m in table}
    same_overhead = rest["nl_gradient"] / rest["scalar"] - 1
    responses = first.get("responses")
    identical = bool(responses) and responses["alone"] == 0 and responses["shared"] == args.iterations * args.rounds
    # Iterations i of the two modes ran back to back, so their ratio cancels most load drift; report the median.
    paired = [
        (a - fa) / (b - fb) - 1
        for res in timing
        for a, fa, b, fb in zip(res["nl_gradient"]["time/total"], res["nl_gradient"]["time/feedback"],
                                res["scalar"]["time/total"], res["scalar"]["time/feedback"])
    ]
    paired_rest = [
        (a - fa - ga) / (b - fb - gb) - 1
        for res in timing
        for a, fa, ga, b, fb, gb in zip(*(res[m][k] for m in ("nl_gradient", "scalar")
                                          for k in ("time/total", "time/feedback", "time/generation")))
    ]
    if responses:  # one mode sampled each batch: a full iteration is the rest plus a sampling's generation time
        sampled = [g for res in timing for m in table for g, did in zip(res[m]["time/generation"], res[m]["sampled"]) if did]
        generation = statistics.mean(sampled) if sampled else math.nan
        for mode, row in table.items():
            row["generation"] = generation
            row["total"] = rest[mode] + row["feedback"] + generation
            row["tokens_per_s"] = args.batch_size * row["length"] / row["total"]
    n_iter = args.iterations * args.rounds
    cuda_col = sc["cuda"] is not None
    memory_note = ("peak memory from one process per mode" if memory else
                   "peak GPU memory: the most a step of that mode allocated beyond what was resident (both trainers' "
                   "models); peak RSS of the timing process")
    emit(f"\nPPO iteration, nl_gradient vs scalar, same critic (the reference critic), {n_iter} measured iterations "
         f"per mode, alternating in one process ({args.rounds} process(es)); {memory_note}")
    emit(f"model: Llama hidden={args.hidden} layers={args.layers} vocab={args.vocab} "
         f"({first['parameters_per_model'] / 1e6:.0f} M parameters per model); batch={args.batch_size}, "
         f"response_length={args.response_length}, 2 minibatches x 2 PPO epochs; device={first['device']}"
         f"{' (' + first['gpu'] + ')' if first.get('gpu') else ''}, precision={args.precision}, threads={args.threads}, "
         f"clock={args.clock}, python {platform.python_version()}")
    if responses:
        emit(f"responses: {'the same sampled responses scored by both modes' if identical else 'NOT all shared'} "
             f"({responses['shared']} batch(es) replayed, {responses['alone']} sampled for one mode only); generation "
             "and s / iteration use the mean time of the samplings")
    emit("\n| mode | s / iteration | tokens / s | feedback call | reward building | generation | update | mean response tokens "
         "| peak RSS (MB) |" + (" peak GPU (MB) |" if cuda_col else ""))
    emit("|---|---|---|---|---|---|---|---|---|" + ("---|" if cuda_col else ""))
    for mode, row in table.items():
        cuda = f" {row['cuda']:.0f} |" if cuda_col else ""
        emit(f"| {mode} | {row['total']:.3f} | {row['tokens_per_s']:.1f} | {row['feedback']:.4f} | {row['rewards']:.4f} | "
             f"{row['generation']:.3f} | {row['update']:.3f} | {row['length']:.1f} | {row['rss']:.0f} |{cuda}")
    if not quiet and not memory and first.get("resident_cuda_mb") is not None:
        emit(f"resident GPU memory (both trainers): {first['resident_cuda_mb']:.0f} MB; the timing process's peak: "
             f"{first['peak_cuda_mb']:.0f} MB")
    length_gap = nl["length"] / sc["length"] - 1
    if responses:
        emit(f"\noverhead of nl_gradient on the same responses, without generation and the feedback call: "
             f"{100 * same_overhead:+.1f} % ((iteration - feedback - generation)_nl / (...)_scalar - 1; goal < 5 %)")
        emit(f"median over back-to-back iteration pairs: {100 * statistics.median(paired_rest):+.1f} % "
             f"(min {100 * min(paired_rest):+.1f} %, max {100 * max(paired_rest):+.1f} %)")
    else:
        emit(f"\noverhead of nl_gradient beyond the feedback call: {100 * overhead:+.1f} % "
             "((iteration - feedback)_nl / (iteration - feedback)_scalar - 1; goal < 5 %)")
        emit(f"median over back-to-back iteration pairs: {100 * statistics.median(paired):+.1f} % "
             f"(min {100 * min(paired):+.1f} %, max {100 * max(paired):+.1f} %)")
        emit(f"mean response tokens differ by {100 * length_gap:+.1f} % (nl_gradient vs scalar: each mode sampled its own "
             f"responses); without generation the difference is {100 * same_overhead:+.1f} % (--same_responses on "
             "scores the same responses both ways)")
    emit(f"token-level reward building alone: {100 * reward_share:.2f} % of a scalar iteration (without its feedback call)")
    emit(f"peak RSS difference: {nl['rss'] - sc['rss']:+.0f} MB")
    return {
        "settings": {k: getattr(args, k) for k in ("hidden", "layers", "heads", "vocab", "batch_size", "response_length",
                                                    "iterations", "rounds", "clock", "device", "precision", "same_responses",
                                                    "memory_phase")},
        "device": first["device"], "gpu": first.get("gpu"), "parameters_per_model": first["parameters_per_model"],
        "modes": table, "responses": responses, "same_responses_identical": identical,
        "overhead_beyond_feedback": None if responses else overhead,
        "overhead_same_responses_without_generation": same_overhead if responses else None,
        "overhead_without_generation": same_overhead, "response_length_gap": length_gap,
        "reward_building_share": reward_share,
        "paired_overhead_median": statistics.median(paired_rest if responses else paired),
        "resident_cuda_mb": first.get("resident_cuda_mb"), "peak_cuda_mb": first.get("peak_cuda_mb"),
    }


if __name__ == "__main__":
    sys.exit(main())
