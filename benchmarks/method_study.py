"""The method study: Text2Grad against its scalar and dense baselines, each tuned on validation, over seeds.

    python benchmarks/method_study.py --output_dir runs/method_study                      # every phase (hours)
    python benchmarks/method_study.py --output_dir runs/method_study --phases sweep final --arms oracle
    python benchmarks/method_study.py --output_dir runs/method_study --phases report      # tables and plot only
    python benchmarks/method_study.py --output_dir /tmp/ms --iterations 4 --eval_every 2 --preset ci --jobs 1  # smoke
    python benchmarks/method_study.py --output_dir runs/study_smollm2 --preset smollm2 --arms oracle \
        --methods text2grad scalar_collapsed --sweep_knobs lambda lr --lambdas 0 0.95 --lrs 3e-5 --seeds 0 1 2 \
        --iterations 12 --eval_every 6 --phases sweep final report

Every method starts from the same SFT policy of the quickstart task (`text2grad.apps.quickstart`) and gets the same
number of rollouts (``iterations`` x the preset's PPO batch). ``--preset smollm2`` runs the paper's pipeline order on
the real SmolLM2-135M-Instruct: LoRA SFT on the task first (through its chat template; the adapter is merged once into
the study's start policy), then LoRA PPO (r 16) from it; the reward models are trained only when a learned arm or the
Bradley-Terry baseline asks for them. Methods (PPO reward modes of `policy_optimization`):

====================  ==========================================================================================
``text2grad``         span token rewards from the critic's good/poor quotes (``reward_mode nl_gradient``)
``scalar_collapsed``  the same critic's feedback collapsed to one number at the last token:
                      ``(#good - #poor quotes) / (#good + #poor)`` (``reward_mode scalar``, ``quote_count``)
``dense``             span token rewards from a critic that labels every clause (``reward_mode dense``)
``scalar_bt``         the score of a Bradley-Terry reward model trained on preference pairs at the last token
                      (the paper's PPO baseline; it does not read the critic, so it is the same in both arms)
====================  ==========================================================================================

Feedback arms: ``oracle`` = the task's programmatic critic (`FactCritic`, or its dense version) gives the feedback
directly, which isolates credit assignment; ``learned`` = the generative reward model trained on the critic's
annotations gives it, as in the paper.

Phases (each resumable: a run whose ``result.json`` exists is not run again):

- ``sweep``: per (arm, method) a coordinate search on the VALIDATION split, seed ``--sweep_seed``: GAE lambda in
  {0, 0.95, 1.0} at the base setting, then the learning rate around the base at the best lambda, then the paper's
  adaptive KL controller instead of the fixed coefficient. The criterion is the mean validation fact score of the
  last two evaluation points (the end of training, not a peak).
- ``final``: every (arm, method) at its chosen setting, ``--seeds``; each evaluation point scores validation AND test.
- ``ablation``: the quickstart's learned-arm Text2Grad setting with one change each (reward scale, whitening, value
  strength, entropy, clip range, oracle critic), to find what drives its late collapse.
- ``report``: ``study.json`` (everything), ``study.md`` (tables and sentences generated from the numbers) and
  ``curves.png`` (test fact score per method, mean and 95 % band over seeds).

The test split is never read by the sweep or by early stopping: it is scored only in the final and ablation phases.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib
import torch
import transformers
import yaml
from scipy.stats import t as student_t
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the critic "benchmarks.baselines:DenseFactCritic" is imported by name
    sys.path.insert(0, str(ROOT))

from benchmarks.baselines import preference_pairs  # noqa: E402
from policy_optimization.ppo_config import PPOConfig  # noqa: E402
from policy_optimization.train import build_trainer  # noqa: E402
from text2grad.apps.quickstart import pipeline as qs  # noqa: E402
from text2grad.apps.quickstart.quickstart_config import SMOLLM2, QuickstartConfig, resolve  # noqa: E402
from text2grad.apps.quickstart.report import token_logprobs  # noqa: E402
from text2grad.apps.quickstart.results import cpu_name, policy_prompts  # noqa: E402
from text2grad.apps.quickstart.task import critique_summary, fact_accuracy  # noqa: E402
from text2grad.core.data import iter_jsonl, write_jsonl  # noqa: E402
from text2grad.core.generation import generate  # noqa: E402
from text2grad.core.modeling import load_causal_lm, load_tokenizer  # noqa: E402
from text2grad.core.spans import decode_with_offsets, feedback_token_labels  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

METHODS = ("text2grad", "scalar_collapsed", "dense", "scalar_bt")
ARMS = ("oracle", "learned")
LABELS = {"sft": "SFT policy (start)", "text2grad": "Text2Grad (span rewards)",
          "scalar_collapsed": "scalar PPO, critic's quotes collapsed", "dense": "dense-label PPO",
          "scalar_bt": "scalar PPO, Bradley-Terry RM"}
REWARD_MODE = {"text2grad": "nl_gradient", "scalar_collapsed": "scalar", "dense": "dense", "scalar_bt": "scalar"}
LAMBDAS = (0.0, 0.95, 1.0)
# One change each to the quickstart's learned-arm Text2Grad setting (PPOConfig fields, or the critic).
ABLATIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "span_normalize": {"span_normalize": True},  # reward scale: every span worth +-1 in total, not +-1 per token
    "whiten_rewards": {"whiten_rewards": True},  # reward scale: total token rewards scaled to unit variance
    "no_advantage_whitening": {"whiten_advantages": False},
    "strong_value": {"vf_coef": 1.0},  # value head trained 10x harder (its error feeds every advantage)
    "entropy_bonus": {"entropy_coef": 0.01},
    "cliprange_0.1": {"cliprange": 0.1},
    "oracle_critic": {"_arm": "oracle"},  # the same setting with the critic itself: reward-model exploitation
}


@dataclass(frozen=True)
class Setting:
    """The tuned knobs of one method: learning rate, KL control and GAE lambda."""

    lr: float
    kl: str  # "fixed" (kl_coef constant) or "adaptive" (the paper's controller toward target_kl)
    lam: float

    def label(self) -> str:
        return f"lr {self.lr:g}, KL {self.kl}, lambda {self.lam:g}"


@dataclass(frozen=True)
class RunSpec:
    arm: str
    method: str
    setting: Setting
    seed: int
    phase: str  # sweep | final | ablation
    ablation: str = "none"

    @property
    def run_id(self) -> str:
        s = self.setting
        abl = "" if self.ablation == "none" else f"-abl_{self.ablation}"
        return f"{self.phase}/{self.arm}-{self.method}-lr{s.lr:g}-kl_{s.kl}-lam{s.lam:g}{abl}-seed{self.seed}"


@dataclass
class StudyContext:
    """What every run needs, built once by the parent (paths are strings so it pickles to worker processes)."""

    sft: str
    rl: str
    val_records: list[dict[str, Any]]
    test_records: list[dict[str, Any]]
    rm: str
    dense_rm: str
    scalar_rm: str
    iterations: int
    eval_every: int
    batch_size: int
    response_length: int
    kl_coef: float
    target_kl: float
    out: str
    sft_scores: dict[str, dict[str, float]] = field(default_factory=dict)  # split -> scores
    use_chat_template: bool = False  # the policy's prompts through its tokenizer's chat template (SmolLM2)
    ppo_fields: dict[str, Any] = field(default_factory=dict)  # the preset's PPOConfig fields (SmolLM2: LoRA)


# --------------------------------------------------------------------------------------------------
# Statistics and selection (pure)
# --------------------------------------------------------------------------------------------------


def mean_ci95(xs: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % t-interval of the mean); half-width nan for fewer than 2 values."""

    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = statistics.fmean(xs)
    if n < 2:
        return m, float("nan")
    return m, float(student_t.ppf(0.975, n - 1) * statistics.stdev(xs) / math.sqrt(n))


def end_score(curve: Sequence[Mapping[str, Any]], split: str = "val", last: int = 2) -> float:
    """The sweep's criterion: the mean fact score on ``split`` of the last ``last`` evaluation points."""
    pts = [p[split]["fact_score"] for p in curve if split in p][-last:]
    return statistics.fmean(pts) if pts else float("nan")


def early_stopped(curve: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The evaluation point with the best validation fact score (the start included; the earliest on ties)."""
    best = max(curve, key=lambda p: (p["val"]["fact_score"], -p["iteration"]))
    return {"iteration": best["iteration"], "val": best["val"]["fact_score"],
            "test": best["test"]["fact_score"] if "test" in best else float("nan")}


def first_reaching(curve: Sequence[Mapping[str, Any]], target: float, split: str = "test") -> int | None:
    """The first evaluated iteration (> 0) whose ``split`` fact score is >= target, or None."""
    return next((p["iteration"] for p in curve if p["iteration"] > 0 and split in p
                 and p[split]["fact_score"] >= target - 1e-12), None)


def choose(candidates: Mapping[Setting, float]) -> Setting:
    """The setting with the highest criterion (the first listed on ties: the base setting is listed first)."""
    return max(candidates, key=lambda s: (candidates[s], -list(candidates).index(s)))


# --------------------------------------------------------------------------------------------------
# One run (in a worker process)
# --------------------------------------------------------------------------------------------------


def _ppo_config(ctx: StudyContext, spec: RunSpec, run_dir: Path):

    overrides = dict(ABLATIONS[spec.ablation])
    arm = overrides.pop("_arm", spec.arm)
    method, s = spec.method, spec.setting
    critic: dict[str, Any]
    if method == "scalar_bt":
        critic = {"critic": "none", "scalar_source": "scalar_rm", "scalar_source_kwargs": {"path": ctx.scalar_rm}}
    elif arm == "oracle":
        name = "benchmarks.baselines:DenseFactCritic" if method == "dense" else "text2grad.apps.quickstart.task:FactCritic"
        critic = {"critic": name, "critic_kwargs": {"data_path": ctx.rl}}
    else:
        critic = {"critic": "reward_model", "critic_kwargs": {
            "path": ctx.dense_rm if method == "dense" else ctx.rm, "max_new_tokens": 128, "batch_size": 64,
            "grounded_spans": True}}
    fields = dict(
        model_name_or_path=ctx.sft, dataset_path=ctx.rl, prompt_template="{prompt}", reward_mode=REWARD_MODE[method],
        use_lora=False, output_dir=str(run_dir), overwrite_output_dir=True, batch_size=ctx.batch_size,
        num_mini_batches=2, num_ppo_epochs=2, learning_rate=s.lr, lr_scheduler_type="constant",
        kl_coef=0.2 if s.kl == "adaptive" else ctx.kl_coef, adaptive_kl=s.kl == "adaptive", target_kl=ctx.target_kl,
        # the controller's horizon is this run's episodes, so it can move the coefficient within the budget
        kl_horizon=ctx.iterations * ctx.batch_size, lam=s.lam, response_length=ctx.response_length, temperature=0.7,
        vf_coef=0.1, save_steps=0, save_total_limit=1, occurrence="first", seed=spec.seed, log_samples=0,
        # a sample without feedback scores zero and is counted (samples/source_error in the metrics)
        max_feedback_error_rate=1.0, num_iterations=ctx.iterations, progress_bar=False,
        use_chat_template=ctx.use_chat_template, **critic,
    )
    return PPOConfig(**{**fields, **ctx.ppo_fields, **overrides})  # an ablation's change replaces the study's value


def _greedy(model, tokenizer, records: Sequence[Mapping[str, Any]], max_new_tokens: int, use_chat_template: bool = False):
    """Fact scores of the greedy summaries of ``records`` (prompts rendered as PPO renders them), and the generations."""
    was_training = model.training
    model.eval()
    prompts, add_special = policy_prompts(tokenizer, [r["prompt"] for r in records], use_chat_template)
    gens = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=64, do_sample=False,
                    add_special_tokens=add_special)
    model.train(was_training)
    return dict(fact_accuracy(records, [g.text for g in gens])), gens


def true_label_shift(model, sft_model, tokenizer, records, sft_gens) -> dict[str, dict[str, float]]:
    """Mean log-prob change (policy minus SFT) of the SFT policy's greedy test summaries' tokens, grouped by the
    TRUE critic's labels (`critique_summary`): good, poor (first token of a poor quote / inside it), unlabelled."""

    sums: dict[str, list[float]] = {}
    for rec, gen in zip(records, sft_gens):
        ids = list(gen.response_ids)
        if not ids:
            continue
        text, offsets = decode_with_offsets(tokenizer, ids)
        labels = feedback_token_labels(critique_summary(rec["facts"], gen.text), text, offsets, occurrence="first").labels
        before = token_logprobs(sft_model, gen.prompt_ids, ids)
        after = token_logprobs(model, gen.prompt_ids, ids)
        prev = 0
        for lab, b, a in zip(labels, before, after):
            key = "neutral" if lab == 0 else ("good" if lab > 0 else ("poor_first" if lab != prev else "poor_inside"))
            acc = sums.setdefault(key, [0.0, 0])
            acc[0] += a - b
            acc[1] += 1
            prev = lab
    return {k: {"mean": v[0] / v[1], "n": v[1]} for k, v in sums.items()}


def run_one(ctx: StudyContext, spec: RunSpec) -> dict[str, Any]:
    """Train one (arm, method, setting, seed) and evaluate it every ``eval_every`` iterations; returns the result
    (also written to ``<out>/<run_id>/result.json``)."""


    torch.set_num_threads(1)  # decoding-bound on a tiny model: one thread per run, runs side by side
    run_dir = Path(ctx.out) / spec.run_id
    t0 = time.perf_counter()
    cfg = _ppo_config(ctx, spec, run_dir / "ppo")
    trainer = build_trainer(cfg)
    score_test = spec.phase != "sweep"
    curve = [{"iteration": 0, "val": ctx.sft_scores["val"], **({"test": ctx.sft_scores["test"]} if score_test else {})}]
    metrics = []
    for it in range(1, ctx.iterations + 1):
        m = trainer.step()
        metrics.append({k: m.get(k) for k in ("iteration", "reward/score_mean", "objective/kl", "objective/kl_coef",
                                              "policy/rollout_entropy", "policy/clipfrac", "val/explained_variance",
                                              "samples/source_error", "tokens/labelled_share", "response/length_mean")
                        if k in m})
        if it % ctx.eval_every == 0 or it == ctx.iterations:
            point: dict[str, Any] = {"iteration": it, "kl": m.get("objective/kl"),
                                     "val": _greedy(trainer.policy, trainer.tokenizer, ctx.val_records, ctx.response_length,
                                                   ctx.use_chat_template)[0]}
            if score_test:
                point["test"] = _greedy(trainer.policy, trainer.tokenizer, ctx.test_records, ctx.response_length,
                                        ctx.use_chat_template)[0]
            curve.append(point)
    result: dict[str, Any] = {"spec": {**asdict(spec), "run_id": spec.run_id}, "curve": curve, "metrics": metrics,
                              "final": curve[-1], "seconds": time.perf_counter() - t0,
                              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    if score_test:
        sft_model = load_causal_lm(ctx.sft).eval()
        _, sft_gens = _greedy(sft_model, trainer.tokenizer, ctx.test_records, ctx.response_length, ctx.use_chat_template)
        trainer.policy.eval()
        result["true_label_shift"] = true_label_shift(trainer.policy, sft_model, trainer.tokenizer, ctx.test_records, sft_gens)
        result["early_stopped"] = early_stopped(curve)
    close = getattr(trainer.critic, "close", None)
    if callable(close):
        close()
    _write_json(run_dir / "result.json", result)
    return result


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def _load_result(ctx: StudyContext, spec: RunSpec) -> dict[str, Any] | None:
    path = Path(ctx.out) / spec.run_id / "result.json"
    return json.loads(path.read_text()) if path.is_file() else None


def exit_with_parent(parent_pid: int) -> None:
    """Run in each worker: on Linux, the kernel sends it SIGTERM when the study's process dies, so a killed study
    leaves no run going on that would later write its result into the folder (a resumed or renamed study would read
    it as its own)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def run_all(ctx: StudyContext, specs: Sequence[RunSpec], jobs: int) -> dict[RunSpec, dict[str, Any]]:
    """Every spec's result: loaded when already on disk, else trained, ``jobs`` runs at a time (a failed run is
    reported and left out, never allowed to stop the others)."""

    done = {s: r for s in specs if (r := _load_result(ctx, s)) is not None}
    todo = [s for s in specs if s not in done]
    if not todo:
        return done
    bar = tqdm(total=len(todo), desc=f"runs ({len(done)} already done)", unit="run")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=exit_with_parent,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(run_one, ctx, s): s for s in todo}
        for fut in as_completed(futures):
            spec = futures[fut]
            try:
                done[spec] = res = fut.result()
                tail = res["final"]
                tqdm.write(f"[study] {spec.run_id}: val {tail['val']['fact_score']:.3f}"
                           + (f", test {tail['test']['fact_score']:.3f}" if "test" in tail else "")
                           + f", KL {tail.get('kl') or 0:.2f} ({res['seconds']:.0f} s)")
            except Exception as exc:  # noqa: BLE001 - reported, the study goes on
                tqdm.write(f"[study] {spec.run_id} FAILED: {type(exc).__name__}: {exc}")
            bar.update(1)
    bar.close()
    return done


# --------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------


def method_keys(arms: Sequence[str], methods: Sequence[str]) -> list[tuple[str, str]]:
    """(arm, method) pairs; scalar_bt reads no critic, so it is run once, under the "learned" arm."""
    keys = [(a, m) for a in arms for m in methods if m != "scalar_bt"]
    return keys + ([("learned", "scalar_bt")] if "scalar_bt" in methods else [])


def sweep(ctx: StudyContext, keys, base: Setting, lrs: Sequence[float], seed: int, jobs: int,
          knobs: Sequence[str] = ("lambda", "lr", "kl"), lambdas: Sequence[float] = LAMBDAS) -> dict[str, Any]:
    """Coordinate search per (arm, method) on validation: lambda, then learning rate, then KL control (``knobs``
    leaves stages out: a left-out knob stays at the base setting)."""
    def spec(a, m, s):
        return RunSpec(a, m, s, seed, "sweep")

    def crit(results, a, m, settings):
        return {s: end_score(results[spec(a, m, s)]["curve"]) for s in settings if spec(a, m, s) in results}

    table: dict[str, Any] = {}
    lams = (base.lam, *[x for x in lambdas if x != base.lam]) if "lambda" in knobs else (base.lam,)
    stage1 = {k: [replace(base, lam=lam) for lam in lams] for k in keys}
    res = run_all(ctx, [spec(a, m, s) for (a, m), ss in stage1.items() for s in ss], jobs)
    stage2 = {}
    for (a, m), ss in stage1.items():
        c = crit(res, a, m, ss)
        best = choose(c) if c else base
        stage2[(a, m)] = [best] + ([replace(best, lr=lr) for lr in lrs if lr != best.lr] if "lr" in knobs else [])
    res.update(run_all(ctx, [spec(a, m, s) for (a, m), ss in stage2.items() for s in ss], jobs))
    stage3 = {}
    for (a, m), ss in stage2.items():
        c = crit(res, a, m, ss)
        best = choose(c) if c else base
        stage3[(a, m)] = [best] + ([replace(best, kl="adaptive")] if "kl" in knobs else [])
    res.update(run_all(ctx, [spec(a, m, s) for (a, m), ss in stage3.items() for s in ss], jobs))
    for (a, m) in keys:
        tried = {s: v for s, v in crit(res, a, m, [*stage1[(a, m)], *stage2[(a, m)], *stage3[(a, m)]]).items()}
        final = crit(res, a, m, stage3[(a, m)])
        chosen = choose(final) if final else base
        table[f"{a}/{m}"] = {"chosen": asdict(chosen), "knobs": list(knobs),
                             "tried": [{"setting": asdict(s), "val_end": v} for s, v in tried.items()]}
    return table


def chosen_settings(sweep_table: Mapping[str, Any], keys, base: Setting) -> dict[tuple[str, str], Setting]:
    return {(a, m): Setting(**sweep_table[f"{a}/{m}"]["chosen"]) if f"{a}/{m}" in sweep_table else base for a, m in keys}


# --------------------------------------------------------------------------------------------------
# Summary and report (every interpreting sentence is generated from the numbers)
# --------------------------------------------------------------------------------------------------


def summarize_final(results: Mapping[RunSpec, Mapping[str, Any]], keys, seeds: Sequence[int], batch_size: int) -> dict[str, Any]:
    """Per (arm, method): final / early-stopped test fact scores (mean, 95 % half-width, per seed), the iteration
    early stopping chose, KL at the end, rollouts to reach the best scalar baseline's final score, and the true-label
    log-prob shifts."""
    by_key: dict[str, dict[int, Mapping[str, Any]]] = {}
    for spec, res in results.items():
        if spec.phase == "final":
            by_key.setdefault(f"{spec.arm}/{spec.method}", {})[spec.seed] = res
    out: dict[str, Any] = {}
    for a, m in keys:
        runs = by_key.get(f"{a}/{m}", {})
        if not runs:
            continue
        final = {s: r["final"]["test"]["fact_score"] for s, r in runs.items()}
        early = {s: r["early_stopped"]["test"] for s, r in runs.items()}
        shift = {k: statistics.fmean(r["true_label_shift"][k]["mean"] for r in runs.values() if k in r["true_label_shift"])
                 for k in ("good", "poor_first", "poor_inside", "neutral")
                 if any(k in r["true_label_shift"] for r in runs.values())}
        out[f"{a}/{m}"] = {
            "arm": a, "method": m, "seeds": sorted(runs), "setting": runs[next(iter(runs))]["spec"]["setting"],
            "final": final, "final_mean_ci": mean_ci95(list(final.values())),
            "early": early, "early_mean_ci": mean_ci95(list(early.values())),
            "early_iteration": {s: r["early_stopped"]["iteration"] for s, r in runs.items()},
            "kl_end": mean_ci95([r["final"].get("kl") or 0.0 for r in runs.values()]),
            "curves": {s: [{"iteration": p["iteration"], "test": p["test"]["fact_score"]} for p in r["curve"]]
                       for s, r in runs.items()},
            "true_label_shift": shift,
            "recall_false": [statistics.fmean(r["final"]["test"].get(k, float("nan")) for r in runs.values())
                             for k in ("fact_recall", "n_false")],
        }
    for arm in {a for a, _ in keys}:
        scalars = [k for k in out if k.split("/")[1] in ("scalar_collapsed", "scalar_bt")
                   and (k.startswith(arm + "/") or k.endswith("/scalar_bt"))]
        if not scalars:
            continue
        best = max(scalars, key=lambda k: out[k]["final_mean_ci"][0])
        target = out[best]["final_mean_ci"][0]
        for k in [k for k in out if k.startswith(arm + "/")]:
            reach = {s: first_reaching([{"iteration": p["iteration"], "test": {"fact_score": p["test"]}} for p in c], target)
                     for s, c in out[k]["curves"].items()}
            out[k].setdefault("reach", {})[arm] = {"baseline": best, "target": target,
                                                  "rollouts": {s: (None if it is None else it * batch_size) for s, it in reach.items()}}
    return out


GOAL_SHARE = 0.8  # the study's bar: Text2Grad ahead at the end on >= 4 of 5 seeds


def final_spread(summary: Mapping[str, Any], arm: str) -> tuple[float, float, float] | None:
    """(lowest, highest) mean final test score among the methods that read ``arm``'s critic (scalar_bt reads none),
    and the widest 95 % half-width among them; None with fewer than two such methods."""
    rows = [r for k, r in summary.items() if k.startswith(arm + "/") and not k.endswith("/scalar_bt")]
    if len(rows) < 2:
        return None
    means = [r["final_mean_ci"][0] for r in rows]
    widths = [r["final_mean_ci"][1] for r in rows if r["final_mean_ci"][1] == r["final_mean_ci"][1]]
    return min(means), max(means), max(widths, default=0.0)


FLAT = 0.02  # a mean test curve that moves more than this over its last evaluation interval has not flattened


def last_step(row: Mapping[str, Any]) -> tuple[tuple[int, int], float]:
    """((first, last) iteration of the last evaluation interval, change of the seeds' mean test score over it)."""
    curves = list(row["curves"].values())
    its = [p["iteration"] for p in curves[0]]
    mean = lambda i: statistics.fmean(c[i]["test"] for c in curves)  # noqa: E731
    return (its[-2], its[-1]), mean(-1) - mean(-2)


def compare_to_best_scalar(summary: Mapping[str, Any], arm: str) -> dict[str, Any] | None:
    """Text2Grad vs the best scalar baseline of ``arm`` (by mean final test score), seed by seed."""
    t2g = summary.get(f"{arm}/text2grad")
    if t2g is None or "reach" not in t2g or arm not in t2g["reach"]:
        return None
    base_key = t2g["reach"][arm]["baseline"]
    base = summary[base_key]
    seeds = sorted(set(t2g["final"]) & set(base["final"]), key=int)
    diffs = [t2g["final"][s] - base["final"][s] for s in seeds]
    early = [t2g["early"][s] - base["early"][s] for s in seeds]
    return {"baseline": base_key, "seeds": len(seeds), "ahead_final": sum(d > 0 for d in diffs),
            "diff_final": mean_ci95(diffs), "ahead_early": sum(d > 0 for d in early), "diff_early": mean_ci95(early)}


def _pm(mc: Sequence[float]) -> str:
    m, h = mc
    return f"{m:.3f}" if h != h else f"{m:.3f} ± {h:.3f}"


def interpret(summary: Mapping[str, Any], sft_test: float, sft_recall_false: tuple[float, float] = (float("nan"), float("nan"))) -> list[str]:
    """Sentences read from the numbers: who is ahead at the end and when early-stopped, on how many seeds, whether
    the interval of the difference excludes zero, the poor-token shift, and the rollouts to the baseline."""
    lines = []
    for arm in ARMS:
        cmp = compare_to_best_scalar(summary, arm)
        if cmp is None:
            continue
        t2g = summary[f"{arm}/text2grad"]
        base_label = LABELS[cmp["baseline"].split("/")[1]]
        d, h = cmp["diff_final"]
        where = "level with" if abs(d) < 0.0005 else "ahead of" if d > 0 else "behind"
        sure = ("the 95 % interval of the paired difference excludes zero" if h == h and abs(d) > h else
                "the 95 % interval of the paired difference includes zero, so this is not a reliable difference")
        lines.append(
            f"With {arm} feedback, Text2Grad ends training at {_pm(t2g['final_mean_ci'])} (SFT start {sft_test:.3f}), "
            + ("" if where == "level with" else f"{abs(d):.3f} ") + f"{where} the best scalar baseline ({base_label}, {_pm(summary[cmp['baseline']]['final_mean_ci'])}); "
            f"it is ahead on {cmp['ahead_final']} of {cmp['seeds']} seeds, and {sure}.")
        need = math.ceil(GOAL_SHARE * cmp["seeds"])
        lines.append(
            f"The study's goal, Text2Grad ahead of that baseline at the end of training on at least {need} of "
            f"{cmp['seeds']} seeds, is {'met' if cmp['ahead_final'] >= need else 'not met'} in the {arm} arm.")
        spread = final_spread(summary, arm)
        if spread is not None:
            lo, hi, widest = spread
            lines.append(
                f"The methods that read the {arm} arm's critic end between {lo:.3f} and {hi:.3f} (a range of {hi - lo:.3f}), "
                + ("less than the widest 95 % interval half-width among them (" if hi - lo < widest else
                   "more than the widest 95 % interval half-width among them (")
                + f"{widest:.3f}): "
                + ("by these unpaired intervals they cannot be told apart at the end of training (the paired "
                   "comparison above is the sharper test)." if hi - lo < widest else
                   "at the end of training at least two of them differ by more than their seed noise."))
        (t_last, t_step), (b_last, b_step) = last_step(t2g), last_step(summary[cmp["baseline"]])
        lines.append(
            f"Over the last evaluation interval (iterations {t_last[0]}-{t_last[1]}) Text2Grad's mean test score moved by "
            f"{t_step:+.3f}, the baseline's by {b_step:+.3f}"
            + (": Text2Grad's curve had not flattened when training ended." if abs(t_step) > FLAT else "."))
        de, he = cmp["diff_early"]
        lines.append(
            f"Early-stopped on validation, Text2Grad scores {_pm(t2g['early_mean_ci'])} against "
            f"{_pm(summary[cmp['baseline']]['early_mean_ci'])} ({'+' if de >= 0 else '-'}{abs(de):.3f}; ahead on "
            f"{cmp['ahead_early']} of {cmp['seeds']} seeds).")
        reach = t2g["reach"][arm]["rollouts"]
        got = [v for v in reach.values() if v is not None]
        lines.append(
            f"Text2Grad reached that baseline's mean final score ({t2g['reach'][arm]['target']:.3f}) on {len(got)} of "
            f"{len(reach)} seeds" + (f", after {statistics.median(got):.0f} rollouts (median)." if got else "."))
        base = summary[cmp["baseline"]]
        (r1, f1), (r2, f2) = t2g.get("recall_false", (math.nan,) * 2), base.get("recall_false", (math.nan,) * 2)
        if all(x == x for x in (r1, f1, r2, f2)):
            lines.append(
                f"At the end, Text2Grad's test summaries state {r1:.3f} of the five facts correctly with {f1:.2f} false "
                f"facts each, the baseline's {r2:.3f} with {f2:.2f} (the start policy: {sft_recall_false[0]:.3f} and "
                f"{sft_recall_false[1]:.2f}).")
        shift = t2g["true_label_shift"]
        if "poor_first" in shift:
            pf, g = shift["poor_first"], shift.get("good", float("nan"))
            lines.append(
                f"On the SFT policy's test summaries, the first tokens of truly wrong facts changed by {pf:+.3f} nats "
                f"under Text2Grad ({'down' if pf < 0 else 'up'}), truly correct facts by {g:+.3f}"
                + (", so the wrong facts lost probability relative to the correct ones." if pf < g else
                   ", so the wrong facts did not lose probability relative to the correct ones."))
    return lines


def interpret_ablations(abl: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """For each ablation: its end-of-training test score and KL against the unchanged setting."""
    if "none" not in abl:
        return []
    ref = abl["none"]
    lines = [f"The unchanged setting ends at {_pm(ref['final'])} with KL {ref['kl'][0]:.2f} nats and peaks at "
             f"{_pm(ref['peak'])}."]
    for name, a in abl.items():
        if name == "none":
            continue
        d = a["final"][0] - ref["final"][0]
        dk = a["kl"][0] - ref["kl"][0]
        lines.append(f"{name}: ends at {_pm(a['final'])} ({d:+.3f} vs unchanged), KL {a['kl'][0]:.2f} ({dk:+.2f}); "
                     + ("it removes the late decline." if a["final"][0] >= a["peak"][0] - 0.02 and d > 0 else
                        "the late decline remains." if a["final"][0] < a["peak"][0] - 0.02 else
                        "no decline, but no gain either.")
                     + _decline_words(a.get("decline_start"), ref.get("decline_start")))
    return lines


def decline_start(curve: Sequence[Mapping[str, Any]], drop: float = 0.05) -> int | None:
    """The first evaluated iteration after the test peak whose test fact score is more than ``drop`` below the
    peak, or None if the curve never falls that far."""
    scores = [p["test"]["fact_score"] for p in curve]
    top = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return next((curve[i]["iteration"] for i in range(top + 1, len(scores)) if scores[i] < scores[top] - drop), None)


def _decline_words(starts: Sequence[int | None] | None, ref: Sequence[int | None] | None) -> str:
    """' A fall of more than 0.05 below the peak starts at iteration 75, 90 per seed (unchanged: 30, 30).'"""
    if not starts or not ref:
        return ""
    fmt = lambda xs: ", ".join("never" if x is None else str(x) for x in xs)  # noqa: E731
    return f" A fall of more than 0.05 below the peak starts at iteration {fmt(starts)} per seed (unchanged: {fmt(ref)})."


def summarize_ablations(results: Mapping[RunSpec, Mapping[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for spec, res in results.items():
        if spec.phase == "ablation":
            groups.setdefault(spec.ablation, []).append(res)
    return {name: {"final": mean_ci95([r["final"]["test"]["fact_score"] for r in rs]),
                   "peak": mean_ci95([max(p["test"]["fact_score"] for p in r["curve"]) for r in rs]),
                   "kl": mean_ci95([r["final"].get("kl") or 0.0 for r in rs]), "seeds": len(rs),
                   "decline_start": [decline_start(r["curve"]) for r in sorted(rs, key=lambda r: r["spec"]["seed"])],
                   "poor_first": mean_ci95([r["true_label_shift"].get("poor_first", {}).get("mean", float("nan")) for r in rs])}
            for name, rs in groups.items()}


def sweep_markdown(study: Mapping[str, Any]) -> list[str]:
    """The sweep's table: every setting tried per (arm, method) with its validation score, the chosen one in bold."""
    lines = [f"Sweep (seed {study['config'].get('sweep_seed')}, validation fact score averaged over the last two "
             "evaluation points; the chosen setting in bold):", "", "| arm / method | settings tried: validation score |",
             "|---|---|"]
    for key, row in study["sweep"].items():
        tried = []
        for t in row["tried"]:
            cell = f"{Setting(**t['setting']).label()}: {t['val_end']:.3f}"
            tried.append(f"**{cell}**" if t["setting"] == row["chosen"] else cell)
        lines.append(f"| {key} | " + "; ".join(tried) + " |")
    return lines


def start_policy_lines(study: Mapping[str, Any]) -> list[str]:
    """A sentence when the sweep's runs started from another SFT policy than the final runs (a study resumed on
    another machine: the SFT run is retrained there), with both policies' scores; nothing when they are the same."""
    then, now = study.get("sweep_sft"), study["sft"]
    if not then or all(math.isclose(then[s]["fact_score"], now[s]["fact_score"], abs_tol=1e-9) for s in ("val", "test")):
        return []
    return ["", f"The sweep's runs started from an SFT policy scoring {then['val']['fact_score']:.3f} on validation and "
                f"{then['test']['fact_score']:.3f} on test; the final runs from one scoring {now['val']['fact_score']:.3f} "
                f"and {now['test']['fact_score']:.3f}."]


def markdown(study: Mapping[str, Any]) -> str:
    summ, sft = study["final"], study["sft"]["test"]["fact_score"]
    knobs = sorted({k for v in study.get("sweep", {}).values() for k in v.get("knobs", [])})
    cfg = study["config"]
    lines = [f"Policy: {cfg.get('policy', 'tiny Llama')}. Test fact score ({cfg.get('n_test', 100)} posts, greedy) after "
             f"{cfg['iterations']} iterations x "
             f"{study['config']['batch_size']} rollouts; mean ± 95 % interval over seeds. SFT start: {sft:.3f}. "
             f"Settings chosen on validation over: {', '.join(knobs) if knobs else 'nothing (base setting)'}.", "",
             "| arm | method | chosen setting (validation) | final | early-stopped (iteration chosen) | KL at end | "
             "poor-first / good token shift (true labels) | rollouts to best scalar's final |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for key, r in summ.items():
        s = r["setting"]
        its = ", ".join(str(v) for v in r["early_iteration"].values())
        reach = r.get("reach", {}).get(r["arm"], {}).get("rollouts", {})
        shift = r["true_label_shift"]
        lines.append(
            f"| {r['arm'] if r['method'] != 'scalar_bt' else 'both'} | {LABELS[r['method']]} | lr {s['lr']:g}, KL {s['kl']}, "
            f"lambda {s['lam']:g} | {_pm(r['final_mean_ci'])} | {_pm(r['early_mean_ci'])} ({its}) | {_pm(r['kl_end'])} | "
            f"{shift.get('poor_first', float('nan')):+.3f} / {shift.get('good', float('nan')):+.3f} | "
            + (", ".join("-" if v is None else str(v) for v in reach.values()) or "") + " |")
    lines += start_policy_lines(study)
    sft_all = study["sft"]["test"]
    lines += ["", *interpret(summ, sft, (sft_all.get("fact_recall", float("nan")), sft_all.get("n_false", float("nan"))))]
    if study.get("sweep"):
        lines += ["", *sweep_markdown(study)]
    if study.get("paper_comparison"):
        rows = study["paper_comparison"]
        lines += ["", f"PPO settings against the paper's (SLF5K, Table 10, as in configs/slf5k/ppo.yaml), for "
                  f"{study['paper_comparison_for']}; {sum(r['same'] for r in rows)} of {len(rows)} fields agree:", "",
                  "| field | this study | paper | why it differs |", "|---|---|---|---|"]
        lines += [f"| {r['field']} | {r['study']} | {r['paper']} | {'same' if r['same'] else r['why']} |" for r in rows]
    if study.get("ablations"):
        lines += ["", "| ablation (learned-arm Text2Grad, quickstart setting) | final | peak | KL at end | poor-first shift |",
                  "|---|---:|---:|---:|---:|"]
        for name, a in study["ablations"].items():
            lines.append(f"| {name} | {_pm(a['final'])} | {_pm(a['peak'])} | {_pm(a['kl'])} | {_pm(a['poor_first'])} |")
        lines += ["", *interpret_ablations(study["ablations"])]
    return "\n".join(lines)


# The PPO fields set by the paper's Table 10 (configs/slf5k/ppo.yaml transcribes it for SLF5K), with why the study
# differs where it does.
PAPER_FIELDS: dict[str, str] = {
    "learning_rate": "swept per method on validation; the paper's value is for an 8B LoRA policy",
    "lr_scheduler_type": "constant, so every sweep run ends at the step size it is judged by",
    "batch_size": "the study's rollouts per iteration (its budget is iterations x batch)",
    "num_ppo_epochs": "2 epochs of 2 minibatches: the CPU budget of a study of many runs",
    "num_mini_batches": "",
    "kl_coef": "the fixed coefficient, or the adaptive controller's start (the KL knob of the sweep)",
    "adaptive_kl": "swept per method: fixed coefficient or the paper's controller",
    "target_kl": "",
    "lam": "swept per method on validation",
    "gamma": "",
    "cliprange": "",
    "vf_coef": "",
    "entropy_coef": "",
    "value_learning_rate": "the policy's learning rate (the study does not tune the value head separately)",
    "response_length": "the task's summaries are short",
    "temperature": "",
    "use_lora": "the tiny Llama is fully fine-tuned; SmolLM2 gets a LoRA (r 16) as the paper's 8B policy",
    "lora_r": "",
    "missing_eos_penalty": "no penalty: the task's summaries end by themselves well within response_length",
}


def paper_comparison(cfg: PPOConfig, paper_yaml: Path = ROOT / "configs" / "slf5k" / "ppo.yaml") -> list[dict[str, Any]]:
    """The study's PPO values next to the paper's (SLF5K, Table 10) for every field of `PAPER_FIELDS`."""
    paper = yaml.safe_load(paper_yaml.read_text())
    rows = []
    for name, why in PAPER_FIELDS.items():
        ours, theirs = getattr(cfg, name), paper.get(name, getattr(PPOConfig, name, None))
        if name == "value_learning_rate" and ours is None:
            ours = cfg.learning_rate
        if name == "lora_r" and not cfg.use_lora:
            ours = None
        same = ours == theirs or (isinstance(ours, float) and isinstance(theirs, float) and math.isclose(ours, theirs))
        rows.append({"field": name, "study": ours, "paper": theirs, "same": same, "why": "" if same else why})
    return rows


def plot(summary: Mapping[str, Any], png: Path) -> None:

    arms = sorted({r["arm"] for r in summary.values()})
    fig, axes = plt.subplots(1, len(arms), figsize=(6 * len(arms), 4), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        for key, r in summary.items():
            if r["arm"] != arm and r["method"] != "scalar_bt":
                continue
            curves = list(r["curves"].values())
            its = [p["iteration"] for p in curves[0]]
            stats = [mean_ci95([c[i]["test"] for c in curves]) for i in range(len(its))]
            mean = [m for m, _ in stats]
            half = [0.0 if h != h else h for _, h in stats]
            ax.plot(its, mean, label=LABELS[r["method"]])
            ax.fill_between(its, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], alpha=0.2)
        ax.set_title(f"{arm} feedback")
        ax.set_xlabel("PPO iteration")
        ax.set_ylabel("test fact score")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# Setup and main
# --------------------------------------------------------------------------------------------------


# The SmolLM2 study's start: LoRA SFT on the task (the paper's order: SFT, then the reward model, then PPO), and the
# PPO policy as a LoRA adapter on the merged SFT weights (PPO's reference is that merged start policy).
SMOLLM2_LORA = ["--use_lora", "true", "--lora_r", "16", "--lora_alpha", "32"]
SMOLLM2_SFT_ARGS = [*SMOLLM2_LORA, "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"]


def study_config(args: argparse.Namespace, shared: Path) -> QuickstartConfig:
    """The quickstart configuration the study builds its task, SFT policy and reward models with."""
    base = dict(output_dir=str(shared), seed=args.task_seed, modes=["nl_gradient"], early_stopping=True)
    if args.preset != "smollm2":
        return resolve(QuickstartConfig(preset=args.preset, **base))
    # the quickstart's smollm2 preset starts PPO from SmolLM2 as it is; the study fine-tunes it on the task first
    return resolve(QuickstartConfig(
        preset="smollm2", **base, sft_model="", policy_model=SMOLLM2, sft_steps=args.sft_steps,
        policy_sft_steps=args.sft_steps, sft_learning_rate=args.sft_learning_rate, sft_decay_steps=0,
        n_rl=256, n_eval=100, ppo_batch_size=args.batch_size or 8, sft_args=SMOLLM2_SFT_ARGS))


def _merged_policy(adapter_dir: Path, out: Path) -> Path:
    """The LoRA SFT adapter folded into its base, saved once to ``out`` (the start policy every run loads)."""
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + ".tmp")
        load_causal_lm(str(adapter_dir), merge_adapter=True).save_pretrained(tmp)
        load_tokenizer(str(adapter_dir)).save_pretrained(tmp)
        tmp.replace(out)
    return out


def build_context(args: argparse.Namespace, keys: Sequence[tuple[str, str]]) -> StudyContext:
    """Data, SFT policy, the reward models ``keys`` need (the generative ones for a learned arm, the Bradley-Terry
    one for scalar_bt; cached like the quickstart's), and the SFT policy's validation and test scores."""

    out = Path(args.output_dir)
    shared = out / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    cfg = study_config(args, shared)
    qs._COMMAND_LOG[:] = [out / "commands.sh"]
    (out / "commands.sh").write_text("#!/usr/bin/env bash\n# Every phase command the study's setup ran, in order.\n")
    stages = qs.StageClock(qs.STAGES)
    data = qs.stage_data(cfg, shared)
    sft, rm_base = qs.stage_policy(cfg, data)
    if (sft / "adapter_config.json").is_file() and not (sft / "config.json").is_file():
        sft = _merged_policy(sft, shared / "sft_merged")
    learned = {m for a, m in keys if a == "learned" and m != "scalar_bt"}
    rm = dense_rm = scalar_rm = ""
    if learned - {"dense"}:
        rm = str(qs.stage_reward_model(cfg, data, sft, rm_base, shared / "text2grad_rm", stages)[0])
    if "dense" in learned:
        dense_cfg = replace(cfg, critic="benchmarks.baselines:DenseFactCritic")
        dense_rm = str(qs.stage_reward_model(dense_cfg, data, sft, rm_base, shared / "dense_rm", stages)[0])
    stages.finish()
    if any(m == "scalar_bt" for _, m in keys):
        scalar_rm = str(shared / "scalar_rm")
        if not (shared / "scalar_rm" / "eval_pairwise.json").is_file():
            pairs = preference_pairs(list(iter_jsonl(data["train"])), cfg.seed, cfg.rm_p_wrong)
            write_jsonl(shared / "preference_pairs.jsonl", pairs)
            qs._call("reward_model.scalar", [
                "--model_name_or_path", str(rm_base), "--dataset_path", str(shared / "preference_pairs.jsonl"),
                "--eval_fraction", "0.1", "--output_dir", scalar_rm, "--use_lora", "false", "--prompt_template", "{prompt}",
                "--max_length", "256", "--max_steps", "300", "--learning_rate", "5e-4", "--per_device_train_batch_size", "16",
                "--logging_steps", "50", "--save_steps", str(10 ** 9), "--progress_bar", "false", "--seed", str(cfg.seed),
            ])
    lora = {"use_lora": True, "lora_r": 16, "lora_alpha": 32} if args.preset == "smollm2" else {}
    ctx = StudyContext(
        sft=str(sft), rl=str(data["rl"]), val_records=list(iter_jsonl(data["val"])),
        test_records=list(iter_jsonl(data["eval"])), rm=rm, dense_rm=dense_rm, scalar_rm=scalar_rm,
        iterations=args.iterations, eval_every=args.eval_every, batch_size=args.batch_size or cfg.ppo_batch_size,
        response_length=cfg.response_length, kl_coef=cfg.kl_coef, target_kl=args.target_kl, out=str(out),
        use_chat_template=cfg.use_chat_template, ppo_fields=lora,
    )
    torch.set_num_threads(1)
    tok, model = load_tokenizer(ctx.sft), load_causal_lm(ctx.sft).eval()
    ctx.sft_scores = {split: _greedy(model, tok, recs, ctx.response_length, ctx.use_chat_template)[0]
                      for split, recs in (("val", ctx.val_records), ("test", ctx.test_records))}
    return ctx


def study_identity(args: argparse.Namespace) -> dict[str, Any]:
    """What a finished run's result depends on besides its RunSpec: runs are resumed by RunSpec alone, so a folder
    must hold one study of one identity."""
    ident = {k: getattr(args, k) for k in ("preset", "task_seed", "iterations", "eval_every", "batch_size", "target_kl")}
    if args.preset == "smollm2":
        ident.update(sft_steps=args.sft_steps, sft_learning_rate=args.sft_learning_rate)
    return ident


def check_same_study(stored: Mapping[str, Any] | None, current: Mapping[str, Any], folder: str) -> None:
    """Refuse to resume a folder whose runs were made with other settings (their results would be mixed in)."""
    if stored is None:
        return
    diff = {k: (stored.get(k), v) for k, v in current.items() if stored.get(k) != v}
    if diff:
        raise SystemExit(
            f"{folder} holds a study made with other settings ("
            + "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            + "): its finished runs would be reused as if they were this study's. Pass another --output_dir, or the "
            "folder's own settings to continue it.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/method_study")
    parser.add_argument("--phases", nargs="+", default=["sweep", "final", "ablation", "report"],
                        choices=["sweep", "final", "ablation", "report"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds of the final phase")
    parser.add_argument("--sweep_seed", type=int, default=100, help="seed of every sweep run (not one of --seeds)")
    parser.add_argument("--ablation_seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--ablations", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    parser.add_argument("--preset", default="default", choices=["ci", "default", "large", "smollm2"],
                        help="quickstart preset (task, SFT, reward models); smollm2: LoRA SFT of SmolLM2-135M-Instruct "
                        "on the task, then LoRA PPO")
    parser.add_argument("--sft_steps", type=int, default=10,
                        help="smollm2: LoRA SFT steps (batch 16). 10 leave room for PPO (validation fact score 0.34, "
                        "1.5 false facts per summary); 40 already reach 0.94, leaving PPO little to improve")
    parser.add_argument("--sft_learning_rate", type=float, default=1e-3, help="smollm2: LoRA SFT learning rate")
    parser.add_argument("--batch_size", type=int, default=0, help="rollouts per PPO iteration (0: the preset's)")
    parser.add_argument("--task_seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=90, help="PPO iterations per run (x --batch_size rollouts)")
    parser.add_argument("--eval_every", type=int, default=15)
    parser.add_argument("--sweep_knobs", nargs="+", default=["lambda", "lr", "kl"], choices=["lambda", "lr", "kl"],
                        help="which coordinates the sweep searches (the others stay at the base setting)")
    parser.add_argument("--base_lr", type=float, default=1e-4, help="the sweep's starting learning rate")
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-5, 3e-4], help="learning rates tried at the best lambda")
    parser.add_argument("--base_lambda", type=float, default=0.95, help="the sweep's starting GAE lambda")
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS), help="GAE lambdas the sweep tries")
    parser.add_argument("--target_kl", type=float, default=6.0, help="target of the adaptive KL setting (the paper's: 6 nats)")
    parser.add_argument("--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))), help="runs at a time (one thread each)")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    keys = method_keys(args.arms, args.methods)
    # the ablations run learned-arm Text2Grad (and the oracle critic), whatever --arms says
    ctx = build_context(args, keys + ([("learned", "text2grad")] if "ablation" in args.phases else []))
    base = Setting(lr=args.base_lr, kl="fixed", lam=args.base_lambda)
    study_path = Path(args.output_dir) / "study.json"
    study: dict[str, Any] = json.loads(study_path.read_text()) if study_path.is_file() else {}
    check_same_study(study.get("identity"), study_identity(args), args.output_dir)
    study["identity"] = study_identity(args)
    study.update({"config": {k: v for k, v in vars(args).items()}, "sft": ctx.sft_scores,
                  "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                  "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),  # read by benchmarks/results_tables.py
                  "command": "python benchmarks/method_study.py " + " ".join(sys.argv[1:] if argv is None else argv)})
    study["config"].update(batch_size=ctx.batch_size, n_test=len(ctx.test_records), n_val=len(ctx.val_records),
                           policy="SmolLM2-135M-Instruct (LoRA SFT, LoRA PPO)" if args.preset == "smollm2" else
                           f"tiny Llama of the quickstart's {args.preset} preset")
    if "sweep" in args.phases:
        study["sweep"] = {**study.get("sweep", {}),
                          **sweep(ctx, keys, base, args.lrs, args.sweep_seed, args.jobs, args.sweep_knobs, args.lambdas)}
        study["sweep_sft"] = ctx.sft_scores  # the start policy the choices were made from
        _write_json(study_path, study)
    chosen = chosen_settings(study.get("sweep", {}), keys, base)
    finals = [RunSpec(a, m, chosen[(a, m)], s, "final") for a, m in keys for s in args.seeds]
    if "final" in args.phases:
        run_all(ctx, finals, args.jobs)
    quick = Setting(lr=1e-4, kl="fixed", lam=0.0)  # the quickstart's setting, where the collapse was seen
    ablations = [RunSpec("learned", "text2grad", quick, s, "ablation", name) for name in args.ablations for s in args.ablation_seeds]
    if "ablation" in args.phases:
        run_all(ctx, ablations, args.jobs)
    results = {s: r for s in [*finals, *ablations] if (r := _load_result(ctx, s)) is not None}
    t2g = next(((a, m) for a, m in keys if m == "text2grad"), keys[0])
    study["paper_comparison_for"] = f"{t2g[0]}-arm {LABELS[t2g[1]]} at its chosen setting ({chosen[t2g].label()})"
    study["paper_comparison"] = paper_comparison(_ppo_config(ctx, RunSpec(*t2g, chosen[t2g], 0, "final"),
                                                             Path(args.output_dir) / "unused"))
    study["final"] = summarize_final(results, keys, args.seeds, ctx.batch_size)
    # a phase whose runs are not in this folder keeps the summary stored in study.json (e.g. from an earlier machine)
    study["ablations"] = summarize_ablations(results) or study.get("ablations", {})
    study["seconds"] = time.perf_counter() - t0
    _write_json(study_path, study)
    if study["final"]:
        plot(study["final"], Path(args.output_dir) / "curves.png")
    md = markdown(study)
    (Path(args.output_dir) / "study.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
