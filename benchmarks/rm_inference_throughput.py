"""Reward-model feedback throughput: batched inference vs one (prompt, response) at a time, same model.

    python benchmarks/rm_inference_throughput.py                       # CPU defaults: 64 pairs, batch 16
    python benchmarks/rm_inference_throughput.py --device cuda --hidden_size 1024 --layers 8 --n 256

Both modes go through `GenerativeRewardModel.generate_feedback` (the code path the policy phase uses):
"batched" passes all pairs at once with ``batch_size`` rows per generation call (left padding, KV cache,
inputs sorted by length); "sequential" calls it once per pair. The model is a randomly initialised Llama
built from a config (nothing is downloaded), decoding is greedy and every row runs to ``max_new_tokens``
(the stop-at-JSON check still runs each step, as in real use, but an untrained model never writes the JSON),
so both modes generate the same number of tokens and the ratio measures batching alone. Inputs are SLF5K-style
(post, summary) pairs from `text2grad.apps.tiny`. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.result_file import run_context, write_result  # noqa: E402
from reward_model.inference import GenerativeRewardModel  # noqa: E402
from reward_model.serialization import PLAIN_TEMPLATE  # noqa: E402
from text2grad.apps.tiny import make_records  # noqa: E402
from text2grad.core.modeling import build_tiny_llama, train_tokenizer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64, help="(prompt, response) pairs")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats per mode (best is reported)")
    parser.add_argument("--output_json", default=None, help="also write the figures with machine, date, command and load averages here (a result "
                             "file for benchmarks/results/, read by benchmarks/results_tables.py)")
    args = parser.parse_args(argv)
    context = run_context(argv)
    if args.threads:
        torch.set_num_threads(args.threads)


    records = make_records("slf5k", args.n, seed=0)
    prompts, responses = [r["post"] for r in records], [r["generated_summary_for_feedback"] for r in records]
    instruction = "Critique the response, then list good and poor spans as JSON."
    corpus = [PLAIN_TEMPLATE.format(instruction=instruction, prompt=p, response=r) for p, r in zip(prompts, responses)]
    corpus += [json.dumps({"good_spans": [r["_good"][0]], "poor_spans": r["_poor"]}) for r in records]
    tokenizer = train_tokenizer(corpus, vocab_size=1000, kind="bpe")
    model = build_tiny_llama(
        tokenizer, hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.heads, seed=0
    ).to(args.device)
    # An untrained model would stop at random EOS tokens; forbid EOS so both modes decode max_new_tokens each.
    model.generation_config.suppress_tokens = [tokenizer.eos_token_id]
    params = sum(p.numel() for p in model.parameters())
    rm = GenerativeRewardModel(
        model, tokenizer, instruction=instruction, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size
    )
    input_tokens = [len(tokenizer(PLAIN_TEMPLATE.format(instruction=instruction, prompt=p, response=r))["input_ids"])
                    for p, r in zip(prompts, responses)]

    def batched() -> list:
        return rm.generate_feedback(prompts, responses)

    def sequential() -> list:
        return [fb for p, r in zip(prompts, responses) for fb in rm.generate_feedback([p], [r])]

    rm.generate_feedback(prompts[:2], responses[:2])  # warm-up (allocator, kernels)
    results = {}
    for name, fn in (("batched", batched), ("sequential", sequential)):
        best, outputs = float("inf"), []
        for _ in range(args.repeats):
            start = time.perf_counter()
            outputs = fn()
            best = min(best, time.perf_counter() - start)
        new_tokens = sum(len(tokenizer(fb.raw, add_special_tokens=False)["input_ids"]) for fb in outputs)
        results[name] = {"seconds": best, "responses_per_s": args.n / best, "generated_tokens": new_tokens,
                         "texts": [fb.raw for fb in outputs]}
    ratio = results["batched"]["responses_per_s"] / results["sequential"]["responses_per_s"]

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    print(f"device: {args.device} ({cpu}), torch threads: {torch.get_num_threads()}, torch {torch.__version__}")
    print(
        f"model: Llama hidden {args.hidden_size}, {args.layers} layers, {params / 1e6:.2f} M parameters; "
        f"{args.n} pairs, input {min(input_tokens)}-{max(input_tokens)} tokens, "
        f"max_new_tokens {args.max_new_tokens}, greedy, batch {args.batch_size}"
    )
    print()
    print("| mode | wall time (s) | responses / s | generated tokens (re-tokenized) |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        label = f"batched (batch {args.batch_size})" if name == "batched" else "one at a time"
        print(f"| {label} | {r['seconds']:.2f} | {r['responses_per_s']:.2f} | {r['generated_tokens']} |")
    print()
    same = sum(a == b for a, b in zip(results["batched"]["texts"], results["sequential"]["texts"]))
    print(f"speed-up of batched over one-at-a-time: {ratio:.1f}x "
          f"(identical greedy outputs in both modes: {same}/{args.n})")
    if args.output_json:
        write_result(args.output_json, context, {
            "settings": {k: v for k, v in vars(args).items() if k != "output_json"}, "parameters": params,
            "torch_threads": torch.get_num_threads(),
            "modes": {name: {k: v for k, v in r.items() if k != "texts"} for name, r in results.items()},
            "speedup": ratio, "identical_outputs": same,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
