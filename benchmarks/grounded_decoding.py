"""Grounded span decoding vs free decoding: the same trained reward model on the same held-out annotations.

    python benchmarks/grounded_decoding.py --reward_model <dir> --dataset_path <rm_eval.jsonl>

``<dir>`` and ``<rm_eval.jsonl>`` come from a quickstart run: ``<cache>/reward_model-*/model`` and
``<cache>/reward_model-*/rm_eval.jsonl`` (the cache is ``$TEXT2GRAD_CACHE`` or ~/.cache/text2grad/quickstart).
Both modes go through `GenerativeRewardModel.generate_feedback` with ``grounded_spans`` off and on (greedy,
same batch size); each is timed ``--repeats`` times (best kept) and scored with `reward_model.metrics.evaluate_feedback`
against the critic's annotations: unmatched-quote rate, token precision / recall / F1 per class, span exact
matches. Prints a Markdown table with the grounded/free ratios.
"""

from __future__ import annotations

import argparse
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
from reward_model.metrics import evaluate_feedback  # noqa: E402
from text2grad.core.data import iter_jsonl  # noqa: E402
from text2grad.core.feedback import Feedback  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reward_model", required=True, help="trained reward model directory")
    parser.add_argument("--dataset_path", required=True, help="held-out annotations (prompt, response, spans)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output_json", default=None,
                        help="also write the figures with machine, date, command and load averages here (a result "
                             "file for benchmarks/results/, read by benchmarks/results_tables.py)")
    parser.add_argument("--reward_model_note", default="",
                        help="where the reward model came from, recorded in --output_json (e.g. the quickstart run)")
    args = parser.parse_args(argv)
    context = run_context(argv)
    records = list(iter_jsonl(args.dataset_path))
    prompts, responses = [r["prompt"] for r in records], [r["response"] for r in records]
    references = [Feedback.from_dict(r) for r in records]
    rows = {}
    for grounded in (False, True):
        rm = GenerativeRewardModel.from_pretrained(
            args.reward_model, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, grounded_spans=grounded
        )
        best, feedback = float("inf"), None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            feedback = rm.generate_feedback(prompts, responses)
            best = min(best, time.perf_counter() - t0)
        metrics, _ = evaluate_feedback(feedback, references, responses, rm.tokenizer)
        report = metrics.to_dict()
        rows["grounded" if grounded else "free"] = {
            "seconds": best, "per_s": len(records) / best, "unmatched": report["unmatched_span_rate"],
            "valid": report["json_validity_rate"], "exact": report["spans"]["exact"], "n_ref_spans": report["spans"]["n_reference"],
            **{f"{c}_{m}": report["token"][c][m] for c in ("positive", "negative") for m in ("precision", "recall", "f1")},
        }
    free, grounded = rows["free"], rows["grounded"]
    print(f"{len(records)} held-out annotations, batch {args.batch_size}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads\n")
    keys = ["per_s", "valid", "unmatched", "exact", "positive_precision", "positive_recall", "positive_f1",
            "negative_precision", "negative_recall", "negative_f1"]
    print("| metric | free | grounded | grounded / free |\n|---|---:|---:|---:|")
    for k in keys:
        ratio = grounded[k] / free[k] if free[k] else float("nan")
        print(f"| {k} | {free[k]:.3f} | {grounded[k]:.3f} | {ratio:.2f} |")
    print(f"\nreference spans: {free['n_ref_spans']}")
    if args.output_json:
        write_result(args.output_json, context, {
            "reward_model": args.reward_model_note or str(args.reward_model), "records": len(records),
            "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads(),
            "free": free, "grounded": grounded,
        })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
