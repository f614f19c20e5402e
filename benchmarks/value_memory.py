"""Memory of the value function: a head on the policy's own LoRA backbone vs a separate value model, side by side.

Both designs run the same PPO iteration on SmolLM2-135M-Instruct (offline, `text2grad.core.assets`): LoRA policy,
the same prompts, seed and a cheap deterministic critic (so the figures are the trainer's, not a reward
model's). Each design runs in its own fresh subprocess, so each peak resident set size (RSS) is that design's
alone; the two subprocesses run one after the other in one invocation.

    python benchmarks/value_memory.py                           # 2 iterations, batch 8, 48 new tokens
    python benchmarks/value_memory.py --batch_size 4 --response_length 32 --iterations 1

Printed per design: peak RSS of the process, RSS after the models are built (before the first iteration),
the growth during PPO, trainable parameters, and bytes of parameters + gradients + AdamW states that torch holds
for the trainable parts (exact accounting from the tensors, independent of the allocator), and seconds per iteration.
On CUDA the peak allocated GPU memory is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import torch

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.models import ValueModel
from policy_optimization.trainer import NLGradientPPOTrainer
from text2grad.core.assets import smollm2_path
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.feedback import Feedback
from text2grad.core.generation import apply_chat_template
from text2grad.core.modeling import load_causal_lm, load_tokenizer

PROMPTS = [
    "Summarize in one sentence: the city council voted to build a new library next to the old train station.",
    "Give two reasons why people keep a diary.",
    "Explain what a compiler does to a ten-year-old.",
    "Write a short title for a post about learning to bake bread at home.",
    "What should I pack for a weekend of hiking in the rain?",
    "Describe the smell of coffee in a few words.",
    "Name a good habit for studying and say why it helps.",
    "Tell me one fact about octopuses.",
]


def _rss_mb() -> float:
    """Current resident set size (Linux /proc), in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def worker(design: str, args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    path = str(smollm2_path())
    tokenizer = load_tokenizer(path)

    def first_and_last(prompt: str, response: str) -> Feedback:
        words = response.split()
        return Feedback(critique="edges", good_spans=tuple(words[:1]), poor_spans=tuple(words[-1:]) if len(words) > 1 else ())

    out = tempfile.mkdtemp(prefix=f"value-memory-{design}-")
    cfg = PPOConfig(
        model_name_or_path=path, use_lora=True, lora_r=16, lora_alpha=32, value_model=design, dtype="fp32",
        use_chat_template=True, num_iterations=args.iterations, batch_size=args.batch_size, num_mini_batches=2,
        num_ppo_epochs=1, response_length=args.response_length, temperature=1.0, learning_rate=1e-4,
        gradient_checkpointing=args.gradient_checkpointing, save_steps=0, log_samples=0, progress_bar=False,
        output_dir=out, seed=0,
    )
    policy = load_causal_lm(path, dtype="fp32")
    value = ValueModel.from_pretrained(path, dtype="fp32") if design == "separate" else None
    records = [{"prompt": apply_chat_template(tokenizer, p)} for p in PROMPTS]
    records = (records * (args.batch_size // len(records) + 1))[: max(args.batch_size, len(records))]
    trainer = NLGradientPPOTrainer(cfg, tokenizer, policy, None, value, CallableFeedbackSource(first_and_last), records)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    rss_loaded = _rss_mb()
    times = []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        metrics = trainer.step()
        times.append(time.perf_counter() - t0)
    optimizer_bytes = sum(
        t.numel() * t.element_size() for state in trainer.optimizer.state.values() for t in state.values() if torch.is_tensor(t)
    )
    result = {
        "design": design,
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "rss_after_models_mb": round(rss_loaded, 1),
        "growth_during_ppo_mb": round(_peak_rss_mb() - rss_loaded, 1),
        "trainable_params": sum(p.numel() for p in trainable),
        "all_params": sum(p.numel() for p in trainer.model.parameters()),
        "trainable_weights_grads_adam_mb": round(
            (sum(p.numel() * p.element_size() for p in trainable) * 2 + optimizer_bytes) / 2**20, 1
        ),
        "seconds_per_iteration": round(sum(times) / len(times), 1),
        "loss_value": metrics["loss/value"],
    }
    if torch.cuda.is_available():
        result["peak_gpu_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--response_length", type=int, default=48)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--worker", choices=["shared_backbone", "separate"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args)), flush=True)
        return

    smollm2_path()  # convert once before timing anything
    results = []
    for design in ("shared_backbone", "separate"):
        argv = [sys.executable, __file__, "--worker", design, "--batch_size", str(args.batch_size),
                "--response_length", str(args.response_length), "--iterations", str(args.iterations),
                "--threads", str(args.threads)] + (["--gradient_checkpointing"] if args.gradient_checkpointing else [])
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            sys.exit(f"worker {design} failed:\n{proc.stderr[-4000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
        print(f"{design}: {json.dumps(results[-1])}", flush=True)  # as soon as it is known
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}; "
          f"batch {args.batch_size}, {args.response_length} new tokens, {args.iterations} iterations, LoRA r=16, fp32")
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    shared, separate = results
    print(f"separate / shared peak RSS: {separate['peak_rss_mb'] / shared['peak_rss_mb']:.2f}x "
          f"(+{separate['peak_rss_mb'] - shared['peak_rss_mb']:.0f} MiB)")


if __name__ == "__main__":
    main()
