"""What the method study compares and how it reports it: the methods, their tuned settings, the statistics, and
every table, sentence and plot of study.md (each interpreting sentence is generated from the numbers).

Pure functions over result dictionaries (no model, no training): `benchmarks/method_study.py` runs the study and
calls these; tests/benchmarks/test_method_study.py checks them on hand-made results.
"""

from __future__ import annotations

import io
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import matplotlib
import yaml
from scipy.stats import binomtest
from scipy.stats import t as student_t

from policy_optimization.ppo_config import PPOConfig
from text2grad.apps.quickstart.task import SLOTS
from text2grad.core.data import write_whole

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("text2grad", "scalar_sum", "scalar_collapsed", "dense", "scalar_bt", "scalar_task")
ARMS = ("oracle", "learned")
LABELS = {"sft": "SFT policy (start)", "text2grad": "Text2Grad (span rewards)",
          "scalar_sum": "scalar PPO, Text2Grad's token rewards summed",
          "scalar_collapsed": "scalar PPO, critic's quotes collapsed", "dense": "dense-label PPO",
          "scalar_bt": "scalar PPO, Bradley-Terry RM", "scalar_task": "scalar PPO, the task's fact score (oracle)"}
REWARD_MODE = {"text2grad": "nl_gradient", "scalar_sum": "scalar_sum", "scalar_collapsed": "scalar", "dense": "dense",
               "scalar_bt": "scalar", "scalar_task": "scalar"}
# Methods whose whole reward is one number at the last token; the headline compares Text2Grad with the best of them.
SCALAR_METHODS = ("scalar_sum", "scalar_collapsed", "scalar_bt", "scalar_task")
# Methods that read no critic: each is run under one arm only (the Bradley-Terry model is learned from preference
# pairs; the task's own score is the oracle's).
CRITIC_FREE = {"scalar_bt": "learned", "scalar_task": "oracle"}
# What each arm's critic knows, in increasing order: a critic-free baseline is a fair comparison in an arm whose
# critic knows at least what the baseline's own arm knows (the Bradley-Terry model in both arms; the task's own
# score, which is the oracle's information, only in the oracle arm).
ARM_INFORMATION = {"learned": 0, "oracle": 1}
LAMBDAS = (0.0, 0.95, 1.0)
KL_COEFS = (0.05, 0.1, 0.3, 1.0)  # the fixed-coefficient sweep, beside the adaptive controller
SMALLEST_LR_EDGE = "the smallest learning rate tried"  # the edge that leads towards the start policy (lr 0)
N_FACTS = len(SLOTS)  # the task's key facts: fact score = recall - false facts / N_FACTS

@dataclass(frozen=True)
class Setting:
    """The tuned knobs of one method: learning rate, KL control and GAE lambda."""

    lr: float
    kl: str  # "fixed" (kl_coef constant) or "adaptive" (the controller toward target_kl, horizon in iterations)
    lam: float
    kl_coef: float | None = None  # None: the preset's fixed coefficient (fixed), 0.2 (adaptive: its start)

    def label(self) -> str:
        coef = "" if self.kl_coef is None else f" {self.kl_coef:g}"
        return f"lr {self.lr:g}, KL {self.kl}{coef}, lambda {self.lam:g}"

    @property
    def kl_tag(self) -> str:
        return self.kl if self.kl_coef is None else f"{self.kl}{self.kl_coef:g}"


def save_figure(fig, png: Path, **kwargs: Any) -> None:
    """``fig.savefig`` as one whole-file write (``write_whole``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **kwargs)
    write_whole(png, buf.getvalue())


def method_label(name: str) -> str:
    method, _, variant = name.partition("+")
    return LABELS[method] + (f" + {variant}" if variant else "")


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
# Summary and report (every interpreting sentence is generated from the numbers)
# --------------------------------------------------------------------------------------------------


def summarize_final(results: Mapping[Any, Mapping[str, Any]], keys, seeds: Sequence[int], batch_size: int) -> dict[str, Any]:
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
            # the validation curves, so early-stopping choices can be re-derived from study.json
            "val_curves": {s: [{"iteration": p["iteration"], "val": p["val"]["fact_score"]} for p in r["curve"]]
                           for s, r in runs.items()},
            "kl_final": {s: r["final"].get("kl") or 0.0 for s, r in runs.items()},
            "cpu": sorted({r.get("cpu", "not recorded") for r in runs.values()}),
            "true_label_shift": shift,
            "recall_false": [statistics.fmean(r["final"]["test"].get(k, float("nan")) for r in runs.values())
                             for k in ("fact_recall", "n_false")],
            **({"reward_signal": signal} if (signal := reward_signal(runs.values())) else {}),
        }
    for arm in {a for a, _ in keys}:
        # every plain scalar baseline of this arm, and the critic-free ones that know no more than its critic
        scalars = [k for k in out if k.split("/")[1].partition("+")[0] in SCALAR_METHODS
                   and compared_in(arm, *k.split("/", 1))]
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


# The training metrics that show what reward a run's critic gave (policy_optimization/rollout.py,
# text2grad/core/rewards.py): the summed token reward per response, and the share of its tokens labelled +-1.
SIGNAL_METRICS = ("reward/score_mean", "tokens/labelled_share")


def reward_signal(runs: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each of `SIGNAL_METRICS` averaged over every logged iteration of every run (its ``metrics`` list); a metric
    no run logged is left out."""
    out = {}
    for name in SIGNAL_METRICS:
        values = [m[name] for r in runs for m in r.get("metrics", []) if m.get(name) is not None]
        if values:
            out[name] = statistics.fmean(values)
    return out


def compared_in(arm: str, run_arm: str, method: str) -> bool:
    """Whether a run of ``method`` under ``run_arm`` is a baseline of ``arm``: it read that arm's critic, or it read
    no critic (`CRITIC_FREE`) and its information is no more than the arm's (`ARM_INFORMATION`), so that a learned
    critic is never measured against a baseline that reads the true score."""
    if method not in CRITIC_FREE:
        return run_arm == arm
    return ARM_INFORMATION[CRITIC_FREE[method]] <= ARM_INFORMATION.get(arm, 0)


GOAL_SHARE = 0.8  # the study's bar: Text2Grad ahead at the end on >= 4 of 5 seeds


def final_spread(summary: Mapping[str, Any], arm: str) -> tuple[float, float, float] | None:
    """(lowest, highest) mean final test score among the methods that read ``arm``'s critic (scalar_bt reads none),
    and the widest 95 % half-width among them; None with fewer than two such methods, or where one has no interval
    (a single seed measures no seed noise to compare the range with)."""
    rows = [r for k, r in summary.items() if k.startswith(arm + "/") and r["method"] not in CRITIC_FREE]
    widths = [r["final_mean_ci"][1] for r in rows]
    if len(rows) < 2 or any(math.isnan(w) for w in widths):
        return None
    means = [r["final_mean_ci"][0] for r in rows]
    return min(means), max(means), max(widths)


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
    return {"baseline": base_key, "seeds": len(seeds), "ahead_final": count_ahead(diffs),
            "diff_final": mean_ci95(diffs), "ahead_early": count_ahead(early), "diff_early": mean_ci95(early),
            "pair_final": paired({s: t2g["final"][s] for s in seeds}, {s: base["final"][s] for s in seeds})}


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
        base_label = method_label(cmp["baseline"].split("/")[1])
        d, h = cmp["diff_final"]
        where = "level with" if abs(d) < 0.0005 else "ahead of" if d > 0 else "behind"
        lo, hi = d - h, d + h
        interval = (f"the 95 % interval of the paired difference is [{lo:+.3f}, {hi:+.3f}]" if h == h else
                    "one seed gives no interval of the paired difference")
        sign_p = sign_test(cmp["pair_final"]["diffs"]) if "pair_final" in cmp else float("nan")
        sign = "" if sign_p != sign_p else f" (exact two-sided sign test p = {sign_p:.3g})"
        sure = (f"{interval}, so this is not a reliable difference" if h != h else
                f"{interval}{sign}, which excludes zero" if abs(d) > h else
                f"{interval}{sign}, which includes zero, so this is not a reliable difference")
        lines.append(
            f"With {arm} feedback, Text2Grad ends training at {_pm(t2g['final_mean_ci'])} (SFT start {sft_test:.3f}), "
            + ("" if where == "level with" else f"{abs(d):.3f} ") + f"{where} the best scalar baseline ({base_label}, {_pm(summary[cmp['baseline']]['final_mean_ci'])}); "
            f"it is ahead on {cmp['ahead_final']} of {cmp['seeds']} seeds, and {sure}.")
        if summary[cmp["baseline"]]["final_mean_ci"][0] <= sft_test:
            lines.append(f"The best scalar baseline ends no better than the start policy ({_pm(summary[cmp['baseline']]['final_mean_ci'])} "
                         f"vs {sft_test:.3f}): no scalar baseline improved on the SFT policy here.")
        if t2g["final_mean_ci"][0] <= sft_test:
            lines.append(f"Text2Grad itself ends no better than the start policy ({_pm(t2g['final_mean_ci'])} vs "
                         f"{sft_test:.3f}).")
        need = math.ceil(GOAL_SHARE * cmp["seeds"])
        if cmp["seeds"] < 2:  # one pair is one draw: "ahead on 1 of 1" would call the goal met on a coin flip
            lines.append(f"With {cmp['seeds']} seed pair the study's goal (Text2Grad ahead of that baseline at the end "
                         f"of training on at least {GOAL_SHARE:.0%} of seeds) cannot be judged in the {arm} arm.")
        else:
            c = goal_conditions(cmp["pair_final"], late_declines(t2g.get("val_curves", {})),
                                (t2g["kl_end"][0], summary[cmp["baseline"]]["kl_end"][0]))
            lines.append(
                f"The study's goal (Text2Grad ahead of that baseline at the end of training on at least {need} of "
                f"{cmp['seeds']} seeds, within 0.02 of its own best validation point, at no larger final KL) "
                + ("cannot be judged" if (v := goal_verdict(c)) == "cannot be judged" else f"is {v}")
                + f" in the {arm} arm ({goal_checklist(c, cmp['seeds'])}).")
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


def summarize_ablations(results: Mapping[Any, Mapping[str, Any]]) -> dict[str, Any]:
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


def critic_quality_cells(study: Mapping[str, Any]) -> tuple[str, str]:
    """The learned critics' held-out quality (`method_study.critic_quality`) as two table cells, e.g.
    '0.759 (F1 good 0.70, poor 0.53; 200 held-out annotations, 1800 for training)' for the generative reward model's
    token-label accuracy and '0.702 (171 held-out pairs, 1541 for training)' for the Bradley-Terry model's pairwise
    accuracy; '-' for a critic not recorded."""
    gen, bt = study.get("critics", {}).get("generative"), study.get("critics", {}).get("bradley_terry")
    return ((f"{gen['token_accuracy']:.3f} (F1 good {gen['good_f1']:.2f}, poor {gen['poor_f1']:.2f}; {gen['n']} "
             f"held-out annotations, {gen['n_train']} for training)" if gen else "-"),
            f"{bt['pairwise_accuracy']:.3f} ({bt['n']} held-out pairs, {bt['n_train']} for training)" if bt else "-")


def critic_quality_lines(study: Mapping[str, Any]) -> list[str]:
    """A sentence on how good the learned critics are on held-out data; nothing when none was recorded."""
    quality = study.get("critics", {})
    gen, bt = critic_quality_cells(study)
    parts = []
    if "generative" in quality:
        parts.append(f"the generative reward model labels this share of tokens as the annotating critic does: {gen}; "
                     f"its output is valid JSON in {quality['generative']['json_validity'] * 100:.1f} % of cases")
    if "bradley_terry" in quality:
        parts.append(f"the Bradley-Terry reward model scores the better response of a pair higher in this share of "
                     f"pairs: {bt}")
    return ["", "The learned critics on held-out data: " + "; ".join(parts) + "."] if parts else []


def settings_from_sentence(origin: Mapping[str, Any]) -> str:
    """Where the settings came from when the study did not sweep (``--settings_from``): each method's row."""
    rows = origin["rows"]
    borrowed = [f"{k} from {v}" for k, v in rows.items() if v is not None and v != k]
    base = [k for k, v in rows.items() if v is None]
    edges = origin.get("edge_lines")
    source = (f"settings from this instance's own sweep in {origin['study']}" if "instance" in origin else
              f"settings from the sweep of {origin['study']}")
    return (f"No sweep on this instance: {source}"
            + (f" ({'; '.join(borrowed)})" if borrowed else "")
            + (f"; the base setting for {', '.join(base)}" if base else "") + "."
            + (" Of the rows taken there: " + " ".join(edges) if edges else
               " Every chosen value taken from there is interior to the values it was chosen from." if edges == []
               else ""))


def missing_runs_lines(study: Mapping[str, Any]) -> list[str]:
    """Sentences naming the requested final runs (``requested_final``: key -> seeds) and KL-frontier runs
    (``frontier_not_run``: key -> KL setting -> seeds) that have not finished, so that a report of a study still
    running says its numbers are over the finished runs only; nothing when all have."""
    requested, summ = study.get("requested_final", {}), study.get("final", {})
    missing, total, left_total = [], 0, 0
    for key, seeds in requested.items():
        done = {str(s) for s in summ.get(key, {}).get("final", {})}
        left = [str(s) for s in seeds if str(s) not in done]
        total, left_total = total + len(seeds), left_total + len(left)
        if left:
            arm, method = key.split("/")
            missing.append(f"{method_label(method)} ({arm} arm) seed{'s' if len(left) > 1 else ''} {', '.join(left)}")
    lines = [f"Partial: {total - left_total} of the {total} requested final runs have finished, so every number below "
             f"is over the finished seeds only. Not run yet: {'; '.join(missing)}."] if missing else []
    frontier = study.get("frontier_not_run", {})
    if frontier:
        left = [f"{method_label(key.split('/')[1])} ({key.split('/')[0]} arm) at KL {kl}, "
                f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                for key, by_kl in frontier.items() for kl, seeds in by_kl.items()]
        n_left = sum(len(seeds) for by_kl in frontier.values() for seeds in by_kl.values())
        lines.append(f"Of the {study.get('frontier_requested', n_left)} requested runs at the KL frontier's settings, "
                     f"{n_left} have not run, so the comparisons across KL settings choose among those that ran. "
                     f"Not run yet: {'; '.join(left)}.")
    return lines


def paragraphs(lines: Sequence[str]) -> str:
    """The report's lines as markdown, with at most one blank line between paragraphs and none at either end: a
    section with nothing to say leaves no gap behind."""
    kept: list[str] = []
    for line in lines:
        if line or (kept and kept[-1]):
            kept.append(line)
    while kept and not kept[-1]:
        kept.pop()
    return "\n".join(kept)


def markdown(study: Mapping[str, Any]) -> str:
    summ, sft = study["final"], start_test_score(study)
    knobs = sorted({k for v in study.get("sweep", {}).values() for k in v.get("knobs", [])})
    cfg = study["config"]
    lines = [f"Policy: {cfg.get('policy', 'tiny Llama')}. Test fact score ({cfg.get('n_test', 100)} posts, greedy) after "
             f"{cfg['iterations']} iterations x "
             f"{study['config']['batch_size']} rollouts; mean ± 95 % interval over seeds. SFT start: {sft:.3f}. "
             + (settings_from_sentence(study["settings_from"]) if study.get("settings_from") else
                f"Settings chosen on validation over: {', '.join(knobs) if knobs else 'nothing (base setting)'}."),
             *missing_runs_lines(study), "",
             "| arm | method | chosen setting (validation) | final | early-stopped (iteration chosen) | KL at end | "
             "poor-first / good token shift (true labels) | rollouts to best scalar's final |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for key, r in summ.items():
        s = r["setting"]
        its = ", ".join(str(v) for v in r["early_iteration"].values())
        reach = r.get("reach", {}).get(r["arm"], {}).get("rollouts", {})
        shift = r["true_label_shift"]
        lines.append(
            f"| {r['arm'] + (' (reads no critic)' if r['method'] in CRITIC_FREE else '')} | {method_label(r['method'])} | "
            f"{Setting(**s).label()} | {_pm(r['final_mean_ci'])} | {_pm(r['early_mean_ci'])} ({its}) | {_pm(r['kl_end'])} | "
            f"{shift.get('poor_first', float('nan')):+.3f} / {shift.get('good', float('nan')):+.3f} | "
            + (", ".join("-" if v is None else str(v) for v in reach.values()) or "") + " |")
    lines += start_policy_lines(study)
    lines += critic_quality_lines(study)
    sft_all = study["sft"].get("test", {})
    lines += ["", *interpret(summ, sft, (sft_all.get("fact_recall", float("nan")), sft_all.get("n_false", float("nan"))))]
    task = study.get("identity", {}).get("task_seed", 0)
    for arm, method in sorted({(r["arm"], r["method"]) for r in summ.values() if r["method"].startswith("text2grad")}):
        if "+" in method:  # each defended Text2Grad against the best scalar baseline
            lines += ["", *pooled_lines({task: study}, arm, method)[0]]
        # and every Text2Grad against the information-matched baseline (same critic output, summed at the end)
        if matched := pooled_lines({task: study}, arm, method, matched_baseline(method))[0]:
            lines += ["", *matched]
    if frontier := frontier_markdown(study):
        lines += ["", *frontier]
        for key in study["kl_frontier"]:
            arm, method = key.split("/")
            if method.partition("+")[0] == "text2grad":
                for against in kl_baselines(method):
                    lines += ["", *kl_on_validation_lines({task: study}, arm, method, against)[0]]
                    lines += ["", *kl_matched_lines({task: study}, arm, method, against)[0]]
                    if against is not None and (more := frontier_dominance_lines({task: study}, arm, method, against)[0]):
                        lines += ["", *more]
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
    return paragraphs(lines)


# The PPO fields set by the paper's Table 10 (configs/slf5k/ppo.yaml transcribes it for SLF5K), with why the study
# differs where it does.
PAPER_FIELDS: dict[str, str] = {
    "learning_rate": "{lr}; the paper's value is for an 8B LoRA policy",
    "lr_scheduler_type": "constant, so every sweep run ends at the step size it is judged by",
    "batch_size": "the study's rollouts per iteration (its budget is iterations x batch)",
    "num_ppo_epochs": "2 epochs of 2 minibatches: the CPU budget of a study of many runs",
    "num_mini_batches": "",
    "kl_coef": "{kl_coef}",
    "adaptive_kl": "{adaptive_kl}",
    "target_kl": "",
    "kl_horizon": "the adaptive controller's horizon in this run's iterations, so its target can bind within the run",
    "kl_horizon_unit": "",
    "lam": "{lam}",
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


def paper_reasons(knobs: Sequence[str], inherited: bool = False) -> dict[str, str]:
    """Why the swept fields differ from the paper's. ``knobs``: what the sweep that chose the settings swept, this
    study's own, or (``inherited``: ``--settings_from``) the earlier sweep's the study took its settings from; a
    field that sweep did not sweep kept the preset's value."""
    if inherited:
        swept = kl_swept = adaptive_swept = ("chosen per method on validation by the earlier sweep this study took its "
                                             "settings from")
        kept = "the preset's value, not swept by the earlier sweep this study took its settings from"
    else:
        swept, kept = "swept per method on validation", "the preset's value, not swept in this study"
        kl_swept = "chosen per method on validation among fixed coefficients and the adaptive controller's start"
        adaptive_swept = "chosen per method on validation: a fixed coefficient or the adaptive controller"
    return {
        "lr": swept if "lr" in knobs else kept,
        "lam": swept if "lambda" in knobs else kept,
        "kl_coef": kl_swept if "kl" in knobs else f"a fixed coefficient ({kept})",
        "adaptive_kl": adaptive_swept if "kl" in knobs else f"a fixed coefficient ({kept})",
    }


def inherited_knobs(settings_from: Mapping[str, Any]) -> list[str]:
    """What the earlier sweep a study took its settings from swept, for the rows it took (a study's
    ``settings_from``): stored there as ``knobs``, else read from that study's file (a path from the repository
    root); [] when neither is there."""
    if "knobs" in settings_from:
        return list(settings_from["knobs"])
    path = ROOT / settings_from.get("study", "")
    if not path.is_file():
        return []
    table = json.loads(path.read_text()).get("sweep", {})
    rows = {row for row in settings_from.get("rows", {}).values() if row}
    return sorted({k for row in rows for k in table.get(row, {}).get("knobs", [])})


def paper_comparison(cfg: PPOConfig, paper_yaml: Path = ROOT / "configs" / "slf5k" / "ppo.yaml",
                     knobs: Sequence[str] = ("lambda", "lr", "kl"), inherited: bool = False) -> list[dict[str, Any]]:
    """The study's PPO values next to the paper's (SLF5K, Table 10) for every field of `PAPER_FIELDS`; the reasons
    for the swept fields say whether the study swept them (``knobs``) or kept the preset's value."""
    paper = yaml.safe_load(paper_yaml.read_text())
    reasons = paper_reasons(knobs, inherited)
    rows = []
    for name, why in PAPER_FIELDS.items():
        if name.startswith("kl_horizon") and not cfg.adaptive_kl:
            continue  # a fixed coefficient has no controller: its horizon is no setting of the study
        ours, theirs = getattr(cfg, name), paper.get(name, getattr(PPOConfig, name, None))
        if name == "value_learning_rate" and ours is None:
            ours = cfg.learning_rate
        if name == "lora_r" and not cfg.use_lora:
            ours = None
        same = ours == theirs or (isinstance(ours, float) and isinstance(theirs, float) and math.isclose(ours, theirs))
        rows.append({"field": name, "study": ours, "paper": theirs, "same": same,
                     "why": "" if same else why.format(**reasons)})
    return rows


def plot(summary: Mapping[str, Any], png: Path) -> None:

    arms = sorted({r["arm"] for r in summary.values()})
    fig, axes = plt.subplots(1, len(arms), figsize=(6 * len(arms), 4), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        for key, r in summary.items():
            if not compared_in(arm, r["arm"], r["method"]):
                continue
            curves = list(r["curves"].values())
            its = [p["iteration"] for p in curves[0]]
            stats = [mean_ci95([c[i]["test"] for c in curves]) for i in range(len(its))]
            mean = [m for m, _ in stats]
            half = [0.0 if h != h else h for _, h in stats]
            ax.plot(its, mean, label=method_label(r["method"]))
            ax.fill_between(its, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], alpha=0.2)
        ax.set_title(f"{arm} feedback")
        ax.set_xlabel("PPO iteration")
        ax.set_ylabel("test fact score")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# Paired statistics, grid edges, and the report over several task instances
# --------------------------------------------------------------------------------------------------


TIE = 1e-9  # a paired difference this small is float noise between equal scores: a tie, neither ahead nor behind


def count_ahead(diffs: Sequence[float]) -> int:
    """How many paired differences are above `TIE` (ahead)."""
    return sum(d > TIE for d in diffs)


def sign_test(diffs: Sequence[float]) -> float:
    """Exact two-sided sign test of ``diffs`` (paired differences; zeros dropped): the binomial probability, under
    a median difference of 0, of a split at least as uneven as the observed one. nan without non-zero differences."""
    nonzero = [d for d in diffs if abs(d) > TIE]
    if not nonzero:
        return float("nan")
    return float(binomtest(count_ahead(nonzero), len(nonzero), 0.5).pvalue)


def paired(a: Mapping[Any, float], b: Mapping[Any, float]) -> dict[str, Any]:
    """Paired comparison of two methods' per-seed scores (the seeds both have): the differences a - b, how many
    are > 0, their mean with its 95 % t-interval as (low, high), and the exact sign test's p-value."""
    seeds = [s for s in a if s in b]
    diffs = [a[s] - b[s] for s in seeds]
    m, h = mean_ci95(diffs)
    return {"n": len(diffs), "diffs": diffs, "ahead": count_ahead(diffs), "mean": m,
            "interval": (m - h, m + h) if h == h else (float("nan"), float("nan")), "sign_p": sign_test(diffs)}


def paired_words(p: Mapping[str, Any]) -> str:
    """'+0.031 (95 % interval [-0.012, +0.074]; ahead on 4 of 5; exact sign test p = 0.375)'."""
    lo, hi = p["interval"]
    interval = f"95 % interval [{lo:+.3f}, {hi:+.3f}]" if lo == lo else "no interval from one pair"
    sign = "" if p["sign_p"] != p["sign_p"] else f"; exact two-sided sign test p = {p['sign_p']:.3g}"
    return f"{p['mean']:+.3f} ({interval}; ahead on {p['ahead']} of {p['n']}{sign})"


def best_scalar(summary: Mapping[str, Any], arm: str) -> str | None:
    """The scalar baseline (`SCALAR_METHODS`, variants included) with the highest mean final test score among those
    that are baselines of ``arm`` (`compared_in`)."""
    keys = [k for k, r in summary.items() if r["method"].partition("+")[0] in SCALAR_METHODS
            and compared_in(arm, r["arm"], r["method"])]
    return max(keys, key=lambda k: summary[k]["final_mean_ci"][0], default=None)


def grid_position(tried: Sequence[float], chosen: float) -> str:
    """"interior", "lowest" or "highest" of the tried values ("only" when a single value was tried)."""
    if len(set(tried)) < 2:
        return "only"
    return "lowest" if chosen == min(tried) else "highest" if chosen == max(tried) else "interior"


def sweep_edges(row: Mapping[str, Any]) -> dict[str, str]:
    """Where a sweep row's chosen values sit among those tried (`grid_position` per knob): the row's stored ``edges``,
    or, for a row stored before they were (no ``edges``), derived from its tried settings: lambda over every setting
    tried, the learning rate over those of the coordinate search's lr stage (the chosen lambda, the fixed KL
    coefficient of the base setting)."""
    if "edges" in row:
        return dict(row["edges"])
    chosen, tried = row["chosen"], [t["setting"] for t in row.get("tried", [])]
    if not tried:
        return {}
    knobs = row.get("knobs", ["lambda", "lr"])
    lr_stage = {s["lr"] for s in tried if s["lam"] == chosen["lam"] and s["kl"] == "fixed" and s.get("kl_coef") is None}
    return {**({"lambda": grid_position(sorted({s["lam"] for s in tried}), chosen["lam"])} if "lambda" in knobs else {}),
            **({"lr": grid_position(sorted(lr_stage), chosen["lr"])} if "lr" in knobs and lr_stage else {})}


def edge_lines(sweep_table: Mapping[str, Any]) -> list[str]:
    """One sentence per (arm, method) whose chosen value of a swept knob sits at an edge of the values tried."""
    lines = []
    for key, row in sweep_table.items():
        edges = {k: v for k, v in sweep_edges(row).items() if v in ("lowest", "highest")}
        if edges:
            at_range_edge = row.get("chosen", {}).get("lam") in (0.0, 1.0)  # else a lambda beyond it could be tried
            why = {"lambda": " (lambda's range is [0, 1]: its edges cannot be passed)"} if at_range_edge else {}
            lines.append(f"{key}: the chosen " + ", ".join(f"{k} is the {v} value tried{why.get(k, '')}"
                                                          for k, v in edges.items())
                         + ", so that choice sits at a grid edge.")
    return lines


def instance_comparison(study: Mapping[str, Any], arm: str, method: str = "text2grad",
                        against: str | None = None) -> dict[str, Any] | None:
    """One task instance: Text2Grad against a baseline at the end of training (``against``: a method of the arm,
    e.g. "scalar_sum", the information-matched baseline; None: the best scalar baseline), the goal's three conditions
    (ahead on >= 80 % of seeds; final within 0.02 of its own best validation point, i.e. no late decline; final KL no
    larger than the baseline's), and the start policy. None when either side has no finished runs."""
    summ = study.get("final", {})
    t2g = summ.get(f"{arm}/{method}")
    base_key = best_scalar(summ, arm) if against is None else f"{arm}/{against}"
    if t2g is None or base_key not in summ:
        return None
    base = summ[base_key]
    pair = paired(t2g["final"], base["final"])
    decline = late_declines(t2g.get("val_curves", {}))
    sft = study["sft"].get("test", {})
    return {
        "baseline": base_key, "pair": pair, "t2g": t2g["final_mean_ci"], "base": base["final_mean_ci"],
        "kl": (t2g["kl_end"][0], base["kl_end"][0]), "sft": sft.get("fact_score", math.nan), "sft_false": sft.get("n_false", math.nan),
        "late_decline": decline, **goal_conditions(pair, decline, (t2g["kl_end"][0], base["kl_end"][0])),
        "base_above_start": base["final_mean_ci"][0] > sft.get("fact_score", float("nan")),
    }


def pool_pairs(pairs: Mapping[Any, Mapping[str, Any]]) -> dict[str, Any]:
    """The per-instance paired comparisons (`paired`) pooled: every instance's seed differences as one sample."""
    return paired({(ts, i): d for ts, p in pairs.items() for i, d in enumerate(p["diffs"])},
                  {(ts, i): 0.0 for ts, p in pairs.items() for i in range(p["n"])})


def pooled_lines(studies: Mapping[Any, Mapping[str, Any]], arm: str, method: str = "text2grad",
                 against: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """Per instance and pooled sentences for ``method`` (Text2Grad or one of its variants) against the best scalar
    baseline of ``arm`` (``against`` None) or the named baseline (`instance_comparison`), and the numbers they were
    generated from."""
    per = {ts: c for ts, st in studies.items() if (c := instance_comparison(st, arm, method, against)) is not None}
    if not per:
        return [], {}
    name, who = _comparison_names(method, against)
    lines = [f"{name} against {who}:"] if "+" in method or against is not None else []
    for ts, c in per.items():
        worst = largest_fall(c["late_decline"])
        lines.append(
            f"Task instance {ts} (SFT start {c['sft']:.3f}, {c['sft_false']:.2f} false facts per summary), {arm} "
            f"feedback: {name} ends at {_pm(c['t2g'])}, {who} ({method_label(c['baseline'].split('/')[1])}) "
            f"at {_pm(c['base'])}; paired difference {paired_words(c['pair'])}. Final KL {c['kl'][0]:.2f} vs "
            f"{c['kl'][1]:.2f} nats; {name}'s largest fall from its best validation point to its last is {worst}. "
            f"Goal {goal_verdict(c)} ({goal_checklist(c, c['pair']['n'])}"
            + ")." + ("" if c["base_above_start"] else
                      f" {who[0].upper() + who[1:]} ends no better than the start policy"
                      + (": no scalar baseline learned here." if against is None else ".")))
    signs = {ts: (c["pair"]["mean"] > 0) - (c["pair"]["mean"] < 0) for ts, c in per.items()}
    ahead = [ts for ts, v in signs.items() if v > 0]
    behind = [ts for ts, v in signs.items() if v < 0]
    if ahead and behind:
        lines.append(f"The instances disagree: {name} is ahead on average on instance(s) {', '.join(map(str, ahead))} "
                     f"and behind on {', '.join(map(str, behind))}, so the conclusion depends on the task instance.")
    elif len(per) > 1:
        lines.append(f"The {len(per)} instances agree in direction: {name} is "
                     f"{'ahead' if ahead else 'behind' if behind else 'level'} on average on every one.")
    goal = [ts for ts, c in per.items() if goal_met(c)]
    if len(per) > 1 and 0 < len(goal) < len(per):
        lines.append(f"The goal is met on instance(s) {', '.join(map(str, goal))} only.")
    pooled = pool_pairs({ts: c["pair"] for ts, c in per.items()})
    if len(per) > 1:
        each = "its instance's best scalar baseline" if against is None else f"{who} on its instance"
        lines.append(f"Pooled over the {len(per)} instances ({pooled['n']} seed pairs, each against {each}): "
                     f"{paired_words(pooled)}.")
    return lines, {"instances": per, "pooled": pooled}


def matched_baseline(method: str) -> str:
    """The information-matched baseline of a Text2Grad method: scalar_sum (the same critic output, its token rewards
    summed at the last token), with the same defence for a defended Text2Grad ("text2grad+refresh" ->
    "scalar_sum+refresh"), so that both got the same annotations and only the reward's placement differs."""
    variant = method.partition("+")[2]
    return "scalar_sum" + (f"+{variant}" if variant else "")


def matched_comparisons(study: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every Text2Grad method of a one-instance study against its information-matched baseline (`matched_baseline`),
    keyed "arm/method": what the results tables' headline reads. A pair with either side unfinished is left out."""
    out = {}
    for key, row in study.get("final", {}).items():
        if row["method"].partition("+")[0] == "text2grad":
            c = instance_comparison(study, row["arm"], row["method"], matched_baseline(row["method"]))
            if c is not None:
                out[key] = c
    return out


def matched_on_validation(study: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Plain Text2Grad of a one-instance study against the information-matched baseline, each at the KL setting its
    own validation score picks (`kl_on_validation`), keyed "arm/text2grad", with the score's split
    (`score_sources`) and the best scalar baseline at its own pick (``best``: its key and mean final score). The
    headline reads it in place of `matched_comparisons` where the study ran KL frontier points for both sides, as it
    does for a study over several instances. Empty without frontier points."""
    out = {}
    for arm in ARMS:
        c = kl_on_validation(study, arm, "text2grad", "scalar_sum")
        if c is None:
            continue
        best = kl_on_validation(study, arm, "text2grad")
        c["best"] = None if best is None else (best["baseline"], best["base_point"]["final_mean_ci"][0])
        out[f"{arm}/text2grad"] = c
    return out


def kl_setting_label(setting: Mapping[str, Any], default_coef: float) -> str:
    """"adaptive" or "fixed <coefficient>" (the preset's ``default_coef`` when the setting names none)."""
    if setting["kl"] == "adaptive":
        return "adaptive"
    coef = setting.get("kl_coef")
    return f"fixed {default_coef if coef is None else coef:g}"


def summarize_frontier(results: Mapping[Any, Mapping[str, Any]], default_coef: float) -> dict[str, list[dict[str, Any]]]:
    """Per (arm, method): one point per setting run with the final seeds (the chosen setting's final runs, the
    ``--kl_frontier`` runs at fixed coefficients and the ``--lr_frontier`` runs at other learning rates, labelled
    "fixed 0.1, lr 1e-05"): its label, whether it is the chosen one, and per seed the final test score, the
    end-of-run validation score (`end_score`, what a KL-constrained choice is made on) and the final KL, with their
    means, per seed the fall from its best validation point to its last (``val_fall``), and the mean test recall and
    false facts per summary at the end (``recall_false``). Points are sorted by mean final KL."""
    groups: dict[tuple[str, str, str], dict[int, Mapping[str, Any]]] = {}
    chosen: dict[tuple[str, str, str], bool] = {}
    final_lr = {(spec.arm, spec.method): spec.setting.lr for spec in results if spec.phase == "final"}
    for spec, res in results.items():
        if spec.phase not in ("final", "frontier"):
            continue
        label = kl_setting_label(res["spec"]["setting"], default_coef)
        own_lr = final_lr.get((spec.arm, spec.method), spec.setting.lr)
        if not math.isclose(spec.setting.lr, own_lr, rel_tol=1e-3):
            label += f", lr {spec.setting.lr:.3g}"
        groups.setdefault((spec.arm, spec.method, label), {})[spec.seed] = res
        chosen[(spec.arm, spec.method, label)] = chosen.get((spec.arm, spec.method, label), False) or spec.phase == "final"
    out: dict[str, list[dict[str, Any]]] = {}
    for (arm, method, label), runs in groups.items():
        final = {s: r["final"]["test"]["fact_score"] for s, r in runs.items()}
        val_end = {s: end_score(r["curve"], "val") for s, r in runs.items()}
        kl = {s: r["final"].get("kl") or 0.0 for s, r in runs.items()}
        fall = {s: max(p["val"]["fact_score"] for p in r["curve"]) - r["curve"][-1]["val"]["fact_score"]
                for s, r in runs.items() if r["curve"]}
        out.setdefault(f"{arm}/{method}", []).append({
            "kl_setting": label, "chosen": chosen[(arm, method, label)], "seeds": sorted(runs),
            "lr": next(iter(runs.values()))["spec"]["setting"]["lr"],
            "final": final, "final_mean_ci": mean_ci95(list(final.values())),
            "val_end": val_end, "val_end_mean": statistics.fmean(val_end.values()),
            "kl_final": kl, "kl_end": mean_ci95(list(kl.values())), "val_fall": fall,
            "recall_false": [statistics.fmean(r["final"]["test"].get(k, math.nan) for r in runs.values())
                             for k in ("fact_recall", "n_false")],
        })
    for points in out.values():
        points.sort(key=lambda p: p["kl_end"][0])
    return out


def _comparison_names(method: str, against: str | None) -> tuple[str, str]:
    """("Text2Grad" or "Text2Grad + <variant>", the baseline's description) for the generated sentences."""
    variant = method.partition("+")[2]
    who = ("the best scalar baseline" if against is None else "the information-matched baseline"
           if against == "scalar_sum" else "the information-matched baseline with the same defence"
           if variant and against == f"scalar_sum+{variant}" else "the baseline")
    return "Text2Grad" + (f" + {variant}" if variant else ""), who


def late_declines(val_curves: Mapping[Any, Sequence[Mapping[str, float]]]) -> dict[Any, float]:
    """Per seed, how far the last validation point of a curve (`val_curves`) lies below its best one (>= 0)."""
    return {seed: max(p["val"] for p in curve) - curve[-1]["val"] for seed, curve in val_curves.items()}


def goal_conditions(pair: Mapping[str, Any], fall: Mapping[Any, float],
                    kl: tuple[float, float] | None = None) -> dict[str, bool | None]:
    """The goal's three conditions: ahead on >= 80 % of the seed pairs (`paired`); no seed's last validation point more
    than 0.02 below its best (``fall``, `late_declines`; None when no validation curve was recorded, e.g. in a study
    summarised before they were stored); final KL no larger than the baseline's (``kl`` = (mine, the baseline's) mean
    final KL; None where the comparison holds it by construction)."""
    return {"ahead_goal": pair["n"] > 0 and pair["ahead"] >= math.ceil(GOAL_SHARE * pair["n"]),
            "no_late_decline": all(d <= 0.02 for d in fall.values()) if fall else None,
            "kl_goal": kl is None or kl[0] <= kl[1]}


def largest_fall(fall: Mapping[Any, float]) -> str:
    """The largest of the seeds' falls (`late_declines`) as '0.042', or 'not recorded' when there are none."""
    return f"{max(fall.values()):.3f}" if fall else "not recorded"


_CONDITIONS = ("ahead_goal", "no_late_decline", "kl_goal")


def goal_met(c: Mapping[str, Any]) -> bool:
    """All three of `goal_conditions` hold (an unrecorded one does not)."""
    return all(c[k] is True for k in _CONDITIONS)


def goal_verdict(c: Mapping[str, Any]) -> str:
    """'met', 'not met' (a condition fails) or 'cannot be judged' (none fails, one was not recorded)."""
    return ("met" if goal_met(c) else "not met" if any(c[k] is False for k in _CONDITIONS)
            else "cannot be judged")


def goal_checklist(c: Mapping[str, Any], n: int) -> str:
    """'ahead on >= 4 of 5 seeds: yes, no late decline (<= 0.02): no, KL no larger: yes' for `goal_conditions` ``c``
    over ``n`` seed pairs; a condition that was not recorded reads 'not recorded'."""
    return ", ".join(f"{label}: {'not recorded' if ok is None else 'yes' if ok else 'no'}" for label, ok in (
        (f"ahead on >= {math.ceil(GOAL_SHARE * n)} of {n} seeds", c["ahead_goal"]),
        ("no late decline (<= 0.02)", c["no_late_decline"]), ("KL no larger", c["kl_goal"])))


# The baselines Text2Grad is held to the KL of: the best scalar baseline (None) and the information-matched one.
KL_MATCHED_AGAINST = (None, "scalar_sum")


def kl_baselines(method: str) -> tuple[str | None, ...]:
    """The baselines ``method`` is compared with at matched or validation-picked KL: `KL_MATCHED_AGAINST`, and for a
    defended Text2Grad ("text2grad+refresh") also the information-matched baseline with the same defence
    ("scalar_sum+refresh"), which gets the same extra annotations, so that what is left is the reward's placement."""
    variant = method.partition("+")[2]
    return KL_MATCHED_AGAINST + ((f"scalar_sum+{variant}",) if variant else ())


# A baseline that a looser KL penalty moves less than this much further from the start policy (mean final KL, nats)
# was not held there by the penalty.
PENALTY_BINDS_NATS = 0.05

# A mean final test score at least this far above the start policy's improves on it: 0.01 is one false fact fewer in
# every 20th test summary. Held to a small KL, Text2Grad can be "ahead" of a baseline only because the baseline
# fell below the start while Text2Grad stayed there; the reports say so.
START_GAIN = 0.01


def start_test_score(study: Mapping[str, Any]) -> float:
    """The start (SFT) policy's test fact score, NaN where the study did not record it."""
    return study.get("sft", {}).get("test", {}).get("fact_score", math.nan)


def improves_on_start(final_mean: float, sft: float) -> bool | None:
    """Whether a mean final score is at least `START_GAIN` above the start policy's ``sft`` (None when the start
    policy's test score was not recorded)."""
    return None if math.isnan(sft) else final_mean - sft >= START_GAIN


def fixed_coefficient(label: str) -> float | None:
    """0.05 for the setting label "fixed 0.05" or "fixed 0.05, lr 1e-05" (`summarize_frontier`); None for
    "adaptive"."""
    kind, _, rest = label.partition(" ")
    return float(rest.partition(",")[0]) if kind == "fixed" else None


def looser_penalty(points: Sequence[Mapping[str, Any]],
                   chosen: Mapping[str, Any] | None = None) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(``chosen``, the point with the smallest fixed coefficient below its, at the same learning rate) among one
    method's frontier ``points`` (`summarize_frontier`); ``chosen`` defaults to the point the sweep chose. None when
    that setting is adaptive or nothing looser ran."""
    chosen = chosen or next((p for p in points if p.get("chosen")), None)
    coef = fixed_coefficient(chosen["kl_setting"]) if chosen else None
    looser = [p for p in points if coef is not None and p.get("lr") == chosen.get("lr")
              and (k := fixed_coefficient(p["kl_setting"])) is not None and k < coef]
    return (chosen, min(looser, key=lambda p: fixed_coefficient(p["kl_setting"]))) if looser else None


def looser_penalty_sentence(chosen: Mapping[str, Any], loose: Mapping[str, Any]) -> str:
    """What a looser KL penalty did to a baseline: how much further it moved from the start policy than at the
    setting Text2Grad is held at (``chosen``), and its score."""
    moved = loose["kl_end"][0] - chosen["kl_end"][0]
    return (f"Given a looser penalty ({loose['kl_setting']}, {len(loose['seeds'])} seeds), the baseline ends at "
            f"{loose['kl_end'][0]:.2f} nats with {_pm(loose['final_mean_ci'])} (at {chosen['kl_setting']}, the setting "
            f"it is held at: {chosen['kl_end'][0]:.2f} nats, {_pm(chosen['final_mean_ci'])}): "
            + ("the penalty is not what holds it near the start policy." if moved < PENALTY_BINDS_NATS else
               f"it moves {moved:.2f} nats further from the start policy, and its score changes by "
               f"{loose['final_mean_ci'][0] - chosen['final_mean_ci'][0]:+.3f}."))


def larger_step(points: Sequence[Mapping[str, Any]],
                chosen: Mapping[str, Any] | None = None) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(``chosen``, the point at the largest learning rate above its at its KL setting, `--lr_frontier`) among one
    method's frontier ``points`` (a point with both knobs moved, `--frontier_points`, is not the larger step alone);
    ``chosen`` defaults to the point the sweep chose. None when no larger learning rate ran (or a study stored its
    points without)."""
    chosen = chosen or next((p for p in points if p.get("chosen")), None)
    if chosen is None or "lr" not in chosen:
        return None
    coef = fixed_coefficient(chosen["kl_setting"])
    larger = [p for p in points if p.get("lr", 0.0) > chosen["lr"] * (1 + 1e-3)
              and fixed_coefficient(p["kl_setting"]) == coef]
    return (chosen, max(larger, key=lambda p: p["lr"])) if larger else None


def larger_step_sentence(chosen: Mapping[str, Any], fast: Mapping[str, Any]) -> str:
    """What a larger learning rate did to a baseline: how much further it moved from the start policy, and its
    score, against the chosen setting's."""
    return (f"Given a larger learning rate ({fast['lr']:.3g} instead of {chosen['lr']:.3g}, {len(fast['seeds'])} seeds), "
            f"the baseline ends at {fast['kl_end'][0]:.2f} nats with {_pm(fast['final_mean_ci'])}: it moves "
            f"{fast['kl_end'][0] - chosen['kl_end'][0]:.2f} nats further from the start policy, and its score changes "
            f"by {fast['final_mean_ci'][0] - chosen['final_mean_ci'][0]:+.3f}.")


def kl_matched(study: Mapping[str, Any], arm: str, method: str = "text2grad",
               against: str | None = None) -> dict[str, Any] | None:
    """``method`` (Text2Grad or a variant) held to a baseline's KL: among its KL settings whose mean final KL is no
    larger than the baseline's, the one with the best end-of-run validation score among those run on the most seeds
    (`validation_pick`), compared seed by seed with the baseline on test. The baseline sits at the KL setting its
    own validation score picks among its frontier points, as a user tuning it would (at the sweep's chosen setting
    when it ran no other). It is ``against`` (a method of ``arm``, e.g. the information-matched scalar_sum) or, by
    default, the best scalar baseline. None without frontier points or that baseline; ``point`` None when no setting
    stays within the baseline's KL (``lowest`` then says how close the nearest came)."""
    frontier = study.get("kl_frontier", {})
    points = frontier.get(f"{arm}/{method}", [])
    summ = study.get("final", {})
    base_key = best_scalar(summ, arm) if against is None else f"{arm}/{against}"
    if len(points) < 2 or base_key not in summ:  # one point is the chosen setting alone: nothing to choose from
        return None
    base_points = frontier.get(base_key, [])
    base_pick = validation_pick(base_points)
    base = base_pick or summ[base_key]
    budget = base["kl_end"][0]
    pick = validation_pick([p for p in points if p["kl_end"][0] <= budget])
    pair = paired(pick["final"], base["final"]) if pick else None
    fall = pick.get("val_fall", {}) if pick else {}
    return {"baseline": base_key, "budget": budget, "base": base["final_mean_ci"], "tried": len(points),
            "point": pick, "lowest": min(points, key=lambda p: p["kl_end"][0]), "pair": pair,
            "base_setting": base.get("kl_setting"),
            "base_looser": looser_penalty(base_points, base_pick),
            "base_faster": larger_step(base_points, base_pick),
            "sft": (sft := start_test_score(study)),
            "improves_on_start": improves_on_start(pick["final_mean_ci"][0], sft) if pick else None,
            # its KL condition holds by construction
            **(goal_conditions(pair, fall) if pair else {"ahead_goal": False, "no_late_decline": False, "kl_goal": True})}


def kl_matched_lines(studies: Mapping[Any, Mapping[str, Any]], arm: str, method: str = "text2grad",
                     against: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """Per instance and pooled sentences for ``method`` held to a baseline's KL (`kl_matched`): the best scalar
    baseline's by default, else ``against``'s."""
    per = {ts: c for ts, st in studies.items() if (c := kl_matched(st, arm, method, against)) is not None}
    if not per:
        return [], {}
    name, who = _comparison_names(method, against)
    lines = [f"{name} held to the KL of {who}" + ("" if against is None else f" ({method_label(against)})")
             + " (the baseline at the KL setting its own validation score picks; " + name + "'s chosen on validation "
             "among those whose mean final KL is no larger than the baseline's there):"]
    for ts, c in per.items():
        base = method_label(c["baseline"].split("/")[1]) + (f", KL {c['base_setting']}" if c.get("base_setting") else "")
        p = c["point"]
        looser = (f" {looser_penalty_sentence(*c['base_looser'])}" if c.get("base_looser") else "") + (
            f" {larger_step_sentence(*c['base_faster'])}" if c.get("base_faster") else "")
        if p is None:
            low = c["lowest"]
            lines.append(f"Task instance {ts}: none of the {c['tried']} KL settings tried stays within the baseline's "
                         f"({base}) {c['budget']:.2f} nats; the lowest, {low['kl_setting']}, ends at "
                         f"{low['kl_end'][0]:.2f} nats with {_pm(low['final_mean_ci'])}."
                         + (f" {_unmoved_baseline_sentence(c)}" if _baseline_unmoved(c) else "") + looser)
            continue
        worst = largest_fall(p.get("val_fall", {}))
        lines.append(f"Task instance {ts}: KL {p['kl_setting']} ends at {_pm(p['final_mean_ci'])} with KL "
                     f"{p['kl_end'][0]:.2f} nats, the baseline ({base}) at {_pm(c['base'])} with {c['budget']:.2f}, "
                     f"the start policy at {c['sft']:.3f}; paired difference {paired_words(c['pair'])}. Largest fall from its best validation point to "
                     f"its last: {worst}. Goal {goal_verdict(c)} ("
                     f"{goal_checklist(c, c['pair']['n'])})." + _no_gain_sentence(c, name) + looser)
    matched = {ts: c for ts, c in per.items() if c["pair"] is not None}
    pooled = pool_pairs({ts: c["pair"] for ts, c in matched.items()})
    if len(matched) > 1:
        goal = [str(ts) for ts, c in matched.items() if goal_met(c)]
        flat = [str(ts) for ts, c in matched.items() if goal_met(c) and c["improves_on_start"] is False]
        lines.append(f"Pooled over the {len(matched)} instances with a setting within the baseline's KL "
                     f"({pooled['n']} seed pairs): {paired_words(pooled)}. "
                     + (f"The goal is met on instance(s) {', '.join(goal)} of {len(per)}." if goal
                        else f"The goal is met on none of the {len(per)} instances.")
                     + (f" On instance(s) {', '.join(flat)} it is met without {name} improving on the start policy "
                        f"by {START_GAIN} or more." if flat else ""))
    unmoved = [str(ts) for ts, c in per.items() if c["pair"] is None and _baseline_unmoved(c)]
    missing = [str(ts) for ts, c in per.items() if c["pair"] is None and not _baseline_unmoved(c)]
    if missing:
        lines.append(f"On instance(s) {', '.join(missing)} no {name} setting tried stays within the baseline's KL, "
                     f"so there the comparison at matched KL is still open.")
    if unmoved:
        lines.append(f"On instance(s) {', '.join(unmoved)} the baseline's policy has not measurably left its start "
                     f"(mean final KL at or below 0), so there the KL condition leaves {name} no room to learn: it "
                     f"holds only for a policy that stays where it started.")
    return lines, {"instances": per, "pooled": pooled if matched else None}


def _baseline_unmoved(c: Mapping[str, Any]) -> bool:
    """Whether the baseline of a KL-matched comparison (`kl_matched`) ends at a mean final KL at or below 0. Its KL
    is the mean over the last rollouts of log pi(y) - log pi_start(y), whose expectation is 0 for the start policy
    itself and positive for any other, so such a budget is met, in expectation, by standing still only."""
    return c["budget"] <= 0


def _unmoved_baseline_sentence(c: Mapping[str, Any]) -> str:
    """Where `_baseline_unmoved`: what the baseline's score did, so that a KL budget nothing can meet reads as
    the baseline not learning, not as a setting left untried."""
    score = "" if math.isnan(c["sft"]) else (f" (it ends {c['base'][0] - c['sft']:+.3f} from the start policy's "
                                             f"{c['sft']:.3f})")
    return (f"That is at or below 0, the start policy's own value: the baseline's policy has not measurably "
            f"moved{score}, so only a setting that does not learn could stay within it.")


def _no_gain_sentence(c: Mapping[str, Any], name: str) -> str:
    """Where the goal at matched KL (`kl_matched`) is met but ``name`` ends less than `START_GAIN` above the start
    policy: how far each side ended from the start policy's score, so that a "win" by standing still while the
    baseline fell behind reads as one. Empty otherwise."""
    if not goal_met(c) or c["improves_on_start"] is not False:
        return ""
    return (f" {name} ends {c['point']['final_mean_ci'][0] - c['sft']:+.3f} from the start policy's score, the "
            f"baseline {c['base'][0] - c['sft']:+.3f}: the goal is met without {name} improving on the start policy "
            f"by {START_GAIN} or more.")


def pick_edges(pick: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where a validation pick sits at the edge of what was tried among ``points`` (`summarize_frontier`): "the
    largest learning rate tried" / "the smallest ...", "the weakest fixed KL penalty tried" / "the strongest ...".
    Empty when every knob the points vary is interior: a pick at an edge says the grid has not bracketed the best
    setting, so a step further out could still do better on validation. A pick at a KL coefficient of 0 (no penalty)
    is at the end of that axis, not of the grid: there is no weaker penalty to try."""
    edges = []
    for values, mine, axis_end, low, high in (
            (sorted({p["lr"] for p in points if p.get("lr") is not None}), pick.get("lr"), None,
             SMALLEST_LR_EDGE, "the largest learning rate tried"),
            (sorted({c for p in points if (c := fixed_coefficient(p["kl_setting"])) is not None}),
             fixed_coefficient(pick["kl_setting"]), 0.0, "the weakest fixed KL penalty tried",
             "the strongest fixed KL penalty tried")):
        if len(values) > 1 and mine is not None:
            edges += [low] if mine == values[0] != axis_end else [high] if mine == values[-1] else []
    return edges


def validation_pick(points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The KL setting with the best mean end-of-run validation score among those run on the most seeds (a setting
    run on fewer seeds is not compared on a different sample)."""
    most = max((len(p["seeds"]) for p in points), default=0)
    return max((p for p in points if len(p["seeds"]) == most), key=lambda p: p["val_end_mean"], default=None)


def kl_on_validation(study: Mapping[str, Any], arm: str, method: str = "text2grad",
                     against: str | None = None) -> dict[str, Any] | None:
    """``method`` and its baseline, each at the KL setting its own validation score picks on this instance
    (`validation_pick` over its frontier points: the chosen setting and the ``--kl_frontier`` ones), compared seed by
    seed on test, with the goal's three conditions (ahead on >= 80 % of seeds; no fall of more than 0.02 from its
    best validation point to its last; final KL no larger than the baseline's). The baseline is ``against`` or the
    best scalar baseline. None without frontier points for ``method`` (one point is no choice) or the baseline."""
    frontier, summ = study.get("kl_frontier", {}), study.get("final", {})
    points = frontier.get(f"{arm}/{method}", [])
    base_key = best_scalar(summ, arm) if against is None else f"{arm}/{against}"
    if len(points) < 2 or base_key not in summ:
        return None
    base_points = frontier.get(base_key, [])
    pick, base = validation_pick(points), validation_pick(base_points)
    if base is None:  # a study summarised before frontier points existed
        return None
    pair = paired(pick["final"], base["final"])
    fall = pick.get("val_fall", {})
    sft = study.get("sft", {}).get("test", {})
    return {"baseline": base_key, "point": pick, "base_point": base, "pair": pair, "tried": len(points),
            # where the score difference comes from (None for a study summarised before recall was recorded)
            "score_sources": score_sources(pick, base, (sft.get("fact_recall", math.nan),
                                                        sft.get("n_false", math.nan))),
            "edges": pick_edges(pick, points), "base_edges": pick_edges(base, base_points),
            "runner_up": runner_up(pick, points), "base_runner_up": runner_up(base, base_points),
            "sft": start_test_score(study),
            **goal_conditions(pair, fall, (pick["kl_end"][0], base["kl_end"][0]))}


def score_sources(point: Mapping[str, Any], base: Mapping[str, Any],
                  start: Sequence[float]) -> dict[str, float] | None:
    """Where the difference in mean final test score between two frontier points (`summarize_frontier`) comes from.
    The fact score is (C - W) / K = recall - false facts / K, so the difference splits exactly into the recall
    difference and the false-facts term: ``recall`` + ``false_facts`` = ``score``. ``start`` is the start policy's
    (recall, false facts per summary). None when a point's recall or false facts were not recorded."""
    (r1, f1), (r2, f2) = point.get("recall_false", (math.nan,) * 2), base.get("recall_false", (math.nan,) * 2)
    if any(x != x for x in (r1, f1, r2, f2)):
        return None
    return {"score": (r1 - f1 / N_FACTS) - (r2 - f2 / N_FACTS), "recall": r1 - r2, "false_facts": (f2 - f1) / N_FACTS,
            "recall_own": r1, "false_own": f1, "recall_base": r2, "false_base": f2,
            "recall_start": start[0], "false_start": start[1]}


def where_words(name: str, w: Mapping[str, float]) -> str:
    """The sentence for `score_sources`: what each pick's summaries state, how the score difference splits, whether
    a lead comes from false facts alone, and whether the method's pick states fewer correct facts than the start
    policy (a lead won by saying less)."""
    text = (f"what the picks' test summaries say: {name} states {w['recall_own']:.3f} of the {N_FACTS} facts correctly "
            f"with {w['false_own']:.2f} false facts each, the baseline {w['recall_base']:.3f} with "
            f"{w['false_base']:.2f}, the start policy {w['recall_start']:.3f} with {w['false_start']:.2f}. Of the "
            f"difference in mean score ({w['score']:+.3f}), recall gives {w['recall']:+.3f} and false facts "
            f"{w['false_facts']:+.3f}.")
    if w["score"] > 0 and w["recall"] < 0:
        text += f" {name} is ahead only through fewer false facts: it states fewer correct facts than the baseline."
    if w["recall_own"] < w["recall_start"]:
        text += f" {name}'s pick states fewer correct facts than the start policy."
    return text


def runner_up(pick: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The setting `validation_pick` would choose were ``pick`` not tried: the best end-of-run validation score among
    the other ``points`` run on as many seeds. None when there is no such point."""
    others = [p for p in points if p is not pick and len(p["seeds"]) == len(pick["seeds"])]
    return max(others, key=lambda p: p["val_end_mean"], default=None)


def edge_words(who: str, edges: Sequence[str], pick: Mapping[str, Any] | None = None,
               second: Mapping[str, Any] | None = None, start: float = math.nan) -> str:
    """" X's pick is at the largest learning rate tried: the grid does not bracket it." (empty without edges), and
    with the ``second`` best setting (`runner_up`) how far below ``pick`` it is on validation: a small margin says a
    step past the edge is unlikely to change the choice by much, a large one that the grid should be extended.
    At the smallest learning rate tried, with the start policy's test score ``start``, it also says where that edge
    leads: a learning rate of 0 never moves the policy, so smaller steps tend to the start policy; how far the
    pick's final score and KL already are from it shows how little room that side of the grid has left."""
    if not edges:
        return ""
    text = f" {who[0].upper()}{who[1:]}'s pick is at {' and '.join(edges)}: the grid does not bracket it"
    if pick is None or second is None:
        text += "."
    else:
        text += (f"; the next-best setting tried ({second['kl_setting']}) is "
                 f"{pick['val_end_mean'] - second['val_end_mean']:.3f} below it on validation.")
    if SMALLEST_LR_EDGE in edges and pick is not None and not math.isnan(start):
        text += (f" Smaller steps tend to the start policy (a learning rate of 0 never moves it; {start:.3f} on "
                 f"test): this pick ends {pick['final_mean_ci'][0] - start:+.3f} from it, at KL "
                 f"{pick['kl_end'][0]:.2f} nats.")
    return text


def kl_on_validation_lines(studies: Mapping[Any, Mapping[str, Any]], arm: str, method: str = "text2grad",
                           against: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """Per instance and pooled sentences for `kl_on_validation` (each method at the KL setting its validation score
    picks on that instance) against the best scalar baseline, or ``against``."""
    per = {ts: c for ts, st in studies.items() if (c := kl_on_validation(st, arm, method, against)) is not None}
    if not per:
        return [], {}
    name, who = _comparison_names(method, against)
    lines = [f"{name} against {who}" + ("" if against is None else f" ({method_label(against)})") + ", each at the KL "
             "setting its own end-of-run validation score picks on that instance (among the settings run on the most "
             "seeds):"]
    for ts, c in per.items():
        p, b = c["point"], c["base_point"]
        worst = largest_fall(p.get("val_fall", {}))
        lines.append(
            f"Task instance {ts}: {name} at KL {p['kl_setting']} (of {c['tried']} settings; validation "
            f"{p['val_end_mean']:.3f}) ends at {_pm(p['final_mean_ci'])} with KL {p['kl_end'][0]:.2f} nats; "
            f"{method_label(c['baseline'].split('/')[1])} at KL {b['kl_setting']} at {_pm(b['final_mean_ci'])} with "
            f"{b['kl_end'][0]:.2f}; paired difference {paired_words(c['pair'])}; {name}'s largest fall from its best "
            f"validation point to its last is {worst}. Goal {goal_verdict(c)} ("
            f"{goal_checklist(c, c['pair']['n'])})." + edge_words(name, c["edges"], p, c["runner_up"], c["sft"])
            + edge_words("the baseline", c["base_edges"], b, c["base_runner_up"], c["sft"]))
        if c["score_sources"] is not None:
            lines.append(f"Task instance {ts}, {where_words(name, c['score_sources'])}")
    pooled = pool_pairs({ts: c["pair"] for ts, c in per.items()})
    if len(per) > 1:
        goal = [str(ts) for ts, c in per.items() if goal_met(c)]
        lines.append(f"Pooled over the {len(per)} instances ({pooled['n']} seed pairs): {paired_words(pooled)}. "
                     + (f"The goal is met on instance(s) {', '.join(goal)} of {len(per)}." if goal
                        else f"The goal is met on none of the {len(per)} instances."))
    split = {ts: c["score_sources"] for ts, c in per.items() if c["score_sources"] is not None}
    if len(split) > 1:
        less = [str(ts) for ts, w in split.items() if w["recall"] < 0]
        lines.append(f"Over the {len(split)} instances, recall gives {statistics.fmean(w['recall'] for w in split.values()):+.3f} "
                     f"of the mean score difference and false facts "
                     f"{statistics.fmean(w['false_facts'] for w in split.values()):+.3f}; {name}'s pick states fewer "
                     f"correct facts than the baseline's on " + (f"instance(s) {', '.join(less)}." if less else "none."))
    return lines, {"instances": per, "pooled": pooled}


def frontier_dominance(study: Mapping[str, Any], arm: str, method: str, against: str) -> dict[str, Any] | None:
    """``method`` held to the KL of every point of the baseline's frontier, not only its chosen setting's: at each
    baseline point (its chosen setting, and the ``--kl_frontier`` / ``--lr_frontier`` ones), ``method``'s setting with
    the best end-of-run validation score among those whose mean final KL is no larger (`validation_pick`: of those,
    the ones run on the most seeds), compared seed by seed on test.
    A method that wins only by drifting further loses here wherever the baseline, given the same room, uses it.
    Returns the baseline key, per baseline point (sorted by KL) the ``base_point``, the ``point`` (None when no
    setting stays within) and its ``pair``, ``ahead``: at how many baseline points ``method`` is ahead on average
    at no larger KL, and ``ahead_improving``: at how many of those its own score is also `START_GAIN` or more above
    the start policy's ``sft`` (None when that was not recorded). None when either side has fewer than two points
    (`kl_matched` covers one)."""
    frontier = study.get("kl_frontier", {})
    mine, theirs = frontier.get(f"{arm}/{method}", []), frontier.get(f"{arm}/{against}", [])
    if len(mine) < 2 or len(theirs) < 2:
        return None
    rows = []
    for base in theirs:
        pick = validation_pick([p for p in mine if p["kl_end"][0] <= base["kl_end"][0]])
        rows.append({"base_point": base, "point": pick, "pair": paired(pick["final"], base["final"]) if pick else None})
    ahead = [r for r in rows if r["pair"] is not None and r["pair"]["mean"] > TIE]
    sft = start_test_score(study)
    return {"baseline": f"{arm}/{against}", "rows": rows, "ahead": len(ahead), "sft": sft,
            "ahead_improving": None if math.isnan(sft) else
            sum(bool(improves_on_start(r["point"]["final_mean_ci"][0], sft)) for r in ahead)}


def frontier_dominance_lines(studies: Mapping[Any, Mapping[str, Any]], arm: str, method: str = "text2grad",
                             against: str = "scalar_sum") -> tuple[list[str], dict[str, Any]]:
    """Per instance and pooled sentences for `frontier_dominance`: at each point of the baseline's frontier, the
    setting of ``method`` chosen within its KL and the paired difference; then at how many points it is ahead."""
    per = {ts: c for ts, st in studies.items() if (c := frontier_dominance(st, arm, method, against)) is not None}
    if not per:
        return [], {}
    name, who = _comparison_names(method, against)
    lines = [f"{name} against every point of the KL frontier of {who} ({method_label(against)}), at each its setting "
             "with the best end-of-run validation score among those ending at no larger mean KL:"]
    for ts, c in per.items():
        parts = []
        for r in c["rows"]:
            b, p = r["base_point"], r["point"]
            at = f"at the baseline's KL {b['kl_setting']} ({b['kl_end'][0]:.2f} nats, {b['final_mean_ci'][0]:.3f}): "
            if p is None:
                parts.append(at + "no setting stays within")
                continue
            lo, hi = r["pair"]["interval"]
            interval = f" [{lo:+.3f}, {hi:+.3f}]" if lo == lo else ""
            parts.append(f"{at}KL {p['kl_setting']} ({p['kl_end'][0]:.2f} nats) {p['final_mean_ci'][0]:.3f}, "
                         f"{r['pair']['mean']:+.3f}{interval}, ahead on {r['pair']['ahead']} of {r['pair']['n']}")
        n = len(c["rows"])
        improving = (f"; at {c['ahead_improving']} of those {c['ahead']} it also improves on the start policy "
                     f"({c['sft']:.3f}) by {START_GAIN} or more" if c["ahead"] and c["ahead_improving"] is not None
                     else "")
        lines.append(f"Task instance {ts}: " + "; ".join(parts) + f". {name} is ahead at no larger KL at {c['ahead']} "
                     f"of the baseline's {n} point{'s' if n != 1 else ''}{improving}.")
    points = sum(len(c["rows"]) for c in per.values())
    ahead = sum(c["ahead"] for c in per.values())
    recorded = all(c["ahead_improving"] is not None for c in per.values())
    ahead_improving = sum(c["ahead_improving"] for c in per.values()) if recorded else None
    if len(per) > 1:  # a count only: one instance's points share its runs, so their seed pairs are not independent
        lines.append(f"Over the {len(per)} instances {name} is ahead at no larger KL at {ahead} of the baseline's "
                     f"{points} frontier points" + (f", improving on its start policy by {START_GAIN} or more at "
                                                    f"{ahead_improving} of those {ahead}" if ahead and recorded else "")
                     + ".")
    return lines, {"instances": per, "ahead": ahead, "points": points, "ahead_improving": ahead_improving}


# the control several splits of the equal-annotation control are measured against
_STEPS_MATCHED = "Text2Grad with a reward model trained as many steps on the base annotations only (Text2Grad + steps_matched)"
# Each defence against the run that differs from it only by the defence, seed by seed at their chosen settings:
# (defended method, control, key in study.json, what the comparison isolates)
DEFENCE_CONTROLS = (
    ("text2grad+refresh", "text2grad+offline_matched", "refresh_vs_offline_matched",
     "its equal-annotation control (Text2Grad + offline_matched)"),
    ("text2grad+ensemble", "text2grad", "ensemble_vs_single",
     "Text2Grad with one reward model trained on the same annotations"),
    ("text2grad+ensemble_refresh", "text2grad+ensemble", "combination_vs_ensemble",
     "Text2Grad with the same ensemble, never refreshed"),
    ("text2grad+ensemble_refresh", "text2grad+refresh", "combination_vs_refresh",
     "Text2Grad with the same refresh of one reward model"),
    # the equal-annotation control split in two: its extra annotations at equal steps, and its extra steps alone
    ("text2grad+offline_matched", "text2grad+steps_matched", "annotations_vs_steps",
     _STEPS_MATCHED),
    ("text2grad+steps_matched", "text2grad", "steps_vs_none",
     "Text2Grad with the base reward model (as many annotations, fewer steps)"),
    # the extra annotations split in two: their number (noisy summaries back in) and their kind at equal number
    ("text2grad+offline_matched", "text2grad+swap_matched", "count_vs_kind",
     "Text2Grad with the same samples in place of as many noisy summaries (Text2Grad + swap_matched)"),
    ("text2grad+swap_matched", "text2grad+steps_matched", "kind_vs_steps",
     _STEPS_MATCHED),
    # and their kind at equal number split again: the start policy's samples there, and the RL prompts they cover
    ("text2grad+swap_matched", "text2grad+prompts_matched", "samples_vs_prompts",
     "Text2Grad with noisy summaries of the same RL posts in place of those samples (Text2Grad + prompts_matched)"),
    ("text2grad+prompts_matched", "text2grad+steps_matched", "prompts_vs_steps",
     _STEPS_MATCHED),
    # the swap against the base recipe whole: what a user switching to it gets (its kind and its extra steps together)
    ("text2grad+swap_matched", "text2grad", "swap_vs_none",
     "Text2Grad with the base reward model (as many annotations, fewer steps, none of them on the RL prompts)"),
    # which posts the base annotations cover, at equal count and steps
    ("text2grad+rl_covered", "text2grad", "rl_covered_vs_none",
     "Text2Grad with the base reward model (as many annotations and steps, no RL post among them)"),
    # not equal information: the refresh adds annotations of its own (offline_matched is the control for that)
    ("text2grad+refresh", "text2grad", "refresh_vs_none",
     "Text2Grad with the same reward model, never refreshed (fewer annotations in all)"),
)


def control_lines(studies: Mapping[Any, Mapping[str, Any]], arm: str, defended: str, control: str,
                  what: str) -> tuple[list[str], dict[str, Any]]:
    """``defended`` against ``control`` at the end of training, seed by seed at their chosen settings, per instance
    and pooled (e.g. Text2Grad + refresh against Text2Grad + offline_matched, as many more annotations and
    reward-model steps offline: what annotating the policy's own current samples adds beyond the count)."""
    pairs, kls, rewards = {}, {}, {}
    for ts, st in studies.items():
        summ = st.get("final", {})
        a, b = summ.get(f"{arm}/{defended}"), summ.get(f"{arm}/{control}")
        if a and b and (pair := paired(a["final"], b["final"]))["n"]:
            pairs[ts] = pair
            if "kl_end" in a and "kl_end" in b:
                kls[ts] = (a["kl_end"][0], b["kl_end"][0])
            signals = [r.get("reward_signal", {}) for r in (a, b)]
            if all(set(SIGNAL_METRICS) <= set(x) for x in signals):
                rewards[ts] = tuple((x["reward/score_mean"], x["tokens/labelled_share"]) for x in signals)
    if not pairs:
        return [], {}
    name = "Text2Grad + " + defended.partition("+")[2]
    lines = [f"{name} against {what}, at the end:"]
    for ts, p in pairs.items():
        line = f"Task instance {ts}: paired difference {paired_words(p)}"
        if ts in kls:
            line += f"; final KL {kls[ts][0]:.2f} vs {kls[ts][1]:.2f} nats"
        if ts in rewards:
            (mine, mine_share), (theirs, their_share) = rewards[ts]
            line += (f"; the critic's token rewards summed per response, mean over training, {mine:+.2f} vs "
                     f"{theirs:+.2f} (share of tokens labelled +-1: {mine_share:.2f} vs {their_share:.2f})")
        lines.append(line + ".")
    pooled = pool_pairs(pairs)
    if len(pairs) > 1:
        lines.append(f"Pooled over the {len(pairs)} instances ({pooled['n']} seed pairs): {paired_words(pooled)}.")
    if len(kls) > 1:
        lower = [str(ts) for ts, (mine, theirs) in kls.items() if mine < theirs]
        higher = [str(ts) for ts, (mine, theirs) in kls.items() if mine > theirs]
        if lower and higher:
            lines.append(f"{name}'s final KL is lower than the control's on instance(s) {', '.join(lower)} and higher "
                         f"on {', '.join(higher)}: it does not hold the policy nearer the start on every instance.")
        elif lower or higher:
            lines.append(f"{name}'s final KL is {'lower' if lower else 'higher'} than the control's on "
                         + ("every instance." if len(lower or higher) == len(kls) else
                            f"instance(s) {', '.join(lower or higher)} and equal on the others."))
    flipped = [str(ts) for ts, ((mine, _), (theirs, _)) in rewards.items() if mine < 0 < theirs]
    if flipped:
        lines.append(f"On instance(s) {', '.join(flipped)} the average response's token rewards sum below zero under "
                     f"{name} and above zero under the control: there the defence turns the critic's verdict on the "
                     "average response from good to poor.")
    return lines, {"instances": pairs, "pooled": pooled, "kl": kls, "reward_signal": rewards}


def frontier_markdown(study: Mapping[str, Any]) -> list[str]:
    """The table of every method's KL settings (the chosen one marked): final score against final KL."""
    rows = study.get("kl_frontier", {})
    if not any(len(points) > 1 for points in rows.values()):
        return []
    lines = ["Every KL setting run with the final seeds (chosen: the setting the validation sweep picked):", "",
             "| arm | method | KL setting | final | KL at end | validation at end |", "|---|---|---|---:|---:|---:|"]
    for key, points in rows.items():
        arm, method = key.split("/")
        for p in points:
            lines.append(f"| {arm} | {method_label(method)} | {p['kl_setting']}{' (chosen)' if p['chosen'] else ''} | "
                         f"{_pm(p['final_mean_ci'])} | {_pm(p['kl_end'])} | {p['val_end_mean']:.3f} |")
    return lines


def frontier_plot(studies: Mapping[Any, Mapping[str, Any]], png: Path) -> None:
    """Final test score against final KL (nats) per method (colour) and task instance (marker): seeds as small
    points, their mean as a large one. A method that wins only by drifting further sits to the right."""
    markers = "osD^vP*X"
    methods = sorted({r["method"] for st in studies.values() for r in st.get("final", {}).values()})
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    arms = sorted({r["arm"] for st in studies.values() for r in st.get("final", {}).values()}) or ["learned"]
    fig, axes = plt.subplots(1, len(arms), figsize=(10 * len(arms), 4.5), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        for i, (ts, st) in enumerate(studies.items()):
            for r in st.get("final", {}).values():
                if r["arm"] != arm:
                    continue
                kls = r.get("kl_final", {})
                xs = [kls[s] for s in r["final"] if s in kls]
                ys = [r["final"][s] for s in r["final"] if s in kls]
                ax.scatter(xs, ys, s=12, alpha=0.4, color=colours[r["method"]], marker=markers[i % len(markers)])
                ax.scatter([r["kl_end"][0]], [r["final_mean_ci"][0]], s=70, color=colours[r["method"]],
                           marker=markers[i % len(markers)], edgecolors="black",
                           label=f"{method_label(r['method'])}, instance {ts}")
            for key, points in st.get("kl_frontier", {}).items():  # each method's KL settings, joined in KL order
                method = key.split("/")[1]
                if key.split("/")[0] != arm or len(points) < 2 or method not in colours:
                    continue
                xs, ys = [p["kl_end"][0] for p in points], [p["final_mean_ci"][0] for p in points]
                ax.plot(xs, ys, color=colours[method], alpha=0.6, linewidth=1)
                ax.scatter(xs, ys, s=28, facecolors="none", edgecolors=colours[method], marker=markers[i % len(markers)])
        ax.set_title(f"{arm} feedback: final score vs final KL")
        ax.set_xlabel("KL from the start policy at the end (nats per response)")
        ax.set_ylabel("test fact score at the end")
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the points, not over them
    fig.tight_layout()
    save_figure(fig, png, dpi=110, bbox_inches="tight")  # the legend sits outside the axes
    plt.close(fig)


def pooled_markdown(studies: Mapping[Any, Mapping[str, Any]], pooled: Mapping[str, Any], command: str,
                    machine: str | None = None) -> str:
    """study.md of a study over several task instances: each instance's start and table (linked), then the
    per-instance and pooled sentences for each arm, and the grid-edge notes. ``machine``: where all the instances'
    runs ran (default: the first instance's machine line)."""
    first = next(iter(studies.values()))
    cfg = first["config"]
    source = first.get("settings_from")
    if not source:
        origin = "every method tuned on validation per instance"
    elif "instance" in source:  # a study over several instances gave each its own sweep's choices
        origin = f"settings from each instance's own sweep in {source['study']}"
    else:
        origin = f"settings from the sweep of {source['study']} (no sweep per instance)"
    critics = any(st.get("critics") for st in studies.values())  # older studies did not record them
    # a study that only swept has no final runs: no seeds, no curves, and its start scores are validation ones
    sweep_only = not any(st.get("final") for st in studies.values())
    runs = (f"sweep only (seed {cfg.get('sweep_seed')})" if sweep_only else
            f"seeds {', '.join(map(str, cfg['seeds']))}")
    split = "val" if sweep_only else "test"
    lines = [f"Task instances {', '.join(map(str, studies))}; policy: {cfg.get('policy')}; {cfg['iterations']} iterations "
             f"x {cfg['batch_size']} rollouts per run; {runs}; {origin}. "
             f"Machine: {machine or first.get('machine')}. Command: `{command}`.", "",
             f"| task instance | SFT start ({'validation' if sweep_only else 'test'} fact score) | false facts per summary | "
             + ("generative reward model, held-out token accuracy | Bradley-Terry reward model, held-out pairwise "
                "accuracy | " if critics else "") + "report |", "|---|---:|---:|" + ("---:|---:|" if critics else "") + "---|"]
    for ts, st in studies.items():
        sft = st["sft"].get(split, {})
        lines.append(f"| {ts} | {sft.get('fact_score', float('nan')):.3f} | {sft.get('n_false', float('nan')):.2f} | "
                     + ("".join(f"{cell} | " for cell in critic_quality_cells(st)) if critics else "")
                     + f"[task_seed{ts}/study.md](task_seed{ts}/study.md) |")
    missing = {ts: missing_runs_lines(st) for ts, st in studies.items()}
    if len({tuple(m) for m in missing.values()}) == 1:  # the same runs missing on every instance: said once
        lines += ["", *(f"On every instance: {line}" for line in next(iter(missing.values())))]
    else:
        lines += ["", *(f"Task instance {ts}: {line}" for ts, m in missing.items() for line in m)]
    for arm in ARMS:
        if pooled.get(arm, {}).get("lines"):
            lines += ["", f"**{arm} feedback, at the end of training**", "", *pooled[arm]["lines"]]
    edges = [f"instance {ts}, {line}" for ts, st in studies.items() for line in edge_lines(st.get("sweep", {}))]
    if any(row.get("tried") for st in studies.values() for row in st.get("sweep", {}).values()):  # a sweep ran
        lines += ["", "Grid edges: " + (" ".join(edges) if edges else "every chosen learning rate and fixed KL "
                                        "coefficient is interior to the values tried.")]
    if first.get("settings_from", {}).get("edge_lines"):
        lines += ["", f"Grid edges of the settings taken from {first['settings_from']['study']}: "
                  + " ".join(first["settings_from"]["edge_lines"])]
    if sweep_only:
        lines += ["", *chosen_per_instance_markdown(studies)]
    else:
        lines += ["", "Plots: [curves per instance](task_seed{0}/curves.png), [final score vs final KL](frontier.png)."
                  .replace("{0}", str(next(iter(studies))))]
    return paragraphs(lines)


def chosen_per_instance_markdown(studies: Mapping[Any, Mapping[str, Any]]) -> list[str]:
    """The table of a study that swept several task instances: each (arm, method)'s chosen setting on each
    instance with its validation score, and how many settings were tried (each instance's study.md lists them)."""
    keys = list(dict.fromkeys(k for st in studies.values() for k in st.get("sweep", {})))
    lines = ["Chosen on each instance's validation split (the mean of the last two evaluation points; settings "
             "tried):", "", "| arm / method | " + " | ".join(f"instance {ts}" for ts in studies) + " |",
             "|---|" + "---|" * len(studies)]
    for key in keys:
        cells = []
        for st in studies.values():
            row = st.get("sweep", {}).get(key)
            chosen = next((t for t in row["tried"] if t["setting"] == row["chosen"]), None) if row else None
            cells.append(f"{Setting(**row['chosen']).label()}: {chosen['val_end']:.3f} ({len(row['tried'])})"
                         if chosen else "-")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def corrected_paper_rows(study: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stored Table-10 rows of ``study`` with each reason re-derived from the knobs the sweep that chose its
    settings swept, its own or the earlier one it took them from (the values themselves are the study's, as
    stored)."""
    if study.get("settings_from"):
        knobs, inherited = inherited_knobs(study["settings_from"]), True
    else:
        knobs = sorted({k for v in study.get("sweep", {}).values() for k in v.get("knobs", [])}
                       or study.get("config", {}).get("sweep_knobs", []))
        inherited = False
    reasons = paper_reasons(knobs, inherited)
    return [{**r, "why": "" if r["same"] else PAPER_FIELDS.get(r["field"], r["why"]).format(**reasons)}
            for r in study.get("paper_comparison", [])]


def regenerate(folder: Path) -> str:
    """study.md of a one-instance study folder regenerated from its study.json alone (no runs needed), with the
    Table-10 reasons re-derived from the knobs the study swept; study.json's rows and its information-matched
    comparisons (`matched_comparisons`) are brought up to date too."""
    path = Path(folder) / "study.json"
    study = json.loads(path.read_text())
    if study.get("paper_comparison"):
        study["paper_comparison"] = corrected_paper_rows(study)
    if study.get("final"):
        study["matched"] = matched_comparisons(study)
        study["matched_on_validation"] = matched_on_validation(study)
    write_whole(path, json.dumps(study, indent=1, default=str))
    md = markdown(study)
    write_whole(Path(folder) / "study.md", md + "\n")
    return md


if __name__ == "__main__":
    for folder in sys.argv[1:] or [ROOT / "benchmarks" / "results" / "method_study"]:
        regenerate(Path(folder))
        print(f"regenerated {folder}/study.md")
