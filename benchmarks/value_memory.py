"""Memory of the value function: a head on the policy's own LoRA backbone vs a separate value model, side by side.

Both designs run the same PPO iteration on SmolLM2-135M-Instruct (offline, `text2grad.core.assets`): LoRA policy,
the same prompts, seed and a cheap deterministic critic (so the figures are the trainer's, not a reward
model's). Each design runs in its own fresh subprocess, so each peak resident set size (RSS) is that design's
alone; the two subprocesses run one after the other in one invocation.

    python benchmarks/value_memory.py                           # 2 iterations, batch 8, 48 new tokens
    python benchmarks/value_memory.py --batch_size 4 --response_length 32 --iterations 1
    python benchmarks/value_memory.py --preset gpu-1b             # one GPU: a ~1B Llama from a config, bf16, ~3 min

GPU mode (``--device cuda``, or ``--preset gpu-1b``): the same two designs on a Llama built from a config
(``--model llama``: no download; hidden 2048, 16 layers: ~1B parameters with the benchmark's small vocabulary),
LoRA policy, bf16 autocast (``--precision bf16``), with the peak allocated GPU memory of each design's process.
Each worker prints its iterations as they run and has a time limit (``--worker_timeout_s``).

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
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.result_file import peak_rss_mb, rss_mb, worker_result  # noqa: E402
from policy_optimization.ppo_config import PPOConfig  # noqa: E402
from policy_optimization.models import ValueModel  # noqa: E402
from policy_optimization.trainer import NLGradientPPOTrainer  # noqa: E402
from text2grad.core.assets import smollm2_path  # noqa: E402
from text2grad.core.critics import CallableFeedbackSource  # noqa: E402
from text2grad.core.feedback import Feedback  # noqa: E402
from text2grad.core.generation import apply_chat_template  # noqa: E402
from text2grad.core.modeling import build_tiny_llama, load_causal_lm, load_tokenizer, train_tokenizer  # noqa: E402

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


def worker(design: str, args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    if args.model == "llama":  # built from a config: the trained tokenizer's vocabulary, random weights
        path = None
        tokenizer = train_tokenizer([p * 4 for p in PROMPTS], vocab_size=args.vocab, kind="bpe")
        tokenizer.chat_template = None
    else:
        path = str(smollm2_path())
        tokenizer = load_tokenizer(path)

    def first_and_last(prompt: str, response: str) -> Feedback:
        words = response.split()
        return Feedback(critique="edges", good_spans=tuple(words[:1]), poor_spans=tuple(words[-1:]) if len(words) > 1 else ())

    out = tempfile.mkdtemp(prefix=f"value-memory-{design}-")
    cfg = PPOConfig(
        model_name_or_path=path or "", use_lora=True, lora_r=16, lora_alpha=32, value_model=design, dtype="fp32",
        use_chat_template=path is not None, num_iterations=args.iterations, batch_size=args.batch_size, num_mini_batches=2,
        num_ppo_epochs=1, response_length=args.response_length, temperature=1.0, learning_rate=1e-4,
        gradient_checkpointing=args.gradient_checkpointing, save_steps=0, log_samples=0, progress_bar=False,
        output_dir=out, seed=0,
    )
    if path is None:
        size = dict(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads)
        policy = build_tiny_llama(tokenizer, **size, seed=0)
        value = ValueModel.from_causal_lm(build_tiny_llama(tokenizer, **size, seed=1)) if design == "separate" else None
        records = [{"prompt": p} for p in PROMPTS]
    else:
        policy = load_causal_lm(path, dtype="fp32")
        value = ValueModel.from_pretrained(path, dtype="fp32") if design == "separate" else None
        records = [{"prompt": apply_chat_template(tokenizer, p)} for p in PROMPTS]
    records = (records * (args.batch_size // len(records) + 1))[: max(args.batch_size, len(records))]
    trainer = NLGradientPPOTrainer(cfg, tokenizer, policy, None, value, CallableFeedbackSource(first_and_last), records)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    rss_loaded = rss_mb()
    times = []
    for i in range(args.iterations):
        t0 = time.perf_counter()
        metrics = trainer.step()
        times.append(time.perf_counter() - t0)
        gpu = f", peak GPU {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB" if torch.cuda.is_available() else ""
        print(f"[{design}] iteration {i + 1}/{args.iterations}: {times[-1]:.1f} s, RSS {rss_mb():.0f} MiB{gpu}",
              file=sys.stderr, flush=True)
    optimizer_bytes = sum(
        t.numel() * t.element_size() for state in trainer.optimizer.state.values() for t in state.values() if torch.is_tensor(t)
    )
    result = {
        "design": design,
        "peak_rss_mb": round(peakrss_mb(), 1),
        "rss_after_models_mb": round(rss_loaded, 1),
        "growth_during_ppo_mb": round(peakrss_mb() - rss_loaded, 1),
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
        result["gpu"] = torch.cuda.get_device_name(0)
    return result


PRESETS = {
    # ~1B-parameter Llama from a config, LoRA, bf16 autocast, on one GPU: about three minutes for both designs.
    "gpu-1b": dict(model="llama", hidden=2048, layers=16, heads=16, batch_size=16, response_length=64, iterations=2,
                   device="cuda", precision="bf16"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--response_length", type=int, default=48)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--model", choices=["smollm2", "llama"], default="smollm2",
                        help="smollm2: SmolLM2-135M-Instruct (the offline asset); llama: built from a config (--hidden ...)")
    parser.add_argument("--hidden", type=int, default=2048, help="--model llama: hidden size")
    parser.add_argument("--layers", type=int, default=16, help="--model llama: layers")
    parser.add_argument("--heads", type=int, default=16, help="--model llama: attention heads")
    parser.add_argument("--vocab", type=int, default=32000, help="--model llama: tokenizer vocabulary (at most)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: cuda when a GPU is visible; cpu hides the GPUs from the workers")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (accelerate)")
    parser.add_argument("--worker_timeout_s", type=float, default=3600.0, help="time limit of each design's process")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="sizes and settings for a GPU (overrides the flags)")
    parser.add_argument("--worker", choices=["shared_backbone", "separate"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.preset:
        for key, value in PRESETS[args.preset].items():
            setattr(args, key, value)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args)), flush=True)
        return
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda, but torch {torch.__version__} sees no CUDA GPU (README: On a GPU node)", file=sys.stderr)
        sys.exit(2)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_MIXED_PRECISION": "bf16" if args.precision == "bf16" else "no"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""

    if args.model == "smollm2":
        smollm2_path()  # convert once before timing anything
    results = []
    for design in ("shared_backbone", "separate"):
        argv = [sys.executable, __file__, "--worker", design, "--batch_size", str(args.batch_size),
                "--response_length", str(args.response_length), "--iterations", str(args.iterations),
                "--threads", str(args.threads), "--model", args.model, "--hidden", str(args.hidden), "--layers",
                str(args.layers), "--heads", str(args.heads), "--vocab", str(args.vocab)]
        argv += ["--gradient_checkpointing"] if args.gradient_checkpointing else []
        print(f"{design}: started (time limit {args.worker_timeout_s:.0f} s)", file=sys.stderr, flush=True)
        results.append(worker_result(argv, env=env, label=f"worker {design}", timeout_s=args.worker_timeout_s,
                                     too_slow="use smaller sizes or raise --worker_timeout_s"))
        print(f"{design}: {json.dumps(results[-1])}", flush=True)  # as soon as it is known
    model = "SmolLM2-135M-Instruct" if args.model == "smollm2" else f"Llama hidden {args.hidden}, {args.layers} layers (config)"
    gpu = f", GPU {results[0]['gpu']}" if results[0].get("gpu") else ""
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs{gpu}, python {platform.python_version()}; {model}; "
          f"batch {args.batch_size}, {args.response_length} new tokens, {args.iterations} iterations, LoRA r=16, "
          f"{'fp32' if args.precision == 'fp32' else 'fp32 weights, bf16 autocast'}")
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
