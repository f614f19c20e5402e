"""Memory and time of a reward-model refresh's fine-tuning, whole batches vs micro-batches, side by side.

A refresh (`policy_optimization.rm_refresh.fine_tune`) trains the reward model's LoRA adapter for
``rm_refresh_steps`` steps of ``rm_refresh_batch_size`` records. ``rm_refresh_micro_batch_size`` runs each batch in
pieces whose losses add up to the same token mean, so the update is the same and only the activations held at
once shrink. This benchmark runs the same steps on the same records once per piece size, each in a fresh
subprocess (so each peak resident set size is that setting's alone), and prints per setting:

- peak RSS of the process and its growth during the fine-tuning (peak minus the RSS just before it);
- seconds per optimizer step;
- the first and last step's loss (equal across settings up to float summation order: the check that the pieces
  change memory, not the update).

Model: SmolLM2-135M-Instruct (offline, `text2grad.core.assets`) with a fresh LoRA adapter (r=16 on every linear
layer, as the quickstart's reward model), or a trained reward model (``--reward_model DIR``). Records: the quickstart
task's posts with their imperfect SFT summaries and the fact checker's critiques and spans, encoded as the reward
model reads them (its instruction, the chat template).

    python benchmarks/rm_refresh_memory.py                             # batch 8, pieces 8 / 2 / 1, 4 steps
    python benchmarks/rm_refresh_memory.py --micro_batch_sizes 8 4 --steps 2 --output_json /tmp/rm_refresh.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.result_file import peak_rss_mb, rss_mb, run_context, worker_result, write_result  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402

from policy_optimization.rm_refresh import fine_tune  # noqa: E402
from reward_model.serialization import encode_example  # noqa: E402
from text2grad.apps.quickstart.task import TaskConfig, critique_summary, generate_task  # noqa: E402
from text2grad.core.assets import smollm2_path  # noqa: E402
from text2grad.core.modeling import load_causal_lm, load_tokenizer  # noqa: E402


def encoded_records(tokenizer, n: int, seed: int) -> list[dict]:
    """``n`` reward-model training examples from the quickstart task (SFT summaries, fact-checker labels)."""

    records = generate_task(TaskConfig(seed=seed, n_train=n, n_rl=1, n_eval=1))["train"]
    examples = []
    for r in records:
        encoded = encode_example(tokenizer, r["prompt"], r["completion"], critique_summary(r["facts"], r["completion"]),
                                 max_length=2048)
        examples.append(encoded.as_dict())
    return examples


def worker(args: argparse.Namespace, micro_batch_size: int) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.reward_model:
        model = load_causal_lm(args.reward_model, dtype="fp32", trainable_adapter=True)
        tokenizer = load_tokenizer(args.reward_model)
    else:
        path = str(smollm2_path())
        tokenizer = load_tokenizer(path)
        model = get_peft_model(load_causal_lm(path, dtype="fp32"),
                               LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    examples = encoded_records(tokenizer, args.records, args.seed)
    random.Random(args.seed).shuffle(examples)
    rss_before = rss_mb()
    t0 = time.perf_counter()
    losses = fine_tune(model, params, examples, tokenizer.pad_token_id, steps=args.steps, batch_size=args.batch_size,
                       learning_rate=1e-4, seed=args.seed, micro_batch_size=micro_batch_size)
    seconds = time.perf_counter() - t0
    lengths = [len(e["input_ids"]) for e in examples]
    return {
        "micro_batch_size": micro_batch_size,
        "peak_rss_mb": round(peakrss_mb()),
        "rss_before_mb": round(rss_before),
        "growth_mb": round(peakrss_mb() - rss_before),
        "s_per_step": round(seconds / args.steps, 2),
        "loss_first": round(losses["loss_first"], 5),
        "loss_last": round(losses["loss_last"], 5),
        "mean_tokens": round(sum(lengths) / len(lengths), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_size", type=int, default=8, help="records per optimizer step (rm_refresh_batch_size)")
    parser.add_argument("--micro_batch_sizes", type=int, nargs="+", default=[8, 2, 1],
                        help="piece sizes to compare (rm_refresh_micro_batch_size); the first is the reference")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per setting")
    parser.add_argument("--records", type=int, default=16, help="training records (a refresh's new + replayed ones)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reward_model", help="a trained reward model (LoRA output folder); default: SmolLM2 + a new adapter")
    parser.add_argument("--worker_timeout_s", type=float, default=3600.0, help="time limit of each setting's process")
    parser.add_argument("--output_json", help="write the figures, machine and command here")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print("RESULT " + json.dumps(worker(args, args.worker)), flush=True)
        return
    if any(m < 1 or m > args.batch_size for m in args.micro_batch_sizes):
        parser.error(f"every --micro_batch_sizes value must be between 1 and --batch_size ({args.batch_size})")
    context = run_context()
    smollm2_path()  # convert once before timing anything
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
    forwarded = ["--batch_size", str(args.batch_size), "--steps", str(args.steps), "--records", str(args.records),
                 "--threads", str(args.threads), "--seed", str(args.seed)]
    forwarded += ["--reward_model", args.reward_model] if args.reward_model else []
    results = []
    for micro in args.micro_batch_sizes:
        print(f"micro-batch {micro}: started (time limit {args.worker_timeout_s:.0f} s)", file=sys.stderr, flush=True)
        results.append(worker_result([sys.executable, os.path.abspath(__file__), "--worker", str(micro), *forwarded],
                                     env=env, label=f"micro-batch {micro}", timeout_s=args.worker_timeout_s,
                                     too_slow="use fewer --steps or raise --worker_timeout_s"))
        print(json.dumps(results[-1]), flush=True)
    print(f"machine: {context['machine']}; batch {args.batch_size}, {args.steps} steps, {args.records} records of "
          f"{results[0]['mean_tokens']} tokens on average, {args.threads} torch thread(s)")
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    reference = results[0]
    ratios = [{"micro_batch_size": r["micro_batch_size"],
               "growth_ratio": round(r["growth_mb"] / max(1, reference["growth_mb"]), 3),
               "peak_ratio": round(r["peak_rss_mb"] / reference["peak_rss_mb"], 3),
               "time_ratio": round(r["s_per_step"] / reference["s_per_step"], 3)} for r in results[1:]]
    for r in ratios:
        print(f"micro-batch {r['micro_batch_size']} vs {reference['micro_batch_size']}: peak RSS {r['peak_ratio']}x, "
              f"growth {r['growth_ratio']}x, seconds per step {r['time_ratio']}x")
    if args.output_json:
        write_result(args.output_json, context, {"batch_size": args.batch_size, "steps": args.steps,
                                                 "records": args.records, "threads": args.threads,
                                                 "results": results, "ratios": ratios})


if __name__ == "__main__":
    main()
