"""Text2Grad (NL-gradient PPO) vs. scalar PPO on the quickstart task, over several PPO seeds.

    python benchmarks/quickstart_modes.py --seeds 0 1 2 --output_dir runs/bench_quickstart

Each seed runs the quickstart pipeline (`text2grad.apps.quickstart.pipeline.run`) with the same SFT policy and
reward model (trained once, then cached) and a different PPO seed; both reward modes use the same seed, budget
and hyperparameters. Reported per mode:

- the eval fact score (greedy decoding, eval split) at the end of training, mean and per seed;
- PPO iterations to reach the scalar mode's final eval fact score of the same seed (evaluated every
  ``eval_every`` iterations, so the resolution is ``eval_every``; "not reached" if it never does);
- the same on the rollouts' true fact score (every iteration, all rollouts, 3-iteration moving average),
  a finer-grained but noisier measure.
Prints a Markdown section ready for benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def first_reaching(points: list[tuple[int, float]], target: float) -> int | None:
    """The first iteration (> 0) whose value is >= target, or None."""
    return next((it for it, v in points if it > 0 and v >= target - 1e-12), None)


def _smooth(values: list[float], window: int = 3) -> list[float]:
    return [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def rm_agreement(samples_path: Path, critic, tokenizer, first: int, last: int) -> dict[str, dict[str, float]]:
    """Token F1 of the reward model's feedback on the logged rollouts against the critic's, early vs late.

    ``first``/``last``: the rollouts of iterations <= first, and >= last. A drop means the policy moved to
    responses the reward model judges worse than on its training distribution (the room for reward hacking).
    """
    from text2grad.core.feedback import Feedback
    from reward_model.metrics import evaluate_feedback

    rows = [json.loads(line) for line in samples_path.read_text().splitlines()]
    out = {}
    for name, keep in (("early", lambda it: it <= first), ("late", lambda it: it >= last)):
        picked = [r for r in rows if keep(r["iteration"]) and isinstance(r.get("feedback"), dict)]
        if not picked:
            continue
        predicted = [Feedback.from_dict(r["feedback"]) for r in picked]
        reference = critic.feedback([r["prompt"] for r in picked], [r["response"] for r in picked])
        metrics, _ = evaluate_feedback(predicted, reference, [r["response"] for r in picked], tokenizer)
        out[name] = {c: round(metrics.tokens[c].f1, 3) for c in ("positive", "negative")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="PPO seeds")
    parser.add_argument("--output_dir", default="runs/bench_quickstart")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--eval_every", type=int, default=5)
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--ppo_feedback", default="reward_model", choices=["reward_model", "critic"],
                        help="critic: the FactCritic itself gives PPO its feedback (oracle ablation)")
    parser.add_argument("extra", nargs="*", help="extra quickstart flags after --, e.g. -- --kl_coef 0.1")
    args = parser.parse_args(argv)

    from text2grad.apps.quickstart.pipeline import QuickstartConfig, run
    from text2grad.apps.quickstart.report import rollout_curves
    from text2grad.apps.quickstart.task import FactCritic
    from text2grad.core.config import load_config

    rows = []
    for seed in args.seeds:
        out = Path(args.output_dir) / f"ppo_seed{seed}"
        overrides = dict(output_dir=str(out), preset=args.preset, seed=0, ppo_seed=seed, eval_every=args.eval_every,
                         n_report_samples=4, ppo_feedback=args.ppo_feedback)
        if args.cache_dir:
            overrides["cache_dir"] = args.cache_dir
        cfg = load_config(QuickstartConfig, None, overrides)
        if args.extra:
            from text2grad.core.config import parse_config

            cfg = parse_config(QuickstartConfig, [f"--{k}={v}" for k, v in overrides.items()] + list(args.extra))
        t0 = time.perf_counter()
        summary = run(cfg)
        elapsed = time.perf_counter() - t0
        records = [json.loads(l) for l in (out / "data" / "rl.jsonl").read_text().splitlines()]
        critic = FactCritic(records=records)
        curves = summary["curves"]
        target = curves["scalar"][-1]["fact_score"]
        roll = {m: rollout_curves(out / f"ppo-{m}" / "samples.jsonl", critic) for m in ("nl_gradient", "scalar")}
        roll_s = {m: list(zip([p["iteration"] for p in r], _smooth([p["true_fact_score"] for p in r]))) for m, r in roll.items()}
        roll_target = roll_s["scalar"][-1][1]
        row = {"seed": seed, "seconds": elapsed, "scalar_target": target, "rollout_target": roll_target}
        for m in ("nl_gradient", "scalar"):
            pts = [(p["iteration"], p["fact_score"]) for p in curves[m]]
            row[m] = {
                "final_fact_score": curves[m][-1]["fact_score"], "final_rougeL": curves[m][-1].get("rougeL"),
                "curve": pts, "iters_to_scalar_final": first_reaching(pts, target),
                "rollout_final": roll_s[m][-1][1], "rollout_iters_to_scalar_final": first_reaching(roll_s[m], roll_target),
            }
        row["sft_fact_score"] = curves["scalar"][0]["fact_score"]
        row["rm"] = {k: summary["reward_model_eval"].get(k) for k in ("json_validity_rate", "unmatched_span_rate", "token_label_accuracy")}
        row["rm_token_f1"] = {k: v.get("f1") for k, v in (summary["reward_model_eval"].get("token") or {}).items()}
        row["logprob_shift"] = summary.get("logprob_shift")
        if args.ppo_feedback == "reward_model":
            from text2grad.core.modeling import load_tokenizer

            n = summary["curves"]["nl_gradient"][-1]["iteration"]
            tok = load_tokenizer(str(out / "ppo-nl_gradient" / "policy"))
            row["rm_vs_critic_on_rollouts"] = {
                m: rm_agreement(out / f"ppo-{m}" / "samples.jsonl", critic, tok, 5, n - 4) for m in ("nl_gradient", "scalar")
            }
        rows.append(row)
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "benchmark.json").write_text(json.dumps(rows, indent=2))
    print(markdown(rows, args))
    return 0


def _fmt(x) -> str:
    return "not reached" if x is None else str(x)


def markdown(rows: list[dict], args) -> str:
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.split(":")[-1].strip()
    total_iters = rows[0]["nl_gradient"]["curve"][-1][0]
    lines = [
        f"## Quickstart: Text2Grad (NL-gradient) vs. scalar PPO (feedback: {args.ppo_feedback})",
        "",
        f"Command: `python benchmarks/quickstart_modes.py --seeds {' '.join(map(str, args.seeds))} --preset {args.preset} "
        f"--eval_every {args.eval_every} --ppo_feedback {args.ppo_feedback}`  ",
        f"Machine: {os.cpu_count()} CPUs (`nproc`), {cpu}, Python {platform.python_version()}. Same SFT policy and reward "
        f"model for every seed (trained once, cached); {total_iters} PPO iterations per mode; the seed varies PPO only.",
        "",
        "| seed | SFT | scalar final | Text2Grad final | iters to scalar's final: scalar / Text2Grad | rollouts: scalar / Text2Grad final | rollouts: iters to scalar's final (scalar / Text2Grad) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s, t = r["scalar"], r["nl_gradient"]
        lines.append(
            f"| {r['seed']} | {r['sft_fact_score']:.3f} | {s['final_fact_score']:.3f} | {t['final_fact_score']:.3f} | "
            f"{_fmt(s['iters_to_scalar_final'])} / {_fmt(t['iters_to_scalar_final'])} | {s['rollout_final']:.3f} / "
            f"{t['rollout_final']:.3f} | {_fmt(s['rollout_iters_to_scalar_final'])} / {_fmt(t['rollout_iters_to_scalar_final'])} |"
        )
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0  # noqa: E731
    for m, name in (("scalar", "scalar PPO"), ("nl_gradient", "Text2Grad")):
        xs = [r[m]["final_fact_score"] for r in rows]
        lines.append(f"\n- {name}: final eval fact score {mean(xs):.3f} +- {sd(xs):.3f} over {len(xs)} seeds")
    ratios = [r["nl_gradient"]["iters_to_scalar_final"] / r["scalar"]["iters_to_scalar_final"] for r in rows
              if r["nl_gradient"]["iters_to_scalar_final"] and r["scalar"]["iters_to_scalar_final"]]
    reached = sum(r["nl_gradient"]["iters_to_scalar_final"] is not None for r in rows)
    lines.append(f"- Text2Grad reached the scalar mode's final eval score in {reached}/{len(rows)} seeds"
                 + (f"; iterations ratio Text2Grad / scalar = {mean(ratios):.2f} (paper: ~0.75)" if ratios else ""))
    r_ratios = [r["nl_gradient"]["rollout_iters_to_scalar_final"] / r["scalar"]["rollout_iters_to_scalar_final"] for r in rows
                if r["nl_gradient"]["rollout_iters_to_scalar_final"] and r["scalar"]["rollout_iters_to_scalar_final"]]
    r_reached = sum(r["nl_gradient"]["rollout_iters_to_scalar_final"] is not None for r in rows)
    lines.append(f"- On the rollouts' true fact score (every iteration, 3-iteration mean): Text2Grad reached scalar's final "
                 f"in {r_reached}/{len(rows)} seeds" + (f"; iterations ratio {mean(r_ratios):.2f}" if r_ratios else ""))
    lines.append(f"- Reward model on held-out annotations (seed {rows[0]['seed']}): {rows[0]['rm']}, token F1 {rows[0]['rm_token_f1']}")
    if "rm_vs_critic_on_rollouts" in rows[0]:
        lines.append("- Reward model vs. the critic on the PPO rollouts, token F1 (positive / negative), iterations 1-5 "
                     "-> last 5: " + "; ".join(
                         f"seed {r['seed']} {m}: " + " -> ".join(
                             f"{v['positive']:.2f} / {v['negative']:.2f}" for v in r["rm_vs_critic_on_rollouts"][m].values())
                         for r in rows for m in ("nl_gradient", "scalar")))
    lines.append(f"- Mean token log-prob change after Text2Grad, by RM label (seed {rows[0]['seed']}): {rows[0]['logprob_shift']}")
    lines.append(f"- Wall time per seed (s): " + ", ".join(f"{r['seconds']:.0f}" for r in rows) + " (the first also trains SFT and the reward model unless they are cached)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
