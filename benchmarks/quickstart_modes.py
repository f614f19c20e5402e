"""Text2Grad (NL-gradient PPO) vs. scalar PPO on the quickstart task, over several PPO seeds (3 by default).

    python benchmarks/quickstart_modes.py --output_dir runs/bench_quickstart                 # seeds 0 1 2
    python benchmarks/quickstart_modes.py --name lam0 --output_dir runs/bench_lam0 -- --ppo_args '["--lam","0"]'
    python benchmarks/quickstart_modes.py --summarize runs/bench_quickstart runs/bench_lam0  # tables only

Each seed runs the quickstart pipeline (`text2grad.apps.quickstart.pipeline.run`) with the same SFT policy and
reward model (trained once, then cached) and a different PPO seed; both reward modes use the same seed, budget
and hyperparameters. Early stopping on the held-out critic is on by default here (it only chooses a checkpoint,
it does not change training), so every run reports both the last policy and the one a validation split picks.
Reported per mode, mean +- sample std over seeds:

- the eval fact score (greedy decoding, eval split) of the last policy and of the early-stopped one;
- Text2Grad minus scalar per seed (who is ahead, in how many seeds);
- the mean token log-prob change after Text2Grad by reward-model label and position in the span;
- the reward model's token F1 against the critic on the PPO rollouts, early vs late (exploitation).
Each seed's row is written to ``<output_dir>/ppo_seed<N>/row.json``, so seeds can run as separate processes.
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

from reward_model.metrics import evaluate_feedback
from text2grad.apps.quickstart.pipeline import QuickstartConfig, run
from text2grad.apps.quickstart.report import rollout_curves
from text2grad.apps.quickstart.task import FactCritic
from text2grad.core.config import parse_config
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import load_tokenizer


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


MODES = ("nl_gradient", "scalar")


def run_seed(seed: int, args, extra: list[str]) -> dict:
    out = Path(args.output_dir) / f"ppo_seed{seed}"
    flags = {"output_dir": out, "preset": args.preset, "seed": 0, "ppo_seed": seed, "eval_every": args.eval_every,
             "n_report_samples": 4, "ppo_feedback": args.ppo_feedback, "early_stopping": str(args.early_stopping).lower()}
    if args.cache_dir:
        flags["cache_dir"] = args.cache_dir
    cfg = parse_config(QuickstartConfig, [f"--{k}={v}" for k, v in flags.items()] + extra)
    t0 = time.perf_counter()
    summary = run(cfg)
    elapsed = time.perf_counter() - t0
    records = [json.loads(l) for l in (out / "data" / "rl.jsonl").read_text().splitlines()]
    critic = FactCritic(records=records)
    curves = summary["curves"]
    roll = {m: rollout_curves(out / f"ppo-{m}" / "samples.jsonl", critic) for m in MODES}
    row = {"seed": seed, "seconds": elapsed, "sft_fact_score": curves["scalar"][0]["fact_score"],
           "logprob_shift": summary.get("logprob_shift"), "logprob_shift_by_position": summary.get("logprob_shift_by_position"),
           "versions": summary.get("versions"), "reward_model_eval": {
               k: summary["reward_model_eval"].get(k) for k in ("json_validity_rate", "unmatched_span_rate", "token_label_accuracy")}}
    row["rm_token_f1"] = {k: v.get("f1") for k, v in (summary["reward_model_eval"].get("token") or {}).items()}
    for m in MODES:
        sel = summary["selection"][m]
        row[m] = {
            "last_fact_score": curves[m][-1]["fact_score"], "last_rougeL": curves[m][-1].get("rougeL"),
            "selected_fact_score": summary["results"][m]["fact_score"], "selected_iteration": sel["selected_iteration"],
            "validation": sel["validation"], "curve": [(p["iteration"], p["fact_score"]) for p in curves[m]],
            "rollout_true_fact_score": [(p["iteration"], p["true_fact_score"]) for p in roll[m]],
        }
    if args.ppo_feedback == "reward_model":
        n = curves["nl_gradient"][-1]["iteration"]
        tok = load_tokenizer(str(out / "ppo-nl_gradient" / "policy"))
        row["rm_vs_critic_on_rollouts"] = {
            m: rm_agreement(out / f"ppo-{m}" / "samples.jsonl", critic, tok, 5, n - 4) for m in MODES}
    (out / "row.json").write_text(json.dumps(row, indent=2))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="PPO seeds (default 0 1 2)")
    parser.add_argument("--output_dir", default="runs/bench_quickstart")
    parser.add_argument("--name", default="baseline", help="Name of this configuration in the printed table")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--eval_every", type=int, default=10)
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--early_stopping", type=lambda s: s.lower() in ("1", "true", "yes"), default=True,
                        help="Score every eval point on the validation split and keep the best (default true)")
    parser.add_argument("--ppo_feedback", default="reward_model", choices=["reward_model", "critic"],
                        help="critic: the FactCritic itself gives PPO its feedback (oracle ablation)")
    parser.add_argument("--summarize", nargs="+", default=None, metavar="DIR",
                        help="Print the tables of earlier runs (their ppo_seed*/row.json) and exit")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if args.summarize:
        print(markdown({Path(d).name: load_rows(Path(d)) for d in args.summarize}))
        return 0
    rows = [run_seed(seed, args, extra) for seed in args.seeds]
    print(f"command: python benchmarks/quickstart_modes.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(markdown({args.name: rows}))
    return 0


def load_rows(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("ppo_seed*/row.json"))]


def _ms(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f}"


def markdown(configs: dict[str, list[dict]]) -> str:
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.split(":")[-1].strip()
    lines = [f"Machine: {os.cpu_count()} CPUs (`nproc`), {cpu}, Python {platform.python_version()}.", "",
             "| configuration | seeds | SFT | scalar, last | Text2Grad, last | T2G - scalar, last (ahead in) | "
             "scalar, early-stopped | Text2Grad, early-stopped | T2G - scalar, early-stopped (ahead in) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rows in configs.items():
        if not rows:
            continue
        get = lambda m, k: [r[m][k] for r in rows]  # noqa: E731
        d_last = [a - b for a, b in zip(get("nl_gradient", "last_fact_score"), get("scalar", "last_fact_score"))]
        d_sel = [a - b for a, b in zip(get("nl_gradient", "selected_fact_score"), get("scalar", "selected_fact_score"))]
        lines.append(
            f"| {name} | {','.join(str(r['seed']) for r in rows)} | {rows[0]['sft_fact_score']:.3f} | "
            f"{_ms(get('scalar', 'last_fact_score'))} | {_ms(get('nl_gradient', 'last_fact_score'))} | "
            f"{_ms(d_last)} ({sum(d > 0 for d in d_last)}/{len(rows)}) | {_ms(get('scalar', 'selected_fact_score'))} | "
            f"{_ms(get('nl_gradient', 'selected_fact_score'))} | {_ms(d_sel)} ({sum(d > 0 for d in d_sel)}/{len(rows)}) |")
    lines += ["", "Per seed (eval fact score at iterations 0/…/last; early-stopped iteration in brackets; mean token "
              "log-prob change after Text2Grad by RM label: poor first / poor inside / good / unlabelled):", ""]
    for name, rows in configs.items():
        for r in rows:
            pos = r.get("logprob_shift_by_position") or {}
            shift = r.get("logprob_shift") or {}
            f = lambda k: f"{pos[k]['mean']:+.3f}" if k in pos else "n/a"  # noqa: E731
            lines.append(
                f"- {name}, seed {r['seed']}: scalar " + "/".join(f"{v:.2f}" for _, v in r["scalar"]["curve"])
                + f" [{r['scalar']['selected_iteration']}], Text2Grad " + "/".join(f"{v:.2f}" for _, v in r["nl_gradient"]["curve"])
                + f" [{r['nl_gradient']['selected_iteration']}]; log-prob {f('poor_first')} / {f('poor_inside')} / "
                f"{shift.get('good', float('nan')):+.3f} / {shift.get('neutral', float('nan')):+.3f}"
                + (f"; RM vs critic token F1 on rollouts (pos/neg, early -> late): " + "; ".join(
                    f"{m} " + " -> ".join(f"{v['positive']:.2f}/{v['negative']:.2f}" for v in r["rm_vs_critic_on_rollouts"][m].values())
                    for m in MODES) if "rm_vs_critic_on_rollouts" in r else "")
                + f"; {r['seconds']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
