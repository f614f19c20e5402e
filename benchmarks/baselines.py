"""The paper's baselines side by side on the quickstart task, with one budget and several seeds.

    python benchmarks/baselines.py --seeds 0 1 2 --output_dir runs/bench_baselines          # default preset
    python benchmarks/baselines.py --preset ci --seeds 0 1 2 --ppo_iterations 4 --eval_every 2  # smoke run

Methods (each starts from the same SFT policy of the quickstart pipeline, `text2grad.apps.quickstart`):

=================  =================================================================================================
``text2grad``      PPO, ``--reward_mode nl_gradient``, span rewards from the generative reward model (the method)
``scalar_rm_ppo``  PPO, ``--reward_mode scalar --scalar_source scalar_rm --critic none``: the score of a
                   Bradley-Terry reward model (`reward_model.scalar`) trained on preference pairs, at the last token
``dense``          PPO, ``--reward_mode dense``, span rewards from a reward model trained on *dense* annotations
                   (`DenseFactCritic`: every clause of the summary labelled; the measured labelled-token share is
                   reported)
``dpo``            ``policy_optimization.dpo`` on the same preference pairs as the scalar reward model
``grpo_text2grad`` ``policy_optimization.grpo``: group advantage of the feedback's quote balance + span rewards per
                   token, from the same generative reward model as ``text2grad``
=================  =================================================================================================

Preference pairs (scalar reward model and DPO): for each SFT/annotation post, two imperfect summaries from the
task generator (per-fact error rate ``rm_p_wrong``); the one with the higher fact score is chosen (ties dropped).
Like KodCode's pass/fail pairs in the paper, the preference comes from the task's own check.

The budget: ``ppo_iterations`` policy-optimization iterations of ``ppo_batch_size`` sampled responses each (PPO: 2
epochs x 2 minibatches per iteration, as the quickstart; GRPO: one optimizer step per iteration on
``ppo_batch_size`` completions = ``ppo_batch_size / 4`` prompts x 4 samples; DPO: one optimizer step per iteration on
``ppo_batch_size`` pairs). Every policy is evaluated (greedy, eval split, fact score) every ``eval_every``
iterations. The SFT policy and both generative reward models are trained once (cached); the scalar reward model
once; the seeds vary the policy-optimization phase only. Prints a Markdown section for benchmarks/README.md and
writes ``<output_dir>/baselines.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the phase CLIs import "benchmarks.baselines:DenseFactCritic" by name
    sys.path.insert(0, str(ROOT))

from text2grad.apps.quickstart import pipeline as qs  # noqa: E402
from text2grad.apps.quickstart.presets import resolve  # noqa: E402
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig  # noqa: E402
from text2grad.apps.quickstart.results import evaluate_policy  # noqa: E402
from text2grad.apps.quickstart.task import FactCritic, TaskConfig, fact_scores, noisy_summary  # noqa: E402
from text2grad.core.data import iter_jsonl, write_jsonl  # noqa: E402
from text2grad.core.feedback import Feedback  # noqa: E402

METHODS = ("text2grad", "scalar_rm_ppo", "dense", "dpo", "grpo_text2grad")
LABELS = {
    "sft": "SFT policy (start)", "text2grad": "Text2Grad (span PPO)", "scalar_rm_ppo": "PPO, scalar reward model",
    "dense": "dense-label PPO", "dpo": "DPO", "grpo_text2grad": "Text2Grad-GRPO",
}


# --------------------------------------------------------------------------------------------------
# The dense annotator and the preference pairs
# --------------------------------------------------------------------------------------------------


def clause_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each clause: the runs of text between ',', ';' and '.', without surrounding blanks."""
    out = []
    for m in re.finditer(r"[^,;.]+", text):
        seg = m.group()
        if seg.strip():
            lead = len(seg) - len(seg.lstrip())
            out.append((m.start() + lead, m.start() + lead + len(seg.strip())))
    return out


def densify(feedback: Feedback, response: str) -> Feedback:
    """Dense labels from span feedback: each clause that overlaps a poor quote is poor, one that overlaps a good
    quote is good, the rest stays unlabelled; the quotes become whole clauses (so most tokens carry a label)."""
    if not feedback.ok:
        return feedback

    def hits(quotes: Sequence[str]) -> list[tuple[int, int]]:
        found = []
        for q in quotes:
            at = response.find(q)
            while q and at >= 0:
                found.append((at, at + len(q)))
                at = response.find(q, at + 1)
        return found

    good, poor = hits(feedback.good_spans), hits(feedback.poor_spans)
    overlaps = lambda s, e, spans: any(a < e and s < b for a, b in spans)  # noqa: E731
    good_clauses, poor_clauses = [], []
    for s, e in clause_spans(response):
        if overlaps(s, e, poor):
            poor_clauses.append(response[s:e])
        elif overlaps(s, e, good):
            good_clauses.append(response[s:e])
    return Feedback(critique=feedback.critique, good_spans=tuple(good_clauses), poor_spans=tuple(poor_clauses))


class DenseFactCritic:
    """The quickstart's FactCritic with dense labels (`densify`): the dense-ablation annotator of this benchmark."""

    def __init__(self, data_path: str | Sequence[str] | None = None, records: Sequence[dict[str, Any]] | None = None):
        self.inner = FactCritic(data_path, records)

    def bind_records(self, records: Sequence[dict[str, Any]]) -> None:
        self.inner.bind_records(records)

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        return [densify(fb, r) for fb, r in zip(self.inner.feedback(prompts, responses), responses)]


def preference_pairs(records: Sequence[dict[str, Any]], seed: int, p_wrong: float) -> list[dict[str, str]]:
    """Two generated summaries per post; the higher fact score is chosen, ties are dropped."""
    rng = random.Random(seed)
    task = TaskConfig(seed=seed, p_wrong=p_wrong)
    pairs = []
    for rec in records:
        a, b = noisy_summary(rng, rec["facts"], task), noisy_summary(rng, rec["facts"], task)
        sa, sb = fact_scores(rec["facts"], a)["fact_score"], fact_scores(rec["facts"], b)["fact_score"]
        if sa != sb:
            chosen, rejected = (a, b) if sa > sb else (b, a)
            pairs.append({"prompt": rec["prompt"], "chosen": chosen, "rejected": rejected})
    return pairs


# --------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------


def first_reaching(curve: list[dict[str, Any]], target: float) -> int | None:
    """The first evaluated iteration (> 0) whose fact score is >= target, or None."""
    return next((p["iteration"] for p in curve if p["iteration"] > 0 and p["fact_score"] >= target - 1e-12), None)


def _trainer_curve(run_dir: Path, cfg: QuickstartConfig, eval_fn, start: dict[str, Any]) -> list[dict[str, Any]]:
    """Eval curve of a TRL run saved every ``eval_every`` steps (checkpoint-N) and at the end (run_dir)."""
    curve = [{"iteration": 0, **start}]
    for it in range(cfg.eval_every, cfg.ppo_iterations, cfg.eval_every):
        ckpt = run_dir / f"checkpoint-{it}"
        if ckpt.is_dir():
            curve.append({"iteration": it, **eval_fn(ckpt)})
    curve.append({"iteration": cfg.ppo_iterations, **eval_fn(run_dir)})
    return curve


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    # every arm trains through failed feedback (zero reward, counted in samples/feedback_error) rather than stopping:
    # the arms' reward models differ, and one stopping early would compare unequal budgets
    base = QuickstartConfig(preset=args.preset, output_dir=str(Path(args.output_dir) / "shared"), seed=args.task_seed,
                            modes=["nl_gradient"], max_feedback_error_rate=1.0)
    overrides = {k: getattr(args, k) for k in ("ppo_iterations", "ppo_batch_size", "eval_every") if getattr(args, k)}
    overrides.update(json.loads(args.quickstart_overrides))
    cfg = resolve(replace(base, **overrides))
    out = Path(args.output_dir)
    shared = out / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    qs._COMMAND_LOG[:] = [out / "commands.sh"]
    (out / "commands.sh").write_text("#!/usr/bin/env bash\n# Every phase command this benchmark ran, in order.\n")
    stages = qs.StageClock(qs.STAGES)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    data = qs.stage_data(cfg, shared)
    eval_records = list(iter_jsonl(data["eval"]))
    sft, rm_base = qs.stage_policy(cfg, data)
    rm, rm_report = qs.stage_reward_model(cfg, data, sft, rm_base, shared / "text2grad_rm", stages)
    if args.dense_reward_model:  # an already trained dense reward model (e.g. from an earlier run of this script)
        dense_rm, dense_report = Path(args.dense_reward_model), {}
    else:
        dense_cfg = replace(cfg, critic="benchmarks.baselines:DenseFactCritic", reward_model=None)
        dense_rm, dense_report = qs.stage_reward_model(dense_cfg, data, sft, rm_base, shared / "dense_rm", stages)
    stages.finish()
    timings["sft + generative reward models"] = time.perf_counter() - t0

    # the preference pairs, the scalar reward model (trained once) and its held-out pairwise accuracy
    t0 = time.perf_counter()
    pairs = preference_pairs(list(iter_jsonl(data["train"])), cfg.seed, cfg.rm_p_wrong)
    write_jsonl(shared / "preference_pairs.jsonl", pairs)
    scalar_rm = shared / "scalar_rm"
    if not (scalar_rm / "eval_pairwise.json").is_file():
        qs._call("reward_model.scalar", [
            "--model_name_or_path", str(rm_base), "--dataset_path", str(shared / "preference_pairs.jsonl"),
            "--eval_fraction", "0.1", "--output_dir", str(scalar_rm), "--use_lora", "false", "--prompt_template", "{prompt}",
            "--max_length", "256", "--max_steps", str(args.scalar_rm_steps), "--learning_rate", str(args.scalar_rm_lr),
            "--per_device_train_batch_size", "16", "--logging_steps", "50", "--save_steps", str(10 ** 9),
            "--progress_bar", "false", "--seed", str(cfg.seed),
        ])
    scalar_report = json.loads((scalar_rm / "eval_pairwise.json").read_text())
    timings["scalar reward model"] = time.perf_counter() - t0

    sft_scores = evaluate_policy(sft, eval_records, cfg.response_length)[0]

    def eval_fn(path: Path, records: list[dict[str, Any]] | None = None):
        return evaluate_policy(Path(path), records or eval_records, cfg.response_length)

    results: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in METHODS}
    for seed in args.seeds:
        seed_cfg = replace(cfg, ppo_seed=seed, output_dir=str(out / f"seed{seed}"))
        seed_dir = out / f"seed{seed}"
        seed_dir.mkdir(parents=True, exist_ok=True)
        for method in args.methods:
            t0 = time.perf_counter()
            try:
                curve, share = _run_method(method, seed, seed_cfg, seed_dir, cfg, data, sft, rm, dense_rm, scalar_rm,
                                           shared, eval_fn, sft_scores)
            except Exception as exc:  # one failed baseline is reported, not allowed to hide the others
                print(f"[baselines] seed {seed} {method} FAILED: {type(exc).__name__}: {exc}", flush=True)
                results[method][seed] = {"error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
                continue
            results[method][seed] = {"curve": curve, "final": curve[-1], "labelled_share": share,
                                     "seconds": time.perf_counter() - t0}
            print(f"[baselines] seed {seed} {method}: fact_score {curve[-1]['fact_score']:.3f} "
                  f"({results[method][seed]['seconds']:.0f} s)", flush=True)
            (out / "baselines.json").write_text(json.dumps(_summary(cfg, args, results, sft_scores, rm_report, dense_report,
                                                                    scalar_report, timings), indent=2, default=str))
    summary = _summary(cfg, args, results, sft_scores, rm_report, dense_report, scalar_report, timings)
    (out / "baselines.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _run_method(method, seed, seed_cfg, seed_dir, cfg, data, sft, rm, dense_rm, scalar_rm, shared, eval_fn, sft_scores):
    """Train one method for one seed; returns (eval curve, mean labelled-token share or nan)."""
    if method in ("text2grad", "scalar_rm_ppo", "dense"):
        mode = {"text2grad": "nl_gradient", "scalar_rm_ppo": "scalar", "dense": "dense"}[method]
        extra = []
        if method == "scalar_rm_ppo":
            extra = ["--critic", "none", "--scalar_source", "scalar_rm",
                     "--scalar_source_kwargs", json.dumps({"path": str(scalar_rm)})]
        run = qs.stage_ppo(replace(seed_cfg, ppo_args=extra), data, sft, dense_rm if method == "dense" else rm,
                           seed_dir, mode, eval_fn)
        curve = run.curve
        metrics = list(iter_jsonl(seed_dir / f"ppo-{mode}" / "metrics.jsonl"))
        share = statistics.fmean(m["tokens/labelled_share"] for m in metrics) if metrics else float("nan")
    elif method == "dpo":
        run_dir = seed_dir / "dpo"
        qs._call("policy_optimization.dpo", [
            "--model_name_or_path", str(sft), "--dataset_path", str(shared / "preference_pairs.jsonl"),
            "--prompt_template", "{prompt}", "--chosen_template", "{chosen}", "--rejected_template", "{rejected}",
            "--use_lora", "false", "--output_dir", str(run_dir), "--max_steps", str(cfg.ppo_iterations),
            "--per_device_train_batch_size", str(cfg.ppo_batch_size), "--learning_rate", str(cfg.ppo_learning_rate),
            "--lr_scheduler_type", "constant", "--beta", "0.1", "--save_steps", str(cfg.eval_every),
            "--save_total_limit", str(10 ** 6), "--logging_steps", "1", "--max_length", "256", "--seed", str(seed),
        ])
        curve = _trainer_curve(run_dir, cfg, lambda p: eval_fn(p)[0], sft_scores)
        share = float("nan")
    else:  # grpo_text2grad
        run_dir = seed_dir / "grpo"
        qs._call("policy_optimization.grpo", [
            "--model_name_or_path", str(sft), "--dataset_path", str(data["rl"]), "--prompt_template", "{prompt}",
            *qs._ppo_feedback_args(cfg, data, rm), "--use_lora", "false", "--num_generations", "4",
            "--per_device_train_batch_size", str(cfg.ppo_batch_size), "--max_completion_length", str(cfg.response_length),
            "--temperature", "0.7", "--learning_rate", str(cfg.ppo_learning_rate), "--lr_scheduler_type", "constant",
            "--beta", str(cfg.kl_coef), "--max_steps", str(cfg.ppo_iterations), "--save_steps", str(cfg.eval_every),
            "--output_dir", str(run_dir), "--seed", str(seed), "--dtype", "fp32",
        ])
        curve = _trainer_curve(run_dir, cfg, lambda p: eval_fn(p)[0], sft_scores)
        rows = [r for r in iter_jsonl(run_dir / "metrics.jsonl") if "text2grad/nonzero_reward_share" in r]
        share = statistics.fmean(r["text2grad/nonzero_reward_share"] for r in rows) if rows else float("nan")
    return curve, share


def _summary(cfg, args, results, sft_scores, rm_report, dense_report, scalar_report, timings) -> dict[str, Any]:
    return {
        "config": {"preset": cfg.preset, "ppo_iterations": cfg.ppo_iterations, "ppo_batch_size": cfg.ppo_batch_size,
                   "eval_every": cfg.eval_every, "seeds": list(args.seeds), "methods": list(args.methods),
                   "n_eval": cfg.n_eval, "scalar_rm_steps": args.scalar_rm_steps},
        "sft": sft_scores, "results": {m: {str(s): r for s, r in per.items()} for m, per in results.items()},
        "generative_rm_eval": rm_report, "dense_rm_eval": dense_report, "scalar_rm_pairwise": scalar_report,
        "timings": timings, "machine": f"{platform.machine()}, {platform.python_version()}",
        "command": "python benchmarks/baselines.py " + " ".join(sys.argv[1:]),
    }


def markdown(summary: dict[str, Any]) -> str:
    """The benchmark table: final eval fact score (mean ± std over seeds) and iterations to reach scalar PPO."""
    res, seeds = summary["results"], summary["config"]["seeds"]
    fmt = lambda xs: f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"  # noqa: E731
    ok = lambda m, s: "final" in res.get(m, {}).get(str(s), {})  # noqa: E731
    target = {s: res["scalar_rm_ppo"][str(s)]["final"]["fact_score"] for s in seeds if ok("scalar_rm_ppo", s)}
    failures = [f"{LABELS[m]} seed {s}: {r['error']}" for m, per in res.items() for s, r in per.items() if "error" in r]
    lines = [
        f"| method | final fact score (mean ± std, {len(seeds)} seeds) | ROUGE-L | iterations to reach scalar-RM PPO's "
        "final score, per seed | labelled-token share | s per run |",
        "|---|---:|---:|---|---:|---:|",
        f"| {LABELS['sft']} | {summary['sft']['fact_score']:.3f} | {summary['sft']['rougeL']:.3f} | | | |",
    ]
    for method in summary["config"]["methods"]:
        runs = [res[method][str(s)] for s in seeds if ok(method, s)]
        if not runs:
            continue
        reach = [first_reaching(res[method][str(s)]["curve"], target[s]) if s in target else None for s in seeds
                 if ok(method, s)]
        shares = [r["labelled_share"] for r in runs if r["labelled_share"] == r["labelled_share"]]
        lines.append(
            f"| {LABELS[method]} | {fmt([r['final']['fact_score'] for r in runs])} | "
            f"{fmt([r['final']['rougeL'] for r in runs])} | "
            + ", ".join("not reached" if x is None else str(x) for x in reach)
            + (f" | {statistics.fmean(shares):.2f}" if shares else " | n/a")
            + f" | {statistics.fmean(r['seconds'] for r in runs):.0f} |"
        )
    acc = summary["scalar_rm_pairwise"]
    lines.append("")
    if failures:
        lines.append("Failed runs: " + "; ".join(failures))
    lines.append(f"Scalar reward model: held-out pairwise accuracy {acc['accuracy']:.3f} on {acc['pairs']} pairs.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="policy-optimization seeds")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--preset", default="default", choices=["ci", "default", "large"], help="quickstart preset")
    parser.add_argument("--task_seed", type=int, default=0, help="seed of the task data, SFT and reward models")
    parser.add_argument("--ppo_iterations", type=int, default=None, help="budget in iterations (default: the preset's)")
    parser.add_argument("--ppo_batch_size", type=int, default=None, help="responses per iteration (default: the preset's)")
    parser.add_argument("--eval_every", type=int, default=None, help="eval interval in iterations (default: the preset's)")
    parser.add_argument("--scalar_rm_steps", type=int, default=300, help="optimizer steps of the scalar reward model")
    parser.add_argument("--scalar_rm_lr", type=float, default=5e-4, help="learning rate of the scalar reward model")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--dense_reward_model", default=None,
                        help="an already trained dense reward model (with quickstart_overrides' reward_model/sft_model/data_dir "
                             "this reuses an earlier run's models)")
    parser.add_argument("--quickstart_overrides", default="{}",
                        help='JSON of QuickstartConfig fields over the preset, e.g. \'{"sft_steps": 200, "n_eval": 32}\'')
    parser.add_argument("--output_dir", default="runs/bench_baselines")
    args = parser.parse_args(argv)
    if "scalar_rm_ppo" not in args.methods:
        parser.error("--methods must include scalar_rm_ppo (the reference of the iterations-to-reach column)")
    summary = run_benchmark(args)
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
