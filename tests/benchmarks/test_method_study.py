"""The method study's statistics, selection rules and generated sentences (benchmarks/method_study.py), on
hand-made curves; the study itself is a benchmark (hours), its smoke run a slow test."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import method_study as ms  # noqa: E402
from benchmarks import method_study_report as msr  # noqa: E402
from benchmarks import results_tables as rt  # noqa: E402
from reward_model.scalar_config import ScalarRMConfig  # noqa: E402
from policy_optimization.trainer import NLGradientPPOTrainer  # noqa: E402
from text2grad.apps.quickstart.task import TaskConfig, generate_task  # noqa: E402
from text2grad.core.config import parse_config  # noqa: E402
from text2grad.core.data import write_jsonl  # noqa: E402
from tests.concurrent_writers import write_at_once  # noqa: E402


def _curve(vals, tests=None):
    return [{"iteration": 10 * i, "val": {"fact_score": v}, **({"test": {"fact_score": tests[i]}} if tests else {})}
            for i, v in enumerate(vals)]


def test_mean_ci95_is_the_t_interval():
    m, h = msr.mean_ci95([1.0, 2.0, 3.0])
    # t(0.975, 2) = 4.302653; sd = 1; n = 3
    assert m == 2.0 and h == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert math.isnan(msr.mean_ci95([0.5])[1]) and msr.mean_ci95([0.5])[0] == 0.5


def test_selection_reads_the_end_of_training_on_validation_only():
    rising, peaked = _curve([0.1, 0.2, 0.3, 0.35]), _curve([0.1, 0.6, 0.2, 0.1])
    assert ms.end_score(rising) == pytest.approx(0.325) and ms.end_score(peaked) == pytest.approx(0.15)
    a, b = ms.Setting(1e-4, "fixed", 0.95), ms.Setting(1e-4, "fixed", 0.0)
    assert ms.choose({a: ms.end_score(peaked), b: ms.end_score(rising)}) == b  # the peak does not win
    assert ms.choose({a: 0.3, b: 0.3}) == a  # ties keep the first listed (the base setting)


def test_early_stopping_and_rollouts_to_target():
    curve = _curve([0.1, 0.5, 0.5, 0.2], tests=[0.0, 0.4, 0.45, 0.1])
    assert ms.early_stopped(curve) == {"iteration": 10, "val": 0.5, "test": 0.4}  # earliest of the tied best
    assert msr.first_reaching(curve, 0.42) == 20 and msr.first_reaching(curve, 0.9) is None
    assert msr.first_reaching(curve, -1.0) == 10  # iteration 0 (the start) never counts


def _final(arm, method, finals, early, seeds=(0, 1, 2)):
    spec = lambda s: ms.RunSpec(arm, method, ms.Setting(1e-4, "fixed", 0.0), s, "final")  # noqa: E731
    out = {}
    for s, f, e in zip(seeds, finals, early):
        curve = [{"iteration": 0, "val": {"fact_score": 0.2}, "test": {"fact_score": 0.2}, "kl": 0.0},
                 {"iteration": 10, "val": {"fact_score": e}, "test": {"fact_score": e}, "kl": 1.0},
                 {"iteration": 20, "val": {"fact_score": f - 0.5}, "test": {"fact_score": f}, "kl": 2.0}]
        out[spec(s)] = {"spec": {"setting": {"lr": 1e-4, "kl": "fixed", "lam": 0.0}}, "curve": curve, "final": curve[-1],
                        "early_stopped": ms.early_stopped(curve),
                        "true_label_shift": {"good": {"mean": 0.1, "n": 5}, "poor_first": {"mean": -0.2 * (1 + s), "n": 3}}}
    return out


def test_summary_and_sentences_follow_the_numbers():
    keys = [("oracle", "text2grad"), ("oracle", "scalar_collapsed"), ("learned", "scalar_bt")]
    res = {**_final("oracle", "text2grad", [0.5, 0.6, 0.4], [0.3, 0.5, 0.5]),
           **_final("oracle", "scalar_collapsed", [0.3, 0.35, 0.45], [0.3, 0.3, 0.3]),
           **_final("learned", "scalar_bt", [0.2, 0.2, 0.2], [0.2, 0.2, 0.2])}
    summ = msr.summarize_final(res, keys, [0, 1, 2], 16)
    t2g = summ["oracle/text2grad"]
    assert t2g["final_mean_ci"][0] == pytest.approx(0.5)
    assert t2g["reach"]["oracle"]["baseline"] == "oracle/scalar_collapsed"  # the best scalar baseline by final mean
    assert t2g["reach"]["oracle"]["rollouts"] == {0: 320, 1: 160, 2: 160}  # target 0.3667: iterations 20, 10, 10
    cmp = msr.compare_to_best_scalar(summ, "oracle")
    assert cmp["ahead_final"] == 2 and cmp["seeds"] == 3
    lines = msr.interpret(summ, 0.2)
    assert lines[0].startswith("With oracle feedback, Text2Grad ends training at 0.500 ± ")
    assert "0.133 ahead of the best scalar baseline (scalar PPO, critic's quotes collapsed" in lines[0]
    assert "ahead on 2 of 3 seeds" in lines[0] and "includes zero" in lines[0]
    assert lines[1] == ("The study's goal (Text2Grad ahead of that baseline at the end of training on at least 3 of 3 "
                        "seeds, within 0.02 of its own best validation point, at no larger final KL) is not met in the "
                        "oracle arm (ahead on >= 3 of 3 seeds: no, no late decline (<= 0.02): no, KL no larger: yes).")
    # finals 0.5 / 0.367 (scalar_bt, 0.2, reads no critic and is left out): range 0.133 against half-width 0.248
    lo, hi, widest = msr.final_spread(summ, "oracle")
    assert (lo, hi) == (pytest.approx(0.3667, abs=1e-4), pytest.approx(0.5)) and widest == pytest.approx(0.248, abs=1e-3)
    one_seed = {k: {**r, "final_mean_ci": (r["final_mean_ci"][0], float("nan"))} for k, r in summ.items()}
    assert msr.final_spread(one_seed, "oracle") is None  # one seed each: no seed noise to compare the range with
    assert lines[2] == ("The methods that read the oracle arm's critic end between 0.367 and 0.500 (a range of 0.133), "
                        "less than the widest 95 % interval half-width among them (0.248): by these unpaired intervals "
                        "they cannot be told apart at the end of training (the paired comparison above is the sharper "
                        "test).")
    # curves 0.2 -> early -> final: Text2Grad's last step is mean(final) - mean(early) = 0.5 - 0.433
    assert lines[3] == ("Over the last evaluation interval (iterations 10-20) Text2Grad's mean test score moved by +0.067, "
                        "the baseline's by +0.067: Text2Grad's curve had not flattened when training ended.")
    assert "wrong facts lost probability relative to the correct ones" in lines[6]
    for key, (recall, false) in {"oracle/text2grad": (0.4, 0.02), "oracle/scalar_collapsed": (0.38, 0.1)}.items():
        summ[key]["recall_false"] = [recall, false]
    told = msr.interpret(summ, 0.2, (0.42, 1.23))[6]
    assert told == ("At the end, Text2Grad's test summaries state 0.400 of the five facts correctly with 0.02 false facts "
                    "each, the baseline's 0.380 with 0.10 (the start policy: 0.420 and 1.23).")

    # the same study with Text2Grad worse: every sentence turns
    worse = {**res, **_final("oracle", "text2grad", [0.1, 0.1, 0.1], [0.1, 0.1, 0.1])}
    lines = msr.interpret(msr.summarize_final(worse, keys, [0, 1, 2], 16), 0.2)
    assert "behind the best scalar baseline" in lines[0] and "ahead on 0 of 3 seeds" in lines[0]
    assert "excludes zero" in lines[0]
    assert lines[1] == "Text2Grad itself ends no better than the start policy (0.100 ± 0.000 vs 0.200)."
    assert "on 0 of 3 seeds." in lines[6]
    assert lines[4].endswith("moved by +0.000, the baseline's by +0.067.")  # flat: no claim about flattening
    # the same means with noisy seeds: the spread sentence turns; ahead on every seed: the goal is met
    tied = {**_final("oracle", "text2grad", [0.3, 0.5, 0.4], [0.3, 0.5, 0.4]),
            **_final("oracle", "scalar_collapsed", [0.29, 0.49, 0.39], [0.3, 0.3, 0.3])}
    tied_lines = msr.interpret(msr.summarize_final(tied, keys[:2], [0, 1, 2], 16), 0.2)
    # ahead on every seed, but each validation curve ends 0.5 below its peak: a late decline, so the goal is not met
    assert tied_lines[1].endswith("is not met in the oracle arm (ahead on >= 3 of 3 seeds: yes, no late decline "
                                  "(<= 0.02): no, KL no larger: yes).")
    flat = msr.summarize_final(tied, keys[:2], [0, 1, 2], 16)
    for curve in flat["oracle/text2grad"]["val_curves"].values():
        curve[-1]["val"] = max(p["val"] for p in curve)
    assert msr.interpret(flat, 0.2)[1].endswith("is met in the oracle arm (ahead on >= 3 of 3 seeds: yes, no late "
                                                "decline (<= 0.02): yes, KL no larger: yes).")
    unrecorded = {k: {f: v for f, v in r.items() if f != "val_curves"} for k, r in flat.items()}
    # a study summarised before validation curves were stored: the late decline is unknown, so no verdict
    assert msr.interpret(unrecorded, 0.2)[1].endswith(
        "at no larger final KL) cannot be judged in the oracle arm (ahead on >= 3 of 3 seeds: yes, no late decline "
        "(<= 0.02): not recorded, KL no larger: yes).")
    flat["oracle/text2grad"]["kl_end"] = (3.0, 0.0)  # further from the start than the baseline (2.0): not met
    assert msr.interpret(flat, 0.2)[1].endswith("KL no larger: no).")
    unrecorded["oracle/text2grad"]["kl_end"] = (3.0, 0.0)  # one condition fails: not met, whatever is unknown
    assert "is not met in the oracle arm" in msr.interpret(unrecorded, 0.2)[1]
    assert tied_lines[2].startswith("The methods that read the oracle arm's critic end between 0.390 and 0.400 (a "
                                    "range of 0.010), less than")
    assert tied_lines[2].endswith("they cannot be told apart at the end of training (the paired comparison above is "
                                  "the sharper test).")
    # tight seeds far apart: they differ
    apart = {**_final("oracle", "text2grad", [0.6, 0.6, 0.6], [0.6, 0.6, 0.6]),
             **_final("oracle", "scalar_collapsed", [0.3, 0.3, 0.3], [0.3, 0.3, 0.3])}
    assert msr.interpret(msr.summarize_final(apart, keys[:2], [0, 1, 2], 16), 0.2)[2].endswith(
        "(0.000): at the end of training at least two of them differ by more than their seed noise.")
    md = ms.markdown({"final": msr.summarize_final(worse, keys, [0, 1, 2], 16), "sft": {"test": {"fact_score": 0.2}},
                      "config": {"iterations": 20, "batch_size": 16}, "ablations": {}})
    assert "| oracle | Text2Grad (span rewards) | lr 0.0001, KL fixed, lambda 0 | 0.100 ± 0.000 |" in md
    json.dumps(summ, default=str)  # the study file is JSON


def test_a_one_instance_report_compares_each_defended_text2grad_with_the_best_scalar_baseline():
    keys = [("learned", "text2grad"), ("learned", "scalar_bt"), ("learned", "text2grad+refresh")]
    res = {**_final("learned", "text2grad", [0.2, 0.3, 0.4], [0.3, 0.3, 0.3]),
           **_final("learned", "scalar_bt", [0.7, 0.5, 0.5], [0.3, 0.3, 0.3]),
           **_final("learned", "text2grad+refresh", [0.4], [0.3], seeds=(0,))}  # one seed finished so far
    study = {"final": msr.summarize_final(res, keys, [0, 1, 2], 16), "sft": {"test": {"fact_score": 0.2, "n_false": 1.0}},
             "config": {"iterations": 20, "batch_size": 16}, "ablations": {}}
    lines = ms.markdown(study).splitlines()
    at = lines.index("Text2Grad + refresh against the best scalar baseline:")
    # paired on the one seed both have: 0.4 vs 0.7
    assert "Text2Grad + refresh ends at 0.400, the best scalar baseline (scalar PPO, Bradley-Terry RM)" in lines[at + 1]
    assert "paired difference -0.300 (no interval from one pair; ahead on 0 of 1;" in lines[at + 1]
    plain = ms.markdown({**study, "final": msr.summarize_final(res, keys[:2], [0, 1, 2], 16)})
    assert "against the best scalar baseline:" not in plain  # no defended run, no such block


def test_ablation_sentences_compare_with_the_unchanged_setting():
    abl = {"none": {"final": (0.2, 0.05), "peak": (0.4, 0.02), "kl": (9.0, 1.0)},
           "span_normalize": {"final": (0.38, 0.03), "peak": (0.39, 0.02), "kl": (2.0, 0.5)},
           "entropy_bonus": {"final": (0.15, 0.05), "peak": (0.41, 0.02), "kl": (10.0, 1.0)}}
    lines = msr.interpret_ablations(abl)
    assert lines[0] == "The unchanged setting ends at 0.200 ± 0.050 with KL 9.00 nats and peaks at 0.400 ± 0.020."
    assert lines[1] == "span_normalize: ends at 0.380 ± 0.030 (+0.180 vs unchanged), KL 2.00 (-7.00); it removes the late decline."
    assert "the late decline remains." in lines[2]


def test_decline_start_is_the_first_fall_after_the_peak():
    curve = [{"iteration": 15 * i, "test": {"fact_score": v}} for i, v in enumerate([0.2, 0.38, 0.36, 0.30, 0.39])]
    assert msr.decline_start(curve) is None  # the late recovery is the peak
    curve[-1]["test"]["fact_score"] = 0.1
    assert msr.decline_start(curve) == 45  # 0.30 is the first point more than 0.05 below 0.38
    abl = {"none": {"final": (0.1, 0.0), "peak": (0.38, 0.0), "kl": (9.0, 0.0), "decline_start": [30, 45]},
           "oracle_critic": {"final": (0.3, 0.0), "peak": (0.4, 0.0), "kl": (40.0, 0.0), "decline_start": [75, None]}}
    assert msr.interpret_ablations(abl)[1].endswith(
        "A fall of more than 0.05 below the peak starts at iteration 75, never per seed (unchanged: 30, 45).")


def test_sweep_searches_only_the_given_knobs_and_picks_on_validation(monkeypatch):
    asked = []

    def fake_run_all(ctx, specs, jobs, train=True):  # validation rises with lambda, and is best at the lowest learning rate
        asked.extend(specs)
        return {s: {"curve": _curve([0.0, s.setting.lam - s.setting.lr * 100])} for s in specs}

    monkeypatch.setattr(ms, "run_all", fake_run_all)
    base = ms.Setting(1e-3, "fixed", 0.95)
    table = ms.sweep(None, [("oracle", "text2grad")], base, [1e-4, 3e-3], seed=7, jobs=1, knobs=("lambda",))
    assert table["oracle/text2grad"]["chosen"] == {"lr": 1e-3, "kl": "fixed", "lam": 1.0, "kl_coef": None}
    assert {s.setting.lam for s in asked} == {0.0, 0.95, 1.0} and {s.setting.lr for s in asked} == {1e-3}
    assert all(s.seed == 7 and s.phase == "sweep" for s in asked)
    asked.clear()
    table = ms.sweep(None, [("oracle", "text2grad")], base, [1e-4, 3e-3], seed=7, jobs=1, extensions=0)
    assert table["oracle/text2grad"]["chosen"] == {"lr": 1e-4, "kl": "fixed", "lam": 1.0, "kl_coef": None}
    assert {s.setting.kl for s in asked} == {"fixed", "adaptive"}
    assert {s.setting.kl_coef for s in asked if s.setting.kl == "fixed"} == {None, *ms.KL_COEFS}


def test_the_sweep_grows_a_grid_past_a_choice_at_its_edge_until_it_is_interior(monkeypatch):
    """Validation peaks at lr 9e-4 and at a fixed KL coefficient of 0.3 x 3 = 0.9 is not tried: lr grows 3e-4 -> 9e-4
    (then 2.7e-3 is worse: 9e-4 is interior); the KL coefficient 0.3 is interior of {0.05, 0.1, 0.3, 1.0}."""
    asked = []

    def fake_run_all(ctx, specs, jobs, train=True):
        asked.extend(specs)
        score = lambda x: -abs(math.log(x.lr / 9e-4)) - (abs(math.log(x.kl_coef / 0.3)) if x.kl_coef else 2.0)  # noqa: E731
        return {s: {"curve": _curve([0.0, score(s.setting)])} for s in specs}

    monkeypatch.setattr(ms, "run_all", fake_run_all)
    table = ms.sweep(None, [("learned", "scalar_sum")], ms.Setting(1e-4, "fixed", 0.95), [3e-5, 3e-4], seed=1, jobs=1,
                     knobs=("lr", "kl"))
    row = table["learned/scalar_sum"]
    assert row["chosen"]["lr"] == pytest.approx(9e-4) and row["chosen"]["kl_coef"] == 0.3
    assert sorted({round(s.setting.lr, 10) for s in asked}) == [3e-5, 1e-4, 3e-4, 9e-4, 2.7e-3]
    assert row["edges"] == {"lambda": "only", "lr": "interior", "kl_coef": "interior"}
    assert msr.edge_lines(table) == []
    # a grid that may not grow further (no extensions left) is reported at its edge
    asked.clear()
    table = ms.sweep(None, [("learned", "scalar_sum")], ms.Setting(1e-4, "fixed", 0.95), [3e-5, 3e-4], seed=1, jobs=1,
                     knobs=("lr",), extensions=0)
    assert table["learned/scalar_sum"]["edges"]["lr"] == "highest"
    assert msr.edge_lines(table) == ["learned/scalar_sum: the chosen lr is the highest value tried, so that choice "
                                     "sits at a grid edge."]


def test_grid_helpers():
    assert ms.extend_grid([1e-4, 3e-4], 3e-4, 3.0) == pytest.approx(9e-4)
    assert ms.extend_grid([1e-4, 3e-4], 1e-4, 3.0) == pytest.approx(1e-4 / 3)
    assert ms.extend_grid([1e-4, 2e-4, 3e-4], 2e-4, 3.0) is None  # interior
    assert ms.extend_grid([0.3, 1.0], 1.0, 3.0, hi=2.0) is None  # the step would leave the allowed range
    assert msr.grid_position([0.0, 0.95, 1.0], 1.0) == "highest" and msr.grid_position([0.5], 0.5) == "only"


def test_methods_read_the_right_reward_and_critic_free_methods_run_under_one_arm():
    keys = ms.method_keys(["oracle", "learned"], ["text2grad", "scalar_sum", "scalar_bt", "scalar_task"])
    assert ("learned", "scalar_bt") in keys and ("oracle", "scalar_bt") not in keys
    assert ("oracle", "scalar_task") in keys and ("learned", "scalar_task") not in keys
    assert ms.method_keys(["learned"], ["scalar_task"]) == []  # the oracle baseline only where the oracle arm is
    ctx = ms.StudyContext(sft="sft", rl="rl.jsonl", val_records=[], test_records=[], rm="rm", dense_rm="dense_rm",
                          scalar_rm="scalar_rm", iterations=90, eval_every=15, batch_size=16, response_length=40,
                          kl_coef=0.1, target_kl=6.0, out="out")
    cfg = lambda arm, m, s=ms.Setting(1e-4, "fixed", 0.0): ms._ppo_config(ctx, ms.RunSpec(arm, m, s, 0, "final"), "r")  # noqa: E731
    assert cfg("learned", "scalar_sum").reward_mode == "scalar_sum" and cfg("learned", "scalar_sum").critic == "reward_model"
    task = cfg("oracle", "scalar_task")
    assert (task.reward_mode, task.critic, task.scalar_source) == ("scalar", "none", "text2grad.apps.quickstart.task:FactScore")
    adaptive = cfg("learned", "text2grad", ms.Setting(1e-4, "adaptive", 0.0))
    assert adaptive.adaptive_kl and (adaptive.kl_horizon, adaptive.kl_horizon_unit) == (10, "iterations")
    assert cfg("learned", "text2grad", ms.Setting(1e-4, "fixed", 0.0, 0.3)).kl_coef == 0.3
    assert ms.RunSpec("learned", "text2grad", ms.Setting(1e-4, "fixed", 0.0, 0.3), 0, "final").run_id == \
        "final/learned-text2grad-lr0.0001-kl_fixed0.3-lam0-seed0"
    assert ms.RunSpec("learned", "text2grad", ms.Setting(1e-4, "fixed", 0.0), 0, "final").run_id == \
        "final/learned-text2grad-lr0.0001-kl_fixed-lam0-seed0"  # the run ids of earlier studies are kept


def test_a_variant_is_its_method_with_its_fields_changed(monkeypatch):
    monkeypatch.setitem(ms.VARIANTS, "whitened", lambda ctx: {"whiten_rewards": True})
    ctx = ms.StudyContext(sft="sft", rl="rl.jsonl", val_records=[], test_records=[], rm="rm", dense_rm="dense_rm",
                          scalar_rm="scalar_rm", iterations=90, eval_every=15, batch_size=16, response_length=40,
                          kl_coef=0.1, target_kl=6.0, out="out")
    s = ms.Setting(1e-4, "fixed", 0.0)
    plain = ms._ppo_config(ctx, ms.RunSpec("learned", "text2grad", s, 0, "final"), "r")
    varied = ms._ppo_config(ctx, ms.RunSpec("learned", "text2grad+whitened", s, 0, "final"), "r")
    assert {k for k in vars(plain) if getattr(plain, k) != getattr(varied, k)} == {"whiten_rewards"}
    assert ("learned", "scalar_sum+whitened") in ms.method_keys(["learned"], ["text2grad", "scalar_sum"], ["whitened"])
    # --variant_methods text2grad: the variant for Text2Grad only (scalar_sum is still run plain)
    assert ms.method_keys(["learned"], ["text2grad", "scalar_sum"], ["whitened"], ["text2grad"]) == [
        ("learned", "text2grad"), ("learned", "scalar_sum"), ("learned", "text2grad+whitened")]
    assert ms.method_label("text2grad+whitened") == "Text2Grad (span rewards) + whitened"
    with pytest.raises(ValueError, match="unknown method 'text2grad\\+nothing'"):
        ms.split_method("text2grad+nothing")


@pytest.mark.parametrize("variant", ["ensemble", "refresh", "ensemble_refresh", "offline_matched", "steps_matched",
                                     "swap_matched", "prompts_matched", "rl_covered"])
def test_the_defence_variants_are_valid_ppo_configs_changing_only_the_critic_side(variant):
    ctx = ms.StudyContext(sft="sft", rl="rl.jsonl", val_records=[], test_records=[], rm="shared/rm/model",
                          dense_rm="", scalar_rm="", iterations=90, eval_every=15, batch_size=16, response_length=40,
                          kl_coef=0.1, target_kl=6.0, out="out", rm_ensemble="shared/ens/model",
                          rm_replay="shared/rm/rm_train.jsonl", rm_offline_matched="shared/matched/model",
                          rm_steps_matched="shared/steps/model", rm_swap_matched="shared/swap/model",
                          rm_prompts_matched="shared/prompts/model", rm_rl_covered="shared/covered/model")
    s = ms.Setting(1e-4, "fixed", 0.0)
    plain = ms._ppo_config(ctx, ms.RunSpec("learned", "text2grad", s, 0, "final"), "r")
    varied = ms._ppo_config(ctx, ms.RunSpec("learned", f"text2grad+{variant}", s, 0, "final"), "r")
    changed = {k for k in vars(plain) if getattr(plain, k) != getattr(varied, k)}
    ensemble = {"critic", "critic_kwargs"} if "ensemble" in variant else set()
    if variant.endswith(("_matched", "_covered")):  # the same critic, another reward model
        path = {"offline_matched": "shared/matched/model", "steps_matched": "shared/steps/model",
                "swap_matched": "shared/swap/model", "prompts_matched": "shared/prompts/model",
                "rl_covered": "shared/covered/model"}[variant]
        assert changed == {"critic_kwargs"} and varied.critic_kwargs == {**plain.critic_kwargs, "path": path}
        return
    refresh = {"rm_refresh_every", "rm_refresh_critic", "rm_refresh_critic_kwargs", "rm_refresh_replay"} if "refresh" in variant else set()
    assert changed == ensemble | refresh
    if ensemble:
        assert varied.critic == "reward_model_ensemble" and varied.critic_kwargs["path"] == "shared/ens/model"
    if refresh:
        assert varied.rm_refresh_replay == ["shared/rm/rm_train.jsonl"] and varied.rm_refresh_every == 15  # 6 refreshes in 90 iterations
    assert ("oracle", f"text2grad+{variant}") not in ms.method_keys(["oracle", "learned"], ["text2grad"], [variant])


@pytest.mark.parametrize("ablation", list(ms.ABLATIONS))
def test_every_ablation_is_one_valid_change_of_the_ppo_config(ablation):
    ctx = ms.StudyContext(sft="sft", rl="rl.jsonl", val_records=[], test_records=[], rm="rm", dense_rm="dense_rm",
                          scalar_rm="scalar_rm", iterations=90, eval_every=15, batch_size=16, response_length=40,
                          kl_coef=0.1, target_kl=6.0, out="out")
    spec = ms.RunSpec("learned", "text2grad", ms.Setting(1e-4, "fixed", 0.0), 0, "ablation", ablation)
    cfg, base = ms._ppo_config(ctx, spec, "run"), ms._ppo_config(ctx, replace(spec, ablation="none"), "run")
    changed = {k for k in vars(base) if getattr(cfg, k) != getattr(base, k)}
    want = {k for k in ms.ABLATIONS[ablation] if not k.startswith("_")} | ({"critic", "critic_kwargs"} if ablation == "oracle_critic" else set())
    assert changed == want and all(getattr(cfg, k) == v for k, v in ms.ABLATIONS[ablation].items() if not k.startswith("_"))


def test_a_folder_of_another_study_is_refused_not_mixed_in():
    args = ms.argparse.Namespace(preset="smollm2", task_seed=0, iterations=24, eval_every=6, batch_size=0, target_kl=6.0,
                                 sft_steps=12, sft_learning_rate=1e-3)
    ident = ms.study_identity(args)
    ms.check_same_study(None, ident, "runs/x")  # a new folder
    ms.check_same_study(dict(ident), ident, "runs/x")  # the same study, resumed
    with pytest.raises(SystemExit, match=r"preset: 'ci' there, 'smollm2' now.*another --output_dir"):
        ms.check_same_study({**ident, "preset": "ci"}, ident, "runs/x")
    with pytest.raises(SystemExit, match="sft_steps: 80 there, 12 now"):
        ms.check_same_study({**ident, "sft_steps": 80}, ident, "runs/x")
    # a reward model trained on more annotations is another study; the preset's count keeps older folders valid
    more = ms.study_identity(ms.argparse.Namespace(**vars(args), rm_annotations=520))
    assert ms.study_identity(ms.argparse.Namespace(**vars(args), rm_annotations=0)) == ident
    with pytest.raises(SystemExit, match="rm_annotations"):
        ms.check_same_study(ident, more, "runs/x")


def test_the_reward_models_annotation_count_reaches_the_quickstart_config(tmp_path):
    args = dict(preset="smollm2", task_seed=0, sft_steps=10, sft_learning_rate=1e-3, batch_size=0)
    assert ms.study_config(ms.argparse.Namespace(**args, rm_annotations=520), tmp_path).n_annotations == 520
    assert ms.study_config(ms.argparse.Namespace(**args, rm_annotations=0), tmp_path).n_annotations == 160  # the preset's


def test_runs_from_another_start_policy_stop_the_study_before_it_adds_any(tmp_path):
    def finished(run: str, val_score: float) -> None:
        path = tmp_path / "final" / run / "result.json"
        path.parent.mkdir(parents=True)
        start = {"fact_score": val_score, "fact_recall": 0.4}
        path.write_text(json.dumps({"curve": [{"iteration": 0, "val": start}, {"iteration": 6, "val": {"fact_score": 0.5}}],
                                    "cpu": "Intel(R) Xeon(R) Processor, 2 cores", "versions": {"torch": "2.13.0+cpu"}}))

    here = {"val": {"fact_score": 0.1958, "fact_recall": 0.4}, "test": {"fact_score": 0.24}}
    ms.check_same_start(tmp_path, here)  # nothing finished yet
    finished("learned-text2grad-seed0", 0.1958)
    (tmp_path / "shared" / "x").mkdir(parents=True)  # the setup's own files are not runs
    (tmp_path / "shared" / "x" / "result.json").write_text("{}")
    ms.check_same_start(tmp_path, here)  # the same start, resumed
    finished("learned-scalar_sum-seed0", 0.2792)
    with pytest.raises(SystemExit, match=r"validation fact_score 0\.1958, but 1 finished run\(s\) there started "
                                         r"from one with fact_score 0\.2792 \(e\.g\. final/learned-scalar_sum-seed0\).*new --output_dir") as stop:
        ms.check_same_start(tmp_path, here)
    # both machines named: a CPU of the same model name can run other kernels, so the name alone is no advice
    here_machine = ", ".join(x for x in (ms.cpu_model(), ms.cpu_kernels(), ms.cpu_id()) if x)
    assert ("They ran on Intel(R) Xeon(R) Processor, 2 cores, CPU kernels not recorded with torch 2.13.0+cpu (SFT "
            "policy: threads not recorded: before --sft_threads, a command's first task instance trained on the "
            f"machine's cores, the others on 1); this machine is {here_machine} with torch") in str(stop.value)
    assert ms.cpu_kernels().split(" + ")[0] in {"DEFAULT", "AVX2", "AVX512", "Z VECTOR", "VSX", "SVE256", "NO AVX"}


def test_the_sft_policy_trains_on_the_studys_thread_count_whatever_the_process_ran_before(tmp_path, monkeypatch, capsys):
    """The same seed trains another SFT policy on another torch thread count, and the setup of a command's later task
    instances used to inherit the one thread its earlier instance's runs set: the count is now the study's own, and
    each count caches its policies apart (the quickstart's cache key does not hold it)."""
    seen = []

    class Stop(Exception):
        pass

    def stage_policy(cfg, data):
        seen.append((torch.get_num_threads(), cfg.cache_dir))
        raise Stop

    monkeypatch.setattr(ms.qs, "stage_data", lambda cfg, shared: {})
    monkeypatch.setattr(ms.qs, "stage_policy", stage_policy)
    monkeypatch.setenv("TEXT2GRAD_CACHE", str(tmp_path / "cache"))
    before = torch.get_num_threads()
    try:
        for prior, threads in ((1, 2), (2, 1), (2, ms.DEFAULT_SFT_THREADS)):
            torch.set_num_threads(prior)  # what an earlier task instance left behind
            args = argparse.Namespace(output_dir=str(tmp_path / "study"), task_seed=1, preset="ci", rm_annotations=0,
                                      sft_threads=threads)
            with pytest.raises(Stop):
                ms.build_context(args, [("learned", "text2grad")])
    finally:
        torch.set_num_threads(before)
    assert seen == [(2, str(tmp_path / "cache" / "study-sft_threads2")), (1, str(tmp_path / "cache" / "study-sft_threads1")),
                    (1, str(tmp_path / "cache" / "study-sft_threads1"))]
    with pytest.raises(SystemExit) as stop:  # before any setup is built
        ms.main(["--sft_threads", "0", "--phases", "report", "--output_dir", str(tmp_path / "study")])
    assert stop.value.code == 2 and "--sft_threads 0: the SFT policy needs at least 1 torch thread" in capsys.readouterr().err


def test_a_run_that_recorded_its_start_policys_weights_is_resumed_only_from_those_weights(tmp_path):
    """Equal validation scores say only that two start policies' greedy outputs agree there: where a run recorded
    its start policy's fingerprint, other weights are refused even at the same scores, and the same weights pass."""
    start = {"fact_score": 0.225, "fact_recall": 0.4125}
    path = tmp_path / "final" / "learned-text2grad-seed0" / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"curve": [{"iteration": 0, "val": start}], "start_fingerprint": "0123456789abcdef",
                                "cpu": "Intel(R) Xeon(R) Processor, 2 cores", "cpu_kernels": "AVX512 + AMX",
                                "cpu_id": "family 6 model 143 stepping 8", "sft_threads": 2}))
    ms.check_same_start(tmp_path, {"val": start}, "0123456789abcdef")
    ms.check_same_start(tmp_path, {"val": start})  # a caller without a fingerprint compares the scores alone
    with pytest.raises(SystemExit, match=r"weights fingerprint fedcba9876543210, but 1 finished run\(s\) there "
                                         r"started from one with 0123456789abcdef \(the same validation scores\)"
                                         r".*They ran on Intel\(R\) Xeon\(R\) Processor, 2 cores, AVX512 \+ AMX, "
                                         r"family 6 model 143 stepping 8 with torch .* \(SFT policy: 2 torch "
                                         r"thread\(s\)\); this machine is .*, its SFT policy on 1 torch thread\(s\)"
                                         r".*with their --sft_threads"):
        ms.check_same_start(tmp_path, {"val": start}, "fedcba9876543210", 1)


def test_the_weights_fingerprint_changes_with_any_weight_and_names_the_cpu_numbers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2)).to(torch.bfloat16)
    before = ms.weights_fingerprint(model)
    assert before == ms.weights_fingerprint(model) and len(before) == 16
    with torch.no_grad():
        model[1].bias[0] += 2 ** -6  # one element, representable in bf16
    assert ms.weights_fingerprint(model) != before
    cpu = ms.cpu_id()
    assert cpu == "" or re.fullmatch(r"family \d+ model \d+( stepping \d+)?", cpu), cpu


def test_a_report_names_the_machines_its_runs_ran_on_not_its_own(tmp_path):
    assert ms.machines_of_runs(tmp_path) is None  # no run yet: the study's own machine is used
    runs = [("a", "AMD EPYC, 2 cores", None), ("b", "AMD EPYC, 2 cores", None), ("c", "Intel Xeon, 2 cores", None),
            ("d", None, None), ("e", "Intel Xeon, 2 cores", "AVX512 + AMX"), ("f", "Intel Xeon, 2 cores", "AVX512 + AMX"),
            ("g", "Intel Xeon, 2 cores", "AVX512 + AMX")]
    for run, cpu, kernels in runs:
        (tmp_path / "final" / run).mkdir(parents=True)
        recorded = {k: v for k, v in (("cpu", cpu), ("cpu_kernels", kernels)) if v}
        (tmp_path / "final" / run / "result.json").write_text(json.dumps(recorded))
    (tmp_path / "shared" / "rm").mkdir(parents=True)
    (tmp_path / "shared" / "rm" / "result.json").write_text(json.dumps({"cpu": "GPU box, 64 cores"}))
    # one CPU name with and without recorded kernels counts apart: the same name can run other kernels
    assert ms.machines_of_runs(tmp_path) == (
        "Intel Xeon, 2 cores, AVX512 + AMX (3 runs); AMD EPYC, 2 cores (2 runs); Intel Xeon, 2 cores (1 run)",
        "Intel Xeon + AMD EPYC")
    # runs that recorded the machine's load at their evaluation points: how shared the machine was
    for run, loads in (("e", [1.0, 3.5]), ("f", [2.0, None]), ("g", [])):
        path = tmp_path / "final" / run / "result.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "load_1min": loads}))
    assert ms.machines_of_runs(tmp_path)[0].endswith(
        "Intel Xeon, 2 cores (1 run); 1-minute load at the evaluation points of the 2 runs that recorded it: median "
        "2.00, up to 3.50")


def test_a_report_over_several_instances_names_the_machines_of_every_instance_s_runs(tmp_path):
    studies = {0: _instance([0.5, 0.4], [0.3, 0.3]), 1: _instance([0.2, 0.1], [0.3, 0.3])}
    for st in studies.values():
        st["machine"] = "the first instance's machine line"
    for ts, run, cpu in [(0, "a", "AMD EPYC, 2 cores"), (1, "b", "Intel Xeon, 2 cores"), (1, "c", "Intel Xeon, 2 cores")]:
        (tmp_path / f"task_seed{ts}" / "final" / run).mkdir(parents=True)
        (tmp_path / f"task_seed{ts}" / "final" / run / "result.json").write_text(json.dumps({"cpu": cpu}))
    (tmp_path / "task_seed1" / "shared" / "x").mkdir(parents=True)  # an instance's setup: not a run
    (tmp_path / "task_seed1" / "shared" / "x" / "result.json").write_text(json.dumps({"cpu": "GPU box, 64 cores"}))
    study = ms.write_pooled_report(studies, tmp_path, "cmd")
    assert study["machine"].startswith("Intel Xeon, 2 cores (2 runs); AMD EPYC, 2 cores (1 run), Python ")
    assert study["cpu"] == "Intel Xeon + AMD EPYC"
    assert "Machine: Intel Xeon, 2 cores (2 runs); AMD EPYC, 2 cores (1 run)" in (tmp_path / "study.md").read_text()


def test_paper_comparison_reads_both_sides_and_says_why_only_where_they_differ():
    cfg = ms.PPOConfig(model_name_or_path="m", dataset_path="d.jsonl", output_dir="o", learning_rate=1e-4,
                       num_ppo_epochs=4, lam=0.95, adaptive_kl=True, kl_coef=0.2, use_lora=False)
    rows = {r["field"]: r for r in ms.paper_comparison(cfg)}
    assert rows["learning_rate"]["paper"] == 1e-6 and rows["learning_rate"]["study"] == 1e-4
    assert not rows["learning_rate"]["same"] and "swept" in rows["learning_rate"]["why"]
    assert rows["num_ppo_epochs"]["same"] and rows["num_ppo_epochs"]["why"] == ""
    assert rows["lam"]["same"] and rows["adaptive_kl"]["same"]
    assert rows["lora_r"]["study"] is None and not rows["use_lora"]["same"]  # no LoRA: no rank to compare
    lines = ms.markdown({"final": {}, "sft": {"test": {"fact_score": 0.2}}, "config": {"iterations": 2, "batch_size": 4},
                         "paper_comparison": list(rows.values()), "paper_comparison_for": "x"})
    agree = sum(r["same"] for r in rows.values())
    assert f"{agree} of {len(rows)} fields agree" in lines and "| num_ppo_epochs | 4 | 4 | same |" in lines


def test_a_sweep_from_another_start_policy_is_reported_with_both_scores():
    same = {"val": {"fact_score": 0.225}, "test": {"fact_score": 0.236}}
    other = {"val": {"fact_score": 0.225}, "test": {"fact_score": 0.170}}
    assert msr.start_policy_lines({"sft": same, "sweep_sft": same}) == []
    assert msr.start_policy_lines({"sft": same}) == []  # a study without a sweep of its own
    assert msr.start_policy_lines({"sft": same, "sweep_sft": other})[1] == (
        "The sweep's runs started from an SFT policy scoring 0.225 on validation and 0.170 on test; the final runs "
        "from one scoring 0.225 and 0.236.")


_ORPHAN_SCRIPT = """
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
sys.path.insert(0, {root!r})
from benchmarks.method_study import init_run_worker

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=init_run_worker,
                             initargs=(os.getpid(),)) as pool:
        print(pool.submit(os.getpid).result(), flush=True)
        pool.submit(time.sleep, 600)
        time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_study_leaves_no_worker_running(tmp_path):
    script = tmp_path / "study.py"
    script.write_text(_ORPHAN_SCRIPT.format(root=str(ROOT)))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        # a reaped zombie counts as gone: its state is Z until init collects it
        stat = Path(f"/proc/{worker}/stat")
        if stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"):
            break
        time.sleep(0.2)
    else:
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the pool's worker outlived the killed study process")


_ENGINE_SCRIPT = """
import multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
sys.path.insert(0, {root!r})
from benchmarks.method_study import init_run_worker
from text2grad.core import vllm_engine


class Engine:  # as vLLM's: a child process (its engine core) that runs until the engine is closed
    def __init__(self):
        fork = multiprocessing.get_context("fork")
        self.stop = fork.Event()
        self.core = fork.Process(target=self.stop.wait, args=(900,))  # gone in 15 minutes if the test fails
        self.core.start()

    def close(self):
        self.stop.set()


def run_with_an_engine():
    vllm_engine._shared = (None, Engine())  # a run's shared engine, kept for the worker's next run
    return os.getpid()


if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=init_run_worker,
                             initargs=(os.getpid(),)) as pool:
        print("ran in", pool.submit(run_with_an_engine).result(), flush=True)
    print("study finished", flush=True)
"""


def test_a_worker_whose_runs_started_an_engine_still_exits(tmp_path):
    script = tmp_path / "study.py"
    script.write_text(_ENGINE_SCRIPT.format(root=str(ROOT)))
    # the study and its spawned worker each import benchmarks.method_study (torch, transformers, TRL: over 40 s
    # each on a loaded 2-core machine); a worker that waited on the engine would hang for the engine's 900 s
    try:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=480)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the study never finished: its worker waited on the engine's process at exit ({exc.stdout!r})")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "study finished"


# ------------------------------------------------------------------------------------------------
# Paired statistics, several task instances, resuming from committed results
# ------------------------------------------------------------------------------------------------


def test_sign_test_and_paired_interval_by_hand():
    # 5 of 5 positive: p = 2 * 0.5^5 = 0.0625; 4 of 5: 2 * (1 + 5) / 32 = 0.375; zeros are dropped
    assert msr.sign_test([0.1, 0.2, 0.1, 0.3, 0.05]) == pytest.approx(0.0625)
    assert msr.sign_test([0.1, 0.2, 0.1, 0.3, -0.05]) == pytest.approx(0.375)
    assert msr.sign_test([0.1, 0.0, 0.2]) == pytest.approx(0.5)  # 2 of 2 non-zero
    assert math.isnan(msr.sign_test([0.0, 0.0]))
    # equal scores reached by different float sums differ by ~1e-17: a tie, dropped like a zero, never "ahead"
    assert msr.sign_test([0.1, (0.1 + 0.2) - 0.3, 0.2]) == pytest.approx(0.5)
    assert msr.paired({0: 0.1 + 0.2, 1: 0.5}, {0: 0.3, 1: 0.4})["ahead"] == 1
    p = msr.paired({0: 0.5, 1: 0.6, 2: 0.4}, {0: 0.3, 1: 0.35, 2: 0.45, 3: 0.9})  # seed 3 has no pair
    # diffs 0.2, 0.25, -0.05: mean 0.1333, sd 0.1607, half-width 4.3027 * 0.1607 / sqrt(3) = 0.3993
    assert p["n"] == 3 and p["ahead"] == 2 and p["mean"] == pytest.approx(0.13333, abs=1e-5)
    assert p["interval"] == (pytest.approx(-0.2660, abs=1e-3), pytest.approx(0.5326, abs=1e-3))
    assert p["sign_p"] == pytest.approx(1.0)
    assert msr.paired_words(p) == ("+0.133 (95 % interval [-0.266, +0.533]; ahead on 2 of 3; exact two-sided sign "
                                   "test p = 1)")


def test_the_instance_sentence_prints_the_interval_and_says_when_the_baseline_did_not_learn():
    keys = [("oracle", "text2grad"), ("oracle", "scalar_collapsed")]
    res = {**_final("oracle", "text2grad", [0.5, 0.6, 0.4], [0.3, 0.5, 0.5]),
           **_final("oracle", "scalar_collapsed", [0.3, 0.35, 0.45], [0.3, 0.3, 0.3])}
    summ = msr.summarize_final(res, keys, [0, 1, 2], 16)
    lines = msr.interpret(summ, 0.2)
    assert ("the 95 % interval of the paired difference is [-0.266, +0.533] (exact two-sided sign test p = 1), which "
            "includes zero") in lines[0]
    assert not any("no better than the start policy" in x for x in lines)
    lines = msr.interpret(summ, 0.4)  # the baseline's 0.367 is below a start of 0.4
    assert lines[1] == ("The best scalar baseline ends no better than the start policy (0.367 ± 0.190 vs 0.400): no "
                        "scalar baseline improved on the SFT policy here.")
    lines = msr.interpret(summ, 0.55)  # both end below a start of 0.55: Text2Grad's fall is said too
    assert lines[2] == "Text2Grad itself ends no better than the start policy (0.500 ± 0.248 vs 0.550)."
    # one seed pair: no interval, no sign test, and no verdict on the goal from a single draw
    one = msr.summarize_final({**_final("learned", "text2grad", [0.2], [0.5], seeds=[0]),
                               **_final("learned", "scalar_sum", [0.05], [0.36], seeds=[0])},
                              [("learned", "text2grad"), ("learned", "scalar_sum")], [0], 8)
    lines = msr.interpret(one, 0.362)
    assert lines[0].endswith("it is ahead on 1 of 1 seeds, and one seed gives no interval of the paired difference, "
                             "so this is not a reliable difference.")
    assert lines[2] == "Text2Grad itself ends no better than the start policy (0.200 vs 0.362)."
    assert lines[3] == ("With 1 seed pair the study's goal (Text2Grad ahead of that baseline at the end of training on "
                        "at least 80% of seeds) cannot be judged in the learned arm.")
    # the validation curves and each seed's final KL are stored, so early stopping can be re-derived from study.json
    assert summ["oracle/text2grad"]["val_curves"][0][-1] == {"iteration": 20, "val": pytest.approx(0.0)}
    assert summ["oracle/text2grad"]["kl_final"] == {0: 2.0, 1: 2.0, 2: 2.0}


def test_the_best_scalar_baseline_is_chosen_among_all_of_them():
    keys = [("learned", "text2grad"), ("learned", "scalar_sum"), ("learned", "scalar_collapsed"), ("learned", "scalar_bt")]
    res = {**_final("learned", "text2grad", [0.5, 0.5, 0.5], [0.5] * 3),
           **_final("learned", "scalar_sum", [0.45, 0.45, 0.45], [0.4] * 3),
           **_final("learned", "scalar_collapsed", [0.3, 0.3, 0.3], [0.3] * 3),
           **_final("learned", "scalar_bt", [0.4, 0.4, 0.4], [0.4] * 3)}
    summ = msr.summarize_final(res, keys, [0, 1, 2], 16)
    assert msr.best_scalar(summ, "learned") == "learned/scalar_sum"
    assert summ["learned/text2grad"]["reach"]["learned"]["baseline"] == "learned/scalar_sum"


def test_a_learned_critic_is_never_compared_with_the_baseline_that_reads_the_true_score():
    keys = [("oracle", "text2grad"), ("oracle", "scalar_task"), ("learned", "text2grad"), ("learned", "scalar_sum"),
            ("learned", "scalar_bt")]
    res = {**_final("oracle", "text2grad", [0.7] * 3, [0.7] * 3),
           **_final("oracle", "scalar_task", [0.65] * 3, [0.6] * 3),  # the strongest scalar, on oracle information
           **_final("learned", "text2grad", [0.4] * 3, [0.4] * 3),
           **_final("learned", "scalar_sum", [0.3] * 3, [0.3] * 3),
           **_final("learned", "scalar_bt", [0.35] * 3, [0.35] * 3)}
    summ = msr.summarize_final(res, keys, [0, 1, 2], 16)
    assert msr.best_scalar(summ, "learned") == "learned/scalar_bt"  # not oracle/scalar_task (0.65)
    assert summ["learned/text2grad"]["reach"]["learned"]["baseline"] == "learned/scalar_bt"
    assert msr.compare_to_best_scalar(summ, "learned")["ahead_final"] == 3
    assert msr.best_scalar(summ, "oracle") == "oracle/scalar_task"  # the oracle arm keeps it, and the BT model
    assert msr.compared_in("oracle", "learned", "scalar_bt") and not msr.compared_in("learned", "oracle", "scalar_task")
    assert not msr.compared_in("learned", "oracle", "scalar_sum")  # a critic-reading run stays in its own arm
    assert msr.interpret(summ, 0.2)[0].startswith("With oracle feedback")
    learned = [line for line in msr.interpret(summ, 0.2) if line.startswith("With learned feedback")]
    assert "Bradley-Terry" in learned[0] and "fact score (oracle)" not in learned[0]


def _instance(t2g, base, kl=(2.0, 2.0), sft=0.2, decline=0.0):
    """A study of one task instance with Text2Grad and scalar_sum finals (per-seed scores)."""
    keys = [("learned", "text2grad"), ("learned", "scalar_sum")]
    res = {**_final("learned", "text2grad", t2g, [0.3] * len(t2g), seeds=range(len(t2g))),
           **_final("learned", "scalar_sum", base, [0.3] * len(base), seeds=range(len(base)))}
    summ = msr.summarize_final(res, keys, list(range(len(t2g))), 16)
    summ["learned/text2grad"]["kl_end"] = (kl[0], 0.0)
    summ["learned/scalar_sum"]["kl_end"] = (kl[1], 0.0)
    for curve in summ["learned/text2grad"]["val_curves"].values():
        curve[-1]["val"] = max(p["val"] for p in curve) - decline
    return {"final": summ, "sft": {"test": {"fact_score": sft, "n_false": 1.5}},
            "config": {"iterations": 20, "batch_size": 16, "seeds": list(range(len(t2g))), "policy": "tiny"},
            "machine": "cpu"}


def test_instances_are_reported_each_and_pooled_and_their_disagreement_is_said():
    studies = {0: _instance([0.5, 0.5, 0.6, 0.5, 0.5], [0.3, 0.4, 0.3, 0.3, 0.3]),
               3: _instance([0.1, 0.2, 0.1, 0.1, 0.1], [0.3, 0.3, 0.3, 0.3, 0.3], sft=-0.28)}
    lines, numbers = msr.pooled_lines(studies, "learned")
    assert lines[0].startswith("Task instance 0 (SFT start 0.200, 1.50 false facts per summary), learned feedback: "
                               "Text2Grad ends at 0.520")
    assert "Goal met (ahead on >= 4 of 5 seeds: yes, no late decline (<= 0.02): yes, KL no larger: yes)." in lines[0]
    assert "Goal not met (ahead on >= 4 of 5 seeds: no" in lines[1] and "SFT start -0.280" in lines[1]
    assert lines[2] == ("The instances disagree: Text2Grad is ahead on average on instance(s) 0 and behind on 3, so "
                        "the conclusion depends on the task instance.")
    assert lines[3] == "The goal is met on instance(s) 0 only."
    assert lines[4].startswith("Pooled over the 2 instances (10 seed pairs, each against its instance's best scalar "
                               "baseline): +0.010 (95 % interval [")
    assert numbers["pooled"]["ahead"] == 5
    # a late decline or a larger KL fails the goal even when ahead on every seed
    late = msr.pooled_lines({0: _instance([0.5] * 5, [0.3] * 5, decline=0.05)}, "learned")[0][0]
    assert "no late decline (<= 0.02): no" in late and "Goal not met" in late
    assert "largest fall from its best validation point to its last is 0.050." in late
    # a study stored before validation curves were kept: the fall is unknown, and the goal cannot be judged
    old = _instance([0.5] * 5, [0.3] * 5)
    del old["final"]["learned/text2grad"]["val_curves"]
    unknown = msr.pooled_lines({0: old}, "learned")[0][0]
    assert "to its last is not recorded. Goal cannot be judged (ahead on >= 4 of 5 seeds: yes, no late decline " \
           "(<= 0.02): not recorded, KL no larger: yes)." in unknown
    drift = msr.pooled_lines({0: _instance([0.5] * 5, [0.3] * 5, kl=(9.0, 3.0))}, "learned")[0][0]
    assert "KL no larger: no" in drift and "Final KL 9.00 vs 3.00 nats" in drift
    agree = msr.pooled_lines({0: studies[0], 1: studies[0]}, "learned")[0]
    assert "The 2 instances agree in direction: Text2Grad is ahead on average on every one." in agree


def test_the_learned_critics_held_out_quality_is_read_from_their_training_files_and_reported(tmp_path):
    shared = tmp_path / "shared"
    assert ms.critic_quality(shared) == {}  # nothing trained there: nothing claimed
    report = shared / "text2grad_rm" / "reward_model" / "eval" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"n_examples": 16, "token_label_accuracy": 0.625, "json_validity_rate": 0.9375,
                                  "token": {"positive": {"f1": 0.43}, "negative": {"f1": 0.31}}}))
    write_jsonl(report.parent.parent / "annotations.jsonl", [{"id": i} for i in range(160)])  # held-out ones included
    quality = ms.critic_quality(shared)
    assert quality == {"generative": {"n": 16, "n_train": 144, "token_accuracy": 0.625, "good_f1": 0.43,
                                      "poor_f1": 0.31, "json_validity": 0.9375}}
    (shared / "scalar_rm").mkdir()
    (shared / "scalar_rm" / "eval_pairwise.json").write_text(json.dumps({"pairs": 52, "accuracy": 0.75}))
    (shared / "scalar_rm" / "train_results.json").write_text(json.dumps({"train_pairs": 467, "train_loss": 0.4}))
    quality = ms.critic_quality(shared)
    assert quality["bradley_terry"] == {"n": 52, "n_train": 467, "pairwise_accuracy": 0.75}
    line = msr.critic_quality_lines({"critics": quality})[1]
    assert "0.625 (F1 good 0.43, poor 0.31; 16 held-out annotations, 144 for training)" in line
    assert "valid JSON in 93.8 % of cases" in line
    assert "higher in this share of pairs: 0.750 (52 held-out pairs, 467 for training)" in line
    assert msr.critic_quality_lines({}) == []
    # the pooled table gets the two columns once any instance recorded its critics
    studies = {0: {**_instance([0.5], [0.3]), "critics": quality}, 1: _instance([0.2], [0.3])}
    md = msr.pooled_markdown(studies, {}, "cmd")
    assert ("| 0 | 0.200 | 1.50 | 0.625 (F1 good 0.43, poor 0.31; 16 held-out annotations, 144 for training) | "
            "0.750 (52 held-out pairs, 467 for training) | [task_seed0") in md
    assert "| 1 | 0.200 | 1.50 | - | - | [task_seed1/study.md]" in md


def test_the_pooled_report_and_frontier_plot_are_written(tmp_path):
    studies = {0: _instance([0.5, 0.4], [0.3, 0.3]), 1: _instance([0.2, 0.1], [0.3, 0.3])}
    pooled = {"learned": {"lines": msr.pooled_lines(studies, "learned")[0]}}
    md = msr.pooled_markdown(studies, pooled, "python benchmarks/method_study.py --task_seeds 0 1")
    assert "| 0 | 0.200 | 1.50 | [task_seed0/study.md](task_seed0/study.md) |" in md
    assert "The instances disagree" in md and "[final score vs final KL](frontier.png)" in md
    msr.frontier_plot(studies, tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 10_000


def _result(spec, val_end, test_end=None, kl=3.0):
    curve = [{"iteration": 0, "val": {"fact_score": 0.1}, **({"test": {"fact_score": 0.12, "n_false": 1.5}}
                                                                  if test_end is not None else {}), "kl": 0.0},
             {"iteration": 2, "val": {"fact_score": val_end}, **({"test": {"fact_score": test_end, "fact_recall": 0.5,
                                                                            "n_false": 1.0}} if test_end is not None else {}),
              "kl": kl}]
    out = {"spec": {**ms.asdict(spec), "run_id": spec.run_id}, "curve": curve, "final": curve[-1], "cpu": "test cpu"}
    if test_end is not None:
        out.update(early_stopped=ms.early_stopped(curve), true_label_shift={"good": {"mean": 0.1, "n": 3}})
    return out


def test_a_study_resumes_and_reports_from_committed_result_files(tmp_path):
    """Runs finished on one machine are exported (result.json only), then a fresh folder is resumed from them: the
    report-only pass trains nothing and reports each instance and the pooled comparison."""
    base = ms.Setting(1e-4, "fixed", 0.95)
    machine = tmp_path / "machine_a"
    for ts, (t2g, other) in {0: ((0.5, 0.6), (0.3, 0.3)), 1: ((0.1, 0.1), (0.3, 0.2))}.items():
        for m in ("text2grad", "scalar_sum"):
            sweep_spec = ms.RunSpec("learned", m, base, 100, "sweep")
            ms._write_json(machine / f"task_seed{ts}" / sweep_spec.run_id / "result.json", _result(sweep_spec, 0.3))
            (machine / f"task_seed{ts}" / sweep_spec.run_id / "ppo").mkdir()  # a checkpoint folder: not exported
            for seed, score in enumerate(t2g if m == "text2grad" else other):
                spec = ms.RunSpec("learned", m, base, seed, "final")
                ms._write_json(machine / f"task_seed{ts}" / spec.run_id / "result.json", _result(spec, score, score))
    committed = tmp_path / "committed"
    assert ms.copy_results(machine, committed) == 12
    assert not list(committed.rglob("ppo"))
    fresh = tmp_path / "fresh"
    argv = ["--output_dir", str(fresh), "--resume_from", str(committed), "--task_seeds", "0", "1", "--preset", "ci",
            "--arms", "learned", "--methods", "text2grad", "scalar_sum", "--seeds", "0", "1", "--sweep_knobs", "lambda",
            "--lambdas", "0.95", "--iterations", "2", "--eval_every", "2", "--phases", "report",
            "--export_to", str(committed)]
    assert ms.main(argv) == 0
    md = (fresh / "study.md").read_text()
    assert "Task instance 0 (SFT start 0.120" in md and "Task instance 1" in md and "The instances disagree" in md
    assert (committed / "study.md").read_text() == md and (committed / "task_seed1" / "study.md").is_file()
    study = json.loads((fresh / "study.json").read_text())
    assert study["instances"]["0"]["final"]["learned/text2grad"]["cpu"] == ["test cpu"]
    assert not list(fresh.rglob("ppo")) and not (fresh / "task_seed0" / "shared" / "sft").exists()  # nothing trained


def test_a_resumed_study_keeps_what_only_the_earlier_machine_recorded_and_is_checked_against_its_identity(tmp_path):
    """--resume_from brings each folder's study.json along with the runs: a report made after the resume keeps the
    critics' quality that only the earlier machine's setup measured (here the Bradley-Terry model, which the resumed
    command never trains), and a resume with other study settings is refused before anything runs."""
    base = ms.Setting(1e-4, "fixed", 0.95)
    committed = tmp_path / "committed"
    for m in ("text2grad", "scalar_sum"):
        for seed in (0, 1):
            spec = ms.RunSpec("learned", m, base, seed, "final")
            ms._write_json(committed / "task_seed0" / spec.run_id / "result.json", _result(spec, 0.3, 0.3))
    bt = {"n": 171, "n_train": 1541, "pairwise_accuracy": 0.626}
    identity = {"preset": "ci", "task_seed": 0, "iterations": 2, "eval_every": 2, "batch_size": 0, "target_kl": 6.0}
    ms._write_json(committed / "task_seed0" / "study.json", {"critics": {"bradley_terry": bt}, "identity": identity})
    argv = ["--resume_from", str(committed), "--task_seeds", "0", "--preset", "ci", "--arms", "learned", "--methods",
            "text2grad", "scalar_sum", "--seeds", "0", "1", "--sweep_knobs", "lambda", "--lambdas", "0.95",
            "--eval_every", "2", "--phases", "report"]
    assert ms.main(["--output_dir", str(tmp_path / "fresh"), "--iterations", "2", *argv]) == 0
    study = json.loads((tmp_path / "fresh" / "task_seed0" / "study.json").read_text())
    assert study["critics"]["bradley_terry"] == bt
    assert "0.626 (171 held-out pairs, 1541 for training)" in (tmp_path / "fresh" / "study.md").read_text()
    with pytest.raises(SystemExit, match="iterations: 2 there, 90 now"):
        ms.main(["--output_dir", str(tmp_path / "other"), "--iterations", "90", *argv])


def test_a_study_that_only_swept_asks_for_no_final_runs(tmp_path):
    """A sweep-only study (no final phase, no final run) reports its sweep and names no missing final runs."""
    base = ms.Setting(1e-4, "fixed", 0.95)
    out = tmp_path / "sweep_only"
    for m, val in (("text2grad", 0.3), ("scalar_sum", 0.2)):
        spec = ms.RunSpec("learned", m, base, 100, "sweep")
        ms._write_json(out / spec.run_id / "result.json", _result(spec, val))
    argv = ["--output_dir", str(out), "--preset", "ci", "--arms", "learned", "--methods", "text2grad", "scalar_sum",
            "--sweep_knobs", "lambda", "--lambdas", "0.95", "--iterations", "2", "--eval_every", "2", "--phases", "report"]
    assert ms.main(argv) == 0
    study = json.loads((out / "study.json").read_text())
    assert study["requested_final"] == {} and study["final"] == {}
    # the sweep's criterion: the mean of the last two evaluation points (0.1 at the start, 0.3 at the end)
    assert study["sweep"]["learned/text2grad"]["tried"][0]["val_end"] == pytest.approx(0.2)
    md = (out / "study.md").read_text()
    assert "Partial:" not in md and "| learned/text2grad | **lr 0.0001, KL fixed, lambda 0.95: 0.200** |" in md


def test_the_table10_reasons_follow_what_the_study_swept():
    fixed = ms.PPOConfig(model_name_or_path="m", dataset_path="d.jsonl", output_dir="o", kl_coef=0.05, adaptive_kl=False)
    rows = {r["field"]: r for r in msr.paper_comparison(fixed, knobs=("lambda", "lr"))}
    assert rows["kl_coef"]["why"] == rows["adaptive_kl"]["why"] == ("a fixed coefficient (the preset's value, not "
                                                                    "swept in this study)")
    assert "kl_horizon" not in rows  # no controller, no horizon to compare
    rows = {r["field"]: r for r in msr.paper_comparison(fixed, knobs=("lambda", "lr", "kl"))}
    assert rows["kl_coef"]["why"].startswith("chosen per method on validation")
    adaptive = ms.PPOConfig(model_name_or_path="m", dataset_path="d.jsonl", output_dir="o", adaptive_kl=True)
    rows = {r["field"]: r for r in msr.paper_comparison(adaptive)}
    assert rows["kl_horizon"]["study"] == 10 and rows["kl_horizon"]["paper"] == 10000 and not rows["kl_horizon"]["same"]
    # a stored study's rows are corrected from its own knobs (the values stay as stored)
    stored = {"config": {"sweep_knobs": ["lambda", "lr"]}, "sweep": {},
              "paper_comparison": [{"field": "kl_coef", "study": 0.05, "paper": 0.2, "same": False, "why": "swept"},
                                   {"field": "gamma", "study": 1.0, "paper": 1.0, "same": True, "why": ""}]}
    assert msr.corrected_paper_rows(stored) == [
        {"field": "kl_coef", "study": 0.05, "paper": 0.2, "same": False,
         "why": "a fixed coefficient (the preset's value, not swept in this study)"},
        {"field": "gamma", "study": 1.0, "paper": 1.0, "same": True, "why": ""}]


def test_each_defence_variant_of_text2grad_gets_its_own_comparison(tmp_path):
    studies = {0: _instance([0.5, 0.4], [0.3, 0.3]), 1: _instance([0.2, 0.1], [0.3, 0.3])}
    for st in studies.values():  # a defended Text2Grad 0.2 above the plain one on every seed
        row = json.loads(json.dumps(st["final"]["learned/text2grad"]))
        row.update(method="text2grad+ensemble", final={int(k): v + 0.2 for k, v in row["final"].items()})
        row["val_curves"] = {int(k): v for k, v in row["val_curves"].items()}
        st["final"]["learned/text2grad+ensemble"] = row
    study = ms.write_pooled_report(studies, tmp_path, "cmd")
    lines = study["pooled"]["learned"]["lines"]
    assert lines.index("Text2Grad + ensemble against the best scalar baseline:") > lines.index(
        "The instances disagree: Text2Grad is ahead on average on instance(s) 0 and behind on 1, so the conclusion "
        "depends on the task instance.")
    assert "The 2 instances agree in direction: Text2Grad + ensemble is ahead on average on every one." in lines
    assert set(study["pooled"]["learned"]["methods"]) == {"text2grad", "text2grad+ensemble"}
    # against the information-matched baseline: plain Text2Grad only, since no scalar_sum+ensemble ran
    assert set(study["pooled"]["learned"]["matched"]) == {"text2grad"}
    assert study["pooled"]["learned"]["matched"]["text2grad"]["pooled"]["ahead"] == 2  # 0.5, 0.4 vs 0.3; 0.2, 0.1 vs 0.3
    assert any(line.startswith("Pooled over the 2 instances (4 seed pairs, each against the information-matched "
                               "baseline on its instance): +0.000") for line in lines)
    assert (tmp_path / "frontier.png").is_file() and "Text2Grad + ensemble" in (tmp_path / "study.md").read_text()
    # the README row: Text2Grad per instance and pooled, the variant pooled only, one comparison per line
    for st in studies.values():
        st.update(identity={"preset": "default", "iterations": 20}, date="2026-11-28", cpu="test cpu")
    ms.write_pooled_report(studies, tmp_path, "cmd")
    result = rt.study_rows(tmp_path)[0][1].split("<br>")
    plain = next(r for r in result if r.startswith("learned critic, Text2Grad vs the best scalar baseline"))
    defended = next(r for r in result if r.startswith("learned critic, Text2Grad + ensemble vs the best scalar baseline"))
    assert "instance 0 (SFT" in plain and "instance 0" not in defended
    # seed pairs +0.4, +0.3 (instance 0) and +0.1, 0.0 (instance 1): mean +0.2, sd 0.183, t(3) 3.182 -> +-0.291
    # 0.1 + 0.2 - 0.3 is 5.6e-17 in floats: that pair is a tie, not ahead
    assert defended.endswith("each at its setting from the sweep: pooled paired difference +0.200 [-0.091, +0.491], "
                             "ahead on 3 of 4")


def test_settings_from_another_study_are_each_methods_own_else_its_methods_else_scalar_collapsed():
    table = {"learned/text2grad": {"chosen": {"lr": 3e-5, "kl": "adaptive", "lam": 0.0}},
             "learned/scalar_collapsed": {"chosen": {"lr": 3e-5, "kl": "fixed", "lam": 0.95}}}
    keys = ms.method_keys(["learned"], ["text2grad", "scalar_sum", "scalar_collapsed", "scalar_bt"], ["ensemble"])
    rows = ms.inherited_settings(table, keys)
    assert rows == {"learned/text2grad": "learned/text2grad", "learned/scalar_sum": "learned/scalar_collapsed",
                    "learned/scalar_collapsed": "learned/scalar_collapsed", "learned/scalar_bt": None,
                    "learned/text2grad+ensemble": "learned/text2grad",
                    "learned/scalar_sum+ensemble": "learned/scalar_collapsed"}
    sentence = msr.settings_from_sentence({"study": "old/study.json", "rows": rows})
    assert sentence.startswith("No sweep on this instance: settings from the sweep of old/study.json")
    assert "learned/scalar_sum from learned/scalar_collapsed" in sentence
    assert "learned/text2grad from" not in sentence  # its own row is not a borrowing
    assert sentence.endswith("the base setting for learned/scalar_bt.")


def test_settings_from_a_study_over_several_instances_give_each_instance_its_own_sweep():
    def row(lr):
        return {"chosen": {"lr": lr, "kl": "fixed", "lam": 0.95}}

    one = {"sweep": {"learned/scalar_sum": row(3e-6)}}
    assert ms.inherited_sweep(one, 2, "one/study.json") == one["sweep"]  # one sweep serves every instance
    several = {"instances": {"1": {"sweep": {"learned/scalar_sum": row(1e-5)}},
                             "2": {"sweep": {"learned/scalar_sum": row(3e-5)}}, "3": {"sweep": {}}}}
    assert ms.inherited_sweep(several, 1, "x")["learned/scalar_sum"]["chosen"]["lr"] == 1e-5
    assert ms.inherited_sweep(several, 2, "x")["learned/scalar_sum"]["chosen"]["lr"] == 3e-5
    with pytest.raises(SystemExit, match="swept task instance\\(s\\) 1, 2, not 3; sweep that instance there first"):
        ms.inherited_sweep(several, 3, "x")  # an instance whose sweep tried nothing is not a choice
    rows = {"learned/scalar_sum": "learned/scalar_sum"}
    own = msr.settings_from_sentence({"study": "t12/study.json", "rows": rows, "instance": 2})
    assert own.startswith("No sweep on this instance: settings from this instance's own sweep in t12/study.json")
    studies = {ts: _instance([0.5, 0.4], [0.3, 0.3]) for ts in (1, 2)}
    for ts, st in studies.items():
        st["settings_from"] = {"study": "t12/study.json", "rows": rows, "instance": ts}
    md = msr.pooled_markdown(studies, {"learned": {"lines": msr.pooled_lines(studies, "learned")[0]}}, "cmd")
    assert "settings from each instance's own sweep in t12/study.json" in md and "no sweep per instance" not in md


def test_a_study_that_only_swept_several_instances_reports_each_instances_choice_and_no_seeds():
    def swept(val_start, scores):
        tried = [{"setting": {"lr": lr, "kl": "fixed", "lam": 0.0}, "val_end": v} for lr, v in scores.items()]
        best = max(tried, key=lambda t: t["val_end"])
        return {"config": {"policy": "tiny", "iterations": 90, "batch_size": 16, "seeds": [0, 1], "sweep_seed": 100},
                "sft": {"val": {"fact_score": val_start, "n_false": 2.0}},
                "sweep": {"learned/text2grad": {"chosen": best["setting"], "tried": tried, "knobs": ["lr"]}}}

    studies = {1: swept(-0.004, {1e-5: 0.235, 3e-5: 0.304, 1e-4: 0.238}),
               2: swept(-0.233, {3e-5: -0.146, 1e-4: 0.104, 3e-4: -0.181})}
    md = msr.pooled_markdown(studies, {}, "cmd")
    assert "sweep only (seed 100)" in md and "seeds 0, 1" not in md and "curves.png" not in md
    assert "| 1 | -0.004 | 2.00 |" in md  # the validation start: a sweep scores no test split
    assert ("| learned/text2grad | lr 3e-05, KL fixed, lambda 0: 0.304 (3) | lr 0.0001, KL fixed, lambda 0: 0.104 (3) |"
            in md)


def test_a_sweep_row_stored_without_edges_gets_them_from_its_tried_settings():
    """The first sweep's rows (stored before `edges` were): learned Text2Grad's lr stage tried 1e-4, 3e-5 and 3e-4
    at lambda 0 with the fixed coefficient and chose 3e-5, then the adaptive controller at 3e-5 (not an lr-stage
    setting); scalar_collapsed chose 1e-4 between 3e-5 and 3e-4."""
    def tried(*settings):
        return [{"setting": {"lr": lr, "kl": kl, "lam": lam}, "val_end": 0.0} for lr, kl, lam in settings]

    table = {
        "learned/text2grad": {"chosen": {"lr": 3e-5, "kl": "adaptive", "lam": 0.0}, "knobs": ["lambda", "lr", "kl"],
                              "tried": tried((1e-4, "fixed", 0.95), (1e-4, "fixed", 0.0), (1e-4, "fixed", 1.0),
                                             (3e-5, "fixed", 0.0), (3e-4, "fixed", 0.0), (3e-5, "adaptive", 0.0))},
        "oracle/scalar_collapsed": {"chosen": {"lr": 1e-4, "kl": "fixed", "lam": 0.95}, "knobs": ["lambda", "lr", "kl"],
                                    "tried": tried((1e-4, "fixed", 0.95), (1e-4, "fixed", 0.0), (1e-4, "fixed", 1.0),
                                                   (3e-5, "fixed", 0.95), (3e-4, "fixed", 0.95))},
    }
    assert msr.sweep_edges(table["learned/text2grad"]) == {"lambda": "lowest", "lr": "lowest"}
    assert msr.sweep_edges(table["oracle/scalar_collapsed"]) == {"lambda": "interior", "lr": "interior"}
    # 0.95 chosen of {0, 0.95}: an edge of the grid, not of lambda's range, so 1.0 could still be tried
    two_lambdas = {"chosen": {"lr": 1e-4, "kl": "fixed", "lam": 0.95}, "knobs": ["lambda"],
                   "tried": tried((1e-4, "fixed", 0.95), (1e-4, "fixed", 0.0))}
    assert msr.edge_lines({"oracle/x": two_lambdas}) == ["oracle/x: the chosen lambda is the highest value tried, so "
                                                        "that choice sits at a grid edge."]
    assert msr.sweep_edges({**table["oracle/scalar_collapsed"], "edges": {"lr": "highest"}}) == {"lr": "highest"}
    lines = msr.edge_lines(table)
    assert lines == ["learned/text2grad: the chosen lambda is the lowest value tried (lambda's range is [0, 1]: its "
                     "edges cannot be passed), lr is the lowest value tried, so that choice sits at a grid edge."]
    rows = {"learned/text2grad": "learned/text2grad", "learned/scalar_sum": "learned/scalar_collapsed"}
    sentence = msr.settings_from_sentence({"study": "old/study.json", "rows": rows, "edge_lines": lines})
    assert sentence.endswith("Of the rows taken there: " + lines[0])
    interior = msr.settings_from_sentence({"study": "old/study.json", "rows": rows, "edge_lines": []})
    assert interior.endswith("Every chosen value taken from there is interior to the values it was chosen from.")


def test_a_pooled_study_gets_one_results_row_per_instance_and_the_pooled_difference(tmp_path):
    studies = {0: _instance([0.5, 0.5, 0.6], [0.3, 0.4, 0.3]), 1: _instance([0.1, 0.2, 0.1], [0.3, 0.3, 0.3], sft=-0.28)}
    for ts, st in studies.items():
        st.update(identity={"preset": "default", "task_seed": ts, "iterations": 20}, date="2026-11-27", cpu="test cpu")
    ms.write_pooled_report(studies, tmp_path / "method_study_x", "python benchmarks/method_study.py --task_seeds 0 1")
    stored = json.loads((tmp_path / "method_study_x" / "study.json").read_text())
    assert stored["identity"] == {"preset": "default", "iterations": 20} and stored["date"] == "2026-11-27"
    (what, result, machine, command), headline = rt.study_rows(tmp_path / "method_study_x")
    assert what == ("method study `method_study_x` (preset default, 20 PPO iterations, 2 task instances x 3 seeds; "
                    "each method at its setting chosen on validation)")
    assert "instance 0 (SFT 0.200): 0.533 vs scalar PPO (summed span rewards) 0.333, ahead on 3/3" in result
    assert "instance 1 (SFT -0.280): 0.133 vs scalar PPO (summed span rewards) 0.300, ahead on 0/3" in result
    # pooled over 6 seed pairs: (+0.2, +0.1, +0.3, -0.2, -0.1, -0.2) -> mean +0.017, 3 ahead
    assert "pooled paired difference +0.017" in result and "ahead on 3 of 6" in result
    assert headline == "learned: Text2Grad +0.017 vs the best scalar baseline, ahead on 3/6 seed pairs over 2 instances"
    assert machine.startswith("test cpu; 2026-11-27") and command.startswith("`python benchmarks/method_study.py")


def test_a_defended_text2grad_variant_is_never_the_baseline_in_the_results_table():
    study = _instance([0.5, 0.5], [0.3, 0.4])
    refresh = dict(study["final"]["learned/text2grad"], method="text2grad+refresh", final_mean_ci=(0.9, 0.0))
    study["final"]["learned/text2grad+refresh"] = refresh
    arm = rt.study_arm(study, "learned")
    assert arm["base_name"] == "scalar PPO (summed span rewards)" and arm["base"][0] == pytest.approx(0.35)


def test_a_study_with_borrowed_settings_says_so_and_claims_no_sweep_of_its_own():
    studies = {0: _instance([0.5, 0.4], [0.3, 0.3]), 1: _instance([0.2, 0.1], [0.3, 0.3])}
    for st in studies.values():
        st["settings_from"] = {"study": "old/study.json", "rows": {"learned/text2grad": "learned/text2grad"}}
    pooled = {"learned": {"lines": msr.pooled_lines(studies, "learned")[0]}}
    md = msr.pooled_markdown(studies, pooled, "cmd")
    assert "settings from the sweep of old/study.json (no sweep per instance)" in md
    assert "tuned on validation per instance" not in md and "Grid edges" not in md
    assert set(msr.paper_reasons(["kl", "lambda", "lr"], inherited=True).values()) == {
        "chosen per method on validation by the earlier sweep this study took its settings from"}
    assert msr.paper_reasons([])["lr"] == "the preset's value, not swept in this study"
    # what the earlier sweep did not sweep kept the preset's value there too, and the reason says so
    assert msr.paper_reasons(["lambda", "lr"], inherited=True)["kl_coef"] == (
        "a fixed coefficient (the preset's value, not swept by the earlier sweep this study took its settings from)")


def test_a_borrowed_settings_table10_reason_reads_what_the_earlier_sweep_swept(tmp_path, monkeypatch):
    earlier = tmp_path / "old" / "study.json"
    earlier.parent.mkdir()
    earlier.write_text(json.dumps({"sweep": {"oracle/text2grad": {"knobs": ["lambda", "lr"]},
                                             "oracle/dense": {"knobs": ["kl"]}}}))  # a row the study did not take
    monkeypatch.setattr(msr, "ROOT", tmp_path)
    origin = {"study": "old/study.json", "rows": {"oracle/text2grad": "oracle/text2grad", "learned/text2grad": None}}
    assert msr.inherited_knobs(origin) == ["lambda", "lr"]
    assert msr.inherited_knobs({**origin, "knobs": ["kl"]}) == ["kl"]  # stored by the study itself: that wins
    assert msr.inherited_knobs({"study": "missing/study.json", "rows": {}}) == []
    stored = {"settings_from": origin,
              "paper_comparison": [{"field": "kl_coef", "study": 0.05, "paper": 0.2, "same": False, "why": "old"},
                                   {"field": "learning_rate", "study": 1e-4, "paper": 1e-6, "same": False, "why": "old"}]}
    rows = {r["field"]: r["why"] for r in msr.corrected_paper_rows(stored)}
    assert rows["kl_coef"] == ("a fixed coefficient (the preset's value, not swept by the earlier sweep this study "
                               "took its settings from)")
    assert rows["learning_rate"].startswith("chosen per method on validation by the earlier sweep")


def test_frontier_runs_each_method_at_each_coefficient_but_not_its_chosen_one_twice():
    adaptive, fixed = ms.Setting(3e-5, "adaptive", 0.0), ms.Setting(3e-5, "fixed", 0.95)
    keys = [("learned", "text2grad"), ("learned", "scalar_sum")]
    specs = ms.frontier_specs(keys, {keys[0]: adaptive, keys[1]: fixed}, [0.1, 1.0], [0, 1], default_coef=0.1)
    tags = sorted({(s.method, s.setting.kl_tag) for s in specs})
    # scalar_sum's chosen setting is the preset's fixed 0.1: that point is its final run, not a frontier run
    assert tags == [("scalar_sum", "fixed1"), ("text2grad", "fixed0.1"), ("text2grad", "fixed1")]
    assert len(specs) == 6 and {s.phase for s in specs} == {"frontier"}
    assert all(s.setting.lr == 3e-5 for s in specs)  # learning rate and lambda stay the chosen ones
    assert {s.setting.lam for s in specs if s.method == "text2grad"} == {0.0}


def test_frontier_runs_can_be_limited_to_some_methods_and_a_misspelt_one_stops_the_study(capsys):
    keys = ms.method_keys(["learned"], ["text2grad", "scalar_sum", "scalar_collapsed", "scalar_bt"], ["refresh"])
    assert ms.frontier_keys(keys, None) == keys
    assert ms.frontier_keys(keys, ["scalar_sum", "text2grad+refresh"]) == [
        ("learned", "scalar_sum"), ("learned", "text2grad+refresh")]
    with pytest.raises(ValueError, match=r"--frontier_methods scalar_summ: not among this study's methods "
                                         r"\(text2grad, scalar_sum, scalar_collapsed, scalar_bt, text2grad\+refresh"):
        ms.frontier_keys(keys, ["scalar_summ"])
    with pytest.raises(SystemExit) as stop:  # before any setup is built
        ms.main(["--methods", "text2grad", "--frontier_methods", "scalar_sum", "--phases", "report"])
    assert stop.value.code == 2 and "--frontier_methods scalar_sum: not among" in capsys.readouterr().err


def test_a_two_knob_frontier_point_runs_only_its_method_with_both_knobs_moved(capsys):
    t2g, base = ms.Setting(1e-5, "fixed", 0.0), ms.Setting(3.3333e-6, "fixed", 0.95)
    keys = [("learned", "text2grad"), ("learned", "scalar_sum")]
    points = ms.parse_frontier_points(["text2grad:3.3333e-06:3", "text2grad:1e-5:0.1"], keys)
    assert points == [("text2grad", 3.3333e-6, 3.0, None), ("text2grad", 1e-5, 0.1, None)]
    points = ms.points_on_instance(points, 0)
    # frontier_methods may leave text2grad out of the one-knob points: a named point still runs
    specs = ms.frontier_specs(keys[1:], {keys[0]: t2g, keys[1]: base}, [1.0], [0, 1], default_coef=0.1,
                              points=points, point_keys=keys)
    got = sorted({(s.method, s.setting.lr, s.setting.kl_coef, s.setting.lam) for s in specs})
    # text2grad:1e-5:0.1 is its chosen setting (the preset's 0.1): the final run, not run twice
    assert got == [("scalar_sum", 3.3333e-6, 1.0, 0.95), ("text2grad", 3.3333e-6, 3.0, 0.0)]
    assert len(specs) == 4 and {s.phase for s in specs} == {"frontier"}
    not_run = ms.runs_not_finished([s for s in specs if s.method == "text2grad"], 0.1, {keys[0]: t2g})
    assert not_run == {"learned/text2grad": {"fixed 3, lr 3.33e-06": [0, 1]}}
    results = {spec: _result(spec, 0.3, 0.4, kl=0.02) for spec in specs}
    results.update({spec: _result(spec, 0.3, 0.45, kl=0.9) for spec in
                    (ms.RunSpec("learned", "text2grad", t2g, seed, "final") for seed in (0, 1))})
    frontier = msr.summarize_frontier(results, default_coef=0.1)
    assert [(p["kl_setting"], p["chosen"]) for p in frontier["learned/text2grad"]] == [
        ("fixed 3, lr 3.33e-06", False), ("fixed 0.1", True)]
    # what each point's summaries say at the end, for the score's split into recall and false facts
    assert frontier["learned/text2grad"][0]["recall_false"] == pytest.approx([0.5, 1.0])
    assert msr.fixed_coefficient("fixed 3, lr 3.33e-06") == 3.0
    # a larger step at a stronger penalty is not "the larger step alone": the baseline's sentence reads the latter
    base_points = [{"kl_setting": "fixed 0.1", "chosen": True, "lr": 1e-5},
                   {"kl_setting": "fixed 1, lr 3e-05", "chosen": False, "lr": 3e-5},
                   {"kl_setting": "fixed 0.1, lr 2e-05", "chosen": False, "lr": 2e-5}]
    assert msr.larger_step(base_points)[1]["kl_setting"] == "fixed 0.1, lr 2e-05"
    assert msr.larger_step(base_points[:2]) is None
    # at the chosen coefficient a point is the learning-rate frontier's run itself (one run id, not two runs)
    [same] = {s.setting for s in ms.frontier_specs([], {keys[0]: t2g}, [], [0], 0.1, points=[("text2grad", 3e-6, 0.1)],
                                                    point_keys=keys[:1])}
    assert same == replace(t2g, lr=3e-6) and ms.frontier_specs(keys[:1], {keys[0]: t2g}, [], [0], 0.1, lrs=[3e-6])[0].setting == same
    for bad, why in (("text2grad:3e-6", "expected METHOD:LR:COEF with two numbers"),
                     ("text2grad:fast:3", "expected METHOD:LR:COEF with two numbers"),
                     ("scalar_summ:3e-6:3", "'scalar_summ' is not among this study's methods (text2grad, scalar_sum)"),
                     ("text2grad:0:3", "the learning rate must be > 0"),
                     ("text2grad:3e-6:3@two", "after '@' expected task instances separated by commas"),
                     ("text2grad:3e-6:3@1,5", "task instance(s) 5 not among this study's (0, 1, 2); name them in "
                                              "--task_seeds")):
        with pytest.raises(ValueError, match=re.escape(f"--frontier_points {bad}: {why}")):
            ms.parse_frontier_points([bad], keys, [0, 1, 2])
    with pytest.raises(SystemExit) as stop:  # before any setup is built
        ms.main(["--methods", "text2grad", "--frontier_points", "scalar_sum:1e-5:1", "--phases", "report"])
    assert stop.value.code == 2 and "--frontier_points scalar_sum:1e-5:1: 'scalar_sum' is not among" in capsys.readouterr().err


def test_a_frontier_point_named_for_some_task_instances_runs_and_is_reported_only_there():
    keys = [("learned", "text2grad"), ("learned", "scalar_sum")]
    points = ms.parse_frontier_points(["text2grad:3e-4:0.1@2", "scalar_sum:1e-4:0.1@0,2", "text2grad:1e-5:0.03"],
                                      keys, [0, 1, 2])
    assert points[0] == ("text2grad", 3e-4, 0.1, (2,)) and points[1][3] == (0, 2) and points[2][3] is None
    assert ms.points_on_instance(points, 1) == [("text2grad", 1e-5, 0.03)]
    assert ms.points_on_instance(points, 2) == [("text2grad", 3e-4, 0.1), ("scalar_sum", 1e-4, 0.1),
                                                ("text2grad", 1e-5, 0.03)]
    chosen = {keys[0]: ms.Setting(1e-4, "fixed", 0.0), keys[1]: ms.Setting(3e-5, "fixed", 0.95)}
    on = {ts: {(s.method, s.setting.lr, s.setting.kl_coef) for s in
               ms.frontier_specs([], chosen, [], [0], 0.1, points=ms.points_on_instance(points, ts), point_keys=keys)}
          for ts in (0, 1, 2)}
    assert on[1] == {("text2grad", 1e-5, 0.03)}
    # at the preset's coefficient the point is the learning-rate frontier's run (its coefficient left at the default)
    assert ("text2grad", 3e-4, None) in on[2] and ("scalar_sum", 1e-4, None) in on[2]
    assert on[0] == {("scalar_sum", 1e-4, None), ("text2grad", 1e-5, 0.03)}
    # a single-instance study accepts its own --task_seed only
    with pytest.raises(ValueError, match=r"task instance\(s\) 2 not among this study's \(0\)"):
        ms.parse_frontier_points(["text2grad:3e-4:0.1@2"], keys, [0])


def test_a_frontier_point_named_with_its_arm_runs_and_is_reported_in_that_arm_only():
    keys = [("learned", "text2grad"), ("learned", "scalar_sum"), ("oracle", "text2grad"), ("oracle", "scalar_sum")]
    chosen = {k: ms.Setting(1e-4, "fixed", 0.95, kl_coef=0.3) for k in keys}
    points = ms.parse_frontier_points(["learned/scalar_sum:1e-4:3", "text2grad:1e-4:3"], keys, [0])
    specs = ms.frontier_specs([], chosen, [], [0, 1], 0.1, points=ms.points_on_instance(points, 0), point_keys=keys)
    assert sorted({(s.arm, s.method, s.setting.kl_coef) for s in specs}) == [
        ("learned", "scalar_sum", 3.0), ("learned", "text2grad", 3.0), ("oracle", "text2grad", 3.0)]
    # the oracle arm's scalar_sum is neither run nor listed as missing
    not_run = ms.runs_not_finished(specs, 0.1, chosen)
    assert set(not_run) == {"learned/scalar_sum", "learned/text2grad", "oracle/text2grad"}
    with pytest.raises(ValueError, match=re.escape("'oracle/scalar_bt' is not among this study's arm/method pairs "
                                                   "(learned/text2grad, learned/scalar_sum, oracle/text2grad, "
                                                   "oracle/scalar_sum); name the arm in --arms")):
        ms.parse_frontier_points(["oracle/scalar_bt:1e-4:3"], keys, [0])


def test_the_learning_rate_frontier_runs_other_step_sizes_at_the_chosen_kl_and_labels_its_points():
    t2g, base = ms.Setting(1e-5, "fixed", 0.0), ms.Setting(3.3333e-6, "fixed", 0.95)
    keys = [("learned", "text2grad"), ("learned", "scalar_sum")]
    specs = ms.frontier_specs(keys, {keys[0]: t2g, keys[1]: base}, [], [0, 1], default_coef=0.1, lrs=[3.3333e-6, 1e-5])
    # each method at the other's learning rate only (its own is its final run), KL setting and lambda kept
    assert sorted({(s.method, s.setting.lr, s.setting.kl, s.setting.lam) for s in specs}) == [
        ("scalar_sum", 1e-5, "fixed", 0.95), ("text2grad", 3.3333e-6, "fixed", 0.0)]
    assert len(specs) == 4 and {s.phase for s in specs} == {"frontier"}
    results = {}
    for spec in [*specs, *(ms.RunSpec(a, m, st, seed, "final") for (a, m), st in zip(keys, (t2g, base)) for seed in (0, 1))]:
        kl = 0.9 if spec.setting.lr == 1e-5 else 0.03
        results[spec] = _result(spec, 0.3, 0.35 if spec.method == "scalar_sum" else 0.4, kl=kl)
    frontier = msr.summarize_frontier(results, default_coef=0.1)
    assert [(p["kl_setting"], p["chosen"], p["kl_end"][0]) for p in frontier["learned/scalar_sum"]] == [
        ("fixed 0.1", True, 0.03), ("fixed 0.1, lr 1e-05", False, 0.9)]
    assert [p["kl_setting"] for p in frontier["learned/text2grad"]] == ["fixed 0.1, lr 3.33e-06", "fixed 0.1"]
    assert msr.fixed_coefficient("fixed 0.1, lr 1e-05") == 0.1 and msr.fixed_coefficient("adaptive") is None
    # a point at another learning rate is not a looser penalty, but a larger step the report describes
    assert msr.looser_penalty(frontier["learned/scalar_sum"]) is None
    chosen, fast = msr.larger_step(frontier["learned/scalar_sum"])
    assert (chosen["lr"], fast["lr"]) == (3.3333e-6, 1e-5)
    assert msr.larger_step(frontier["learned/text2grad"]) is None  # its other point is a smaller step
    assert msr.larger_step_sentence(chosen, fast) == (
        "Given a larger learning rate (1e-05 instead of 3.33e-06, 2 seeds), the baseline ends at 0.90 nats with "
        "0.350 ± 0.000: it moves 0.87 nats further from the start policy, and its score changes by +0.000.")
    # held to scalar_sum's 0.03 nats, Text2Grad's smaller step is the setting within it
    study = {"kl_frontier": frontier, "sft": {"test": {"fact_score": 0.3}},
             "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.35, 0.0),
                                              "kl_end": (0.03, 0.0), "final": {0: 0.35, 1: 0.35}}}}
    c = msr.kl_matched(study, "learned", "text2grad", "scalar_sum")
    assert c["point"]["kl_setting"] == "fixed 0.1, lr 3.33e-06" and c["pair"]["diffs"] == pytest.approx([0.05, 0.05])
    assert msr.kl_matched_lines({0: study}, "learned", "text2grad", "scalar_sum")[0][1].endswith(
        "Given a larger learning rate (1e-05 instead of 3.33e-06, 2 seeds), the baseline ends at 0.90 nats with "
        "0.350 ± 0.000: it moves 0.87 nats further from the start policy, and its score changes by +0.000.")


def test_text2grad_is_held_to_the_baselines_kl_on_a_setting_chosen_on_validation(tmp_path):
    """Result files of final and frontier runs on two instances: on instance 0 two Text2Grad settings stay within
    the baseline's KL and the one better on VALIDATION is compared (not the one better on test); on instance 1 none
    does, and the report says so."""
    chosen = ms.Setting(1e-4, "fixed", 0.95)
    runs = {  # (method, KL coefficient or None for the chosen setting): (final KL, validation end, test per seed)
        0: {("text2grad", None): (3.0, 0.6, (0.6, 0.7)), ("text2grad", 0.3): (1.5, 0.4, (0.45, 0.5)),
            ("text2grad", 1.0): (0.5, 0.3, (0.8, 0.8)), ("scalar_sum", None): (1.6, 0.3, (0.3, 0.3))},
        1: {("text2grad", None): (3.0, 0.6, (0.6, 0.7)), ("text2grad", 0.3): (2.5, 0.4, (0.45, 0.5)),
            ("text2grad", 1.0): (2.0, 0.3, (0.1, 0.2)), ("scalar_sum", None): (1.6, 0.3, (0.3, 0.3))},
    }
    for ts, rows in runs.items():
        for (method, coef), (kl, val, tests) in rows.items():
            for seed, test in enumerate(tests):
                spec = (ms.RunSpec("learned", method, chosen, seed, "final") if coef is None else
                        ms.RunSpec("learned", method, replace(chosen, kl_coef=coef), seed, "frontier"))
                ms._write_json(tmp_path / f"task_seed{ts}" / spec.run_id / "result.json",
                               _result(spec, 2 * val - 0.1, test, kl=kl))  # end_score: mean of start 0.1 and val_end
    argv = ["--output_dir", str(tmp_path), "--task_seeds", "0", "1", "--preset", "ci", "--arms", "learned",
            "--methods", "text2grad", "scalar_sum", "--seeds", "0", "1", "--sweep_knobs", "lambda", "--lambdas", "0.95",
            "--iterations", "2", "--eval_every", "2", "--kl_frontier", "0.3", "1.0", "--phases", "report"]
    assert ms.main(argv) == 0
    inst0 = json.loads((tmp_path / "task_seed0" / "study.json").read_text())
    points = inst0["kl_frontier"]["learned/text2grad"]
    assert [p["kl_setting"] for p in points] == ["fixed 1", "fixed 0.3", "fixed 0.05"]  # by final KL; 0.05: ci preset's
    assert [p["chosen"] for p in points] == [False, False, True]
    assert points[1]["val_end_mean"] == pytest.approx(0.4)
    md0 = (tmp_path / "task_seed0" / "study.md").read_text()
    assert "| learned | Text2Grad (span rewards) | fixed 0.05 (chosen) | 0.650 ± " in md0
    assert ("Task instance 0: KL fixed 0.3 ends at 0.475 ± 0.318 with KL 1.50 nats, the baseline (scalar PPO, Text2Grad's "
            "token rewards summed, KL fixed 0.05) at 0.300 ± 0.000 with 1.60, the start policy at 0.120; paired difference +0.175 (95 % interval [-0.143, +0.493]; ahead "
            "on 2 of 2; exact two-sided sign test p = 0.5). Largest fall from its best validation point to its last: "
            "0.000. Goal met (ahead on >= 2 of 2 seeds: yes, no late decline (<= 0.02): yes, KL no larger: yes).") in md0
    pooled_md = (tmp_path / "study.md").read_text()
    assert ("Task instance 1: none of the 3 KL settings tried stays within the baseline's (scalar PPO, Text2Grad's token "
            "rewards summed, KL fixed 0.05) 1.60 nats; the lowest, fixed 1, ends at 2.00 nats with 0.150 ± 0.635.") in pooled_md
    assert "On instance(s) 1 no Text2Grad setting tried stays within the baseline's KL" in pooled_md
    pooled = json.loads((tmp_path / "study.json").read_text())
    assert pooled["pooled"]["learned"]["kl_matched"]["text2grad"]["pooled"]["n"] == 2
    assert pooled["instances"]["1"]["kl_frontier"]["learned/scalar_sum"][0]["kl_setting"] == "fixed 0.05"
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
    (_, result, _, _), headline = rt.study_rows(tmp_path)
    assert ("learned critic, Text2Grad held to the KL of the best scalar baseline: a setting within it on instance(s) 0 "
            "of 2, paired difference there +0.175 [-0.143, +0.493], ahead on 2 of 2; the study's goal met on 1 of 2 "
            "instances") in result
    # scalar_sum is also the information-matched baseline here: the same comparison, said once for each
    assert "learned critic, Text2Grad held to the KL of the information-matched baseline: a setting within it" in result
    assert "learned: Text2Grad held to scalar_sum's KL +0.175, ahead on 2/2 seed pairs on 1 instance" in headline
    assert ("Text2Grad held to the KL of the information-matched baseline (scalar PPO, Text2Grad's token rewards "
            "summed) (the baseline at the KL setting its own validation score picks; Text2Grad's chosen on validation") in pooled_md
    # Unconstrained, each method at the KL setting ITS validation score picks: Text2Grad's chosen setting (validation
    # 0.6; fixed 1 is better on test, 0.8, but not on validation), against scalar_sum's only setting.
    assert ("Task instance 0: Text2Grad at KL fixed 0.05 (of 3 settings; validation 0.600) ends at 0.650 ± 0.635 with "
            "KL 3.00 nats; scalar PPO, Text2Grad's token rewards summed at KL fixed 0.05 at 0.300 ± 0.000 with 1.60; "
            "paired difference +0.350") in pooled_md
    assert ("Goal not met (ahead on >= 2 of 2 seeds: yes, no late decline (<= 0.02): yes, KL no larger: no)."
            in pooled_md)
    assert "Pooled over the 2 instances (4 seed pairs): +0.350" in pooled_md
    assert "The goal is met on none of the 2 instances." in pooled_md
    # the information-matched comparisons lead the results row and the headline
    assert result.index("information-matched baseline, each at the KL setting") < result.index("best scalar baseline")
    assert headline.startswith("learned: Text2Grad vs scalar_sum, KL chosen on validation, +0.350, ahead on 4/4 seed "
                               "pairs; learned: Text2Grad held to scalar_sum's KL +0.175")


def test_the_pooled_report_and_results_row_hold_a_defended_text2grad_to_the_same_defence_baseline(tmp_path):
    """Result files of Text2Grad + refresh (its chosen setting and a tighter KL) and of scalar_sum with and without
    the refresh, on two instances: the report holds the defended Text2Grad to the KL of scalar_sum + refresh as well
    as of scalar_sum, and the results row carries that comparison."""
    chosen = ms.Setting(1e-4, "fixed", 0.95)
    runs = {  # (method, KL coefficient or None for the chosen setting): (final KL, validation end, test per seed)
        ("text2grad", None): (3.0, 0.6, (0.6, 0.7)), ("text2grad", 1.0): (2.0, 0.3, (0.2, 0.2)),
        ("text2grad+refresh", None): (3.0, 0.6, (0.6, 0.7)), ("text2grad+refresh", 1.0): (0.4, 0.3, (0.36, 0.25)),
        ("scalar_sum", None): (1.6, 0.3, (0.3, 0.3)), ("scalar_sum+refresh", None): (0.5, 0.3, (0.32, 0.28)),
    }
    for ts in (0, 1):
        for (method, coef), (kl, val, tests) in runs.items():
            for seed, test in enumerate(tests):
                spec = (ms.RunSpec("learned", method, chosen, seed, "final") if coef is None else
                        ms.RunSpec("learned", method, replace(chosen, kl_coef=coef), seed, "frontier"))
                ms._write_json(tmp_path / f"task_seed{ts}" / spec.run_id / "result.json",
                               _result(spec, 2 * val - 0.1, test, kl=kl))
    argv = ["--output_dir", str(tmp_path), "--task_seeds", "0", "1", "--preset", "ci", "--arms", "learned",
            "--methods", "text2grad", "scalar_sum", "--variants", "refresh", "--seeds", "0", "1", "--sweep_knobs",
            "lambda", "--lambdas", "0.95", "--iterations", "2", "--eval_every", "2", "--kl_frontier", "1.0",
            "--phases", "report"]
    assert ms.main(argv) == 0
    pooled_md = (tmp_path / "study.md").read_text()
    # within scalar_sum + refresh's 0.50 nats only fixed 1 (0.40 nats): +0.04 and -0.03 on the two seeds
    assert ("Text2Grad + refresh held to the KL of the information-matched baseline with the same defence (scalar PPO, "
            "Text2Grad's token rewards summed + refresh)") in pooled_md
    assert ("Task instance 0: KL fixed 1 ends at 0.305 ± 0.699 with KL 0.40 nats, the baseline (scalar PPO, Text2Grad's "
            "token rewards summed + refresh, KL fixed 0.05) at 0.300 ± 0.254 with 0.50") in pooled_md
    numbers = json.loads((tmp_path / "study.json").read_text())["pooled"]["learned"]
    pair = numbers["kl_matched_scalar_sum+refresh"]["text2grad+refresh"]["instances"]["0"]["pair"]
    assert pair["diffs"] == pytest.approx([0.04, -0.03])
    # undefended Text2Grad has no defence to match: no such comparison for it
    assert "text2grad" not in numbers["kl_matched_scalar_sum+refresh"]
    (_, result, _, _), headline = rt.study_rows(tmp_path)
    assert ("learned critic, Text2Grad + refresh held to the KL of the information-matched baseline with the same "
            "defence: a setting within it on instance(s) 0, 1 of 2, paired difference there +0.005") in result
    assert "learned: Text2Grad + refresh held to scalar_sum+refresh's KL +0.005, ahead on 2/4 seed pairs" in headline


def _point(label, seeds, val, final, kl, fall=0.0):
    return {"kl_setting": label, "seeds": seeds, "val_end_mean": val, "final": dict(zip(seeds, final)),
            "final_mean_ci": (sum(final) / len(final), 0.0), "kl_end": (kl, 0.0), "val_fall": {s: fall for s in seeds}}


def test_the_validation_pick_compares_settings_on_the_same_seeds_and_checks_the_late_decline():
    one_seed = _point("fixed 0.1", [0], 0.9, [0.9], 1.0)  # best on validation, but run on one seed of three
    adaptive = _point("adaptive", [0, 1, 2], 0.5, [0.5, 0.6, 0.4], 4.0, fall=0.05)
    fixed = _point("fixed 1", [0, 1, 2], 0.4, [0.45, 0.45, 0.45], 0.5)
    assert msr.validation_pick([one_seed, adaptive, fixed]) is adaptive
    study = {"kl_frontier": {"learned/text2grad": [one_seed, adaptive, fixed],
                             "learned/scalar_sum": [_point("fixed 0.1", [0, 1, 2], 0.3, [0.3, 0.3, 0.5], 2.0)]},
             "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.37, 0.0)}}}
    c = msr.kl_on_validation(study, "learned", "text2grad", "scalar_sum")
    assert c["point"] is adaptive and c["pair"]["diffs"] == pytest.approx([0.2, 0.3, -0.1])
    # ahead on 2 of 3 < ceil(0.8 * 3); a 0.05 fall from its best validation point; KL 4.0 > 2.0
    assert (c["ahead_goal"], c["no_late_decline"], c["kl_goal"]) == (False, False, False)
    assert msr.kl_on_validation({**study, "kl_frontier": {"learned/text2grad": [fixed]}}, "learned", "text2grad") is None


def test_a_validation_pick_at_the_edge_of_the_grid_is_named_with_the_knob_and_the_side():
    def point(label, lr):
        return {**_point(label, [0], 0.5, [0.5], 1.0), "lr": lr}

    low, mid, high = point("fixed 0.1, lr 3.33e-06", 3.33e-6), point("fixed 0.1", 1e-5), point("fixed 0.1, lr 3e-05", 3e-5)
    tight, loose = point("fixed 1", 1e-5), point("fixed 0.3, lr 3e-05", 3e-5)
    grid = [low, mid, high, tight, loose]
    assert msr.pick_edges(mid, grid) == ["the weakest fixed KL penalty tried"]
    assert msr.pick_edges(loose, grid) == ["the largest learning rate tried"]  # 0.3 lies between 0.1 and 1
    assert msr.pick_edges(high, grid) == ["the largest learning rate tried", "the weakest fixed KL penalty tried"]
    assert msr.pick_edges(low, grid) == ["the smallest learning rate tried", "the weakest fixed KL penalty tried"]
    assert msr.pick_edges(tight, grid) == ["the strongest fixed KL penalty tried"]
    assert msr.pick_edges(mid, [mid]) == []  # one point: no grid to be at the edge of
    # no penalty at all is the end of the KL axis: nothing weaker can be tried, so it is no edge of the grid
    unpenalized = point("fixed 0", 1e-5)
    assert msr.pick_edges(unpenalized, [unpenalized, mid, tight]) == []
    assert msr.pick_edges(point("fixed 0, lr 3e-05", 3e-5), [unpenalized, mid, high]) == [
        "the largest learning rate tried"]
    # the adaptive controller has no coefficient to sit at an edge of; its learning rate still does
    assert msr.pick_edges(point("adaptive", 1e-5), [point("adaptive", 1e-5), tight, loose]) == [
        "the smallest learning rate tried"]
    assert msr.edge_words("Text2Grad", ["the largest learning rate tried"]) == (
        " Text2Grad's pick is at the largest learning rate tried: the grid does not bracket it.")
    assert msr.edge_words("the baseline", []) == ""
    # at the smallest step, where that edge leads: a learning rate of 0 leaves the start policy where it is
    low_run = {**low, "final_mean_ci": (0.25, 0.01), "kl_end": (0.004, 0.001)}
    assert msr.edge_words("the baseline", ["the smallest learning rate tried"], low_run, mid, start=0.26) == (
        " The baseline's pick is at the smallest learning rate tried: the grid does not bracket it; the next-best "
        "setting tried (fixed 0.1) is 0.000 below it on validation. Smaller steps tend to the start policy (a "
        "learning rate of 0 never moves it; 0.260 on test): this pick ends -0.010 from it, at KL 0.00 nats.")
    # the other edges lead nowhere known, and without the start policy's score there is nothing to add
    assert "start policy" not in msr.edge_words("Text2Grad", ["the largest learning rate tried"], low_run, mid, 0.26)
    assert "start policy" not in msr.edge_words("X", ["the smallest learning rate tried"], low_run, mid)
    # the runner-up is the best other setting run on as many seeds (a one-seed point does not compete)
    one_seed = {**point("fixed 0.3", 1e-5), "seeds": [0, 1], "val_end_mean": 0.9}
    second = {**point("fixed 1", 1e-5), "val_end_mean": 0.6}  # above low's 0.5
    assert msr.runner_up(mid, [mid, one_seed, second, low]) is second
    assert msr.runner_up(mid, [mid, one_seed]) is None


def test_the_validation_pick_sentence_says_when_a_pick_sits_at_a_grid_edge():
    def point(label, lr, val, final, kl):
        return {**_point(label, [0, 1, 2], val, final, kl), "lr": lr}

    study = {"kl_frontier": {
        "learned/text2grad": [point("fixed 0.1", 1e-5, 0.4, [0.4] * 3, 1.0),
                              point("fixed 0.1, lr 3e-05", 3e-5, 0.5, [0.5] * 3, 2.0)],
        "learned/scalar_sum": [point("fixed 0.1", 1e-5, 0.3, [0.3] * 3, 0.1),
                               point("fixed 0.1, lr 3e-05", 3e-5, 0.2, [0.2] * 3, 0.3),
                               point("fixed 0.1, lr 3.33e-06", 3.33e-6, 0.1, [0.1] * 3, 0.0)]},
        "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.3, 0.0)}}}
    lines, _ = msr.kl_on_validation_lines({0: study}, "learned", "text2grad", "scalar_sum")
    # the runner-up on validation (fixed 0.1 at 0.4) says how much the edge is worth
    assert lines[1].endswith("Text2Grad's pick is at the largest learning rate tried: the grid does not bracket it; "
                             "the next-best setting tried (fixed 0.1) is 0.100 below it on validation.")
    assert "The baseline's pick" not in lines[1]  # 1e-5 lies between 3.33e-6 and 3e-5


def test_a_validation_picks_lead_is_split_into_recall_and_false_facts_and_saying_less_is_named():
    """Fact score = recall - false facts / 5, so a lead splits exactly; one won by dropping correct facts along with
    the false ones (recall below the baseline's and the start policy's) is said to be so."""
    quiet = {**_point("fixed 0.01", [0, 1], 0.0, [-0.07, -0.07], 20.0), "recall_false": [0.05, 0.6]}
    base = {**_point("fixed 0.1", [0, 1], -0.3, [-0.34, -0.34], 0.1), "recall_false": [0.24, 2.9]}
    w = msr.score_sources(quiet, base, (0.242, 2.94))
    # (0.05 - 0.6/5) - (0.24 - 2.9/5) = -0.07 + 0.34; recall -0.19, false facts (2.9 - 0.6)/5
    assert (w["score"], w["recall"], w["false_facts"]) == pytest.approx((0.27, -0.19, 0.46))
    assert w["recall"] + w["false_facts"] == pytest.approx(w["score"])
    text = msr.where_words("Text2Grad", w)
    assert "Text2Grad states 0.050 of the 5 facts correctly with 0.60 false facts each" in text
    assert "Of the difference in mean score (+0.270), recall gives -0.190 and false facts +0.460." in text
    assert "Text2Grad is ahead only through fewer false facts" in text
    assert text.endswith("Text2Grad's pick states fewer correct facts than the start policy.")
    # a lead that states more correct facts than both: neither remark
    full = msr.where_words("Text2Grad", msr.score_sources({**quiet, "recall_false": [0.6, 0.5]}, base, (0.242, 2.94)))
    assert "only through" not in full and "than the start policy" not in full
    # a study summarised before recall was recorded per point: no sentence
    assert msr.score_sources(_point("fixed 0.1", [0], 0.0, [0.0], 1.0), base, (0.2, 1.0)) is None
    study = {"kl_frontier": {"learned/text2grad": [quiet, {**quiet, "kl_setting": "fixed 0.1", "val_end_mean": -0.5}],
                             "learned/scalar_sum": [base]},
             "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (-0.34, 0.0)}},
             "sft": {"test": {"fact_score": -0.346, "fact_recall": 0.242, "n_false": 2.94}}}
    lines, _ = msr.kl_on_validation_lines({2: study}, "learned", "text2grad", "scalar_sum")
    assert lines[2].startswith("Task instance 2, what the picks' test summaries say: Text2Grad states 0.050")
    assert "the start policy 0.242 with 2.94" in lines[2]
    # the headline's record of it for a one-instance study: the pair, the split, and the best scalar baseline's pick
    headline = msr.matched_on_validation(study)["learned/text2grad"]
    assert headline["point"] is quiet and headline["score_sources"]["false_facts"] == pytest.approx(0.46)
    assert headline["best"] == ("learned/scalar_sum", pytest.approx(-0.34))
    assert msr.matched_on_validation({**study, "kl_frontier": {}}) == {}
    # two instances: the split is averaged, and where the pick states fewer correct facts is listed
    fuller = {**study, "kl_frontier": {**study["kl_frontier"], "learned/text2grad": [
        {**quiet, "recall_false": [0.3, 0.6]}, {**quiet, "kl_setting": "fixed 0.1", "val_end_mean": -0.5}]}}
    lines, _ = msr.kl_on_validation_lines({2: study, 5: fuller}, "learned", "text2grad", "scalar_sum")
    # instance 5: recall +0.06, false facts +0.46
    assert lines[-1] == ("Over the 2 instances, recall gives -0.065 of the mean score difference and false facts +0.460; "
                         "Text2Grad's pick states fewer correct facts than the baseline's on instance(s) 2.")


def test_held_to_a_baselines_kl_text2grad_is_chosen_among_its_settings_run_on_the_most_seeds():
    """A setting run on two seeds of five, best on validation and within the baseline's KL, is not picked over one
    run on all five: its paired difference would be measured on a different, smaller sample."""
    five = [0, 1, 2, 3, 4]
    two_seeds = _point("fixed 3", [0, 1], 0.50, [0.50, 0.50], 0.01)
    all_seeds = _point("fixed 1", five, 0.40, [0.41] * 5, 0.02)
    loose = _point("fixed 0.1", five, 0.60, [0.60] * 5, 1.00)
    base = _point("fixed 0.1", five, 0.30, [0.30] * 5, 0.05)
    study = {"kl_frontier": {"learned/text2grad": [loose, two_seeds, all_seeds],
                             "learned/scalar_sum": [base, _point("fixed 0.1, lr 1e-05", five, 0.3, [0.35] * 5, 0.5)]},
             "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.30, 0.0),
                                              "kl_end": (0.05, 0.0), "final": dict.fromkeys(five, 0.30)}},
             "sft": {"test": {"fact_score": 0.2}}}
    c = msr.kl_matched(study, "learned", "text2grad", "scalar_sum")
    assert c["point"] is all_seeds and c["pair"]["n"] == 5 and c["pair"]["diffs"] == pytest.approx([0.11] * 5)
    rows = msr.frontier_dominance(study, "learned", "text2grad", "scalar_sum")["rows"]
    assert [r["point"] for r in rows] == [all_seeds, all_seeds]
    # with only the two-seed setting within the budget, it is the one compared (on its two seeds)
    study["kl_frontier"]["learned/text2grad"] = [loose, two_seeds]
    assert msr.kl_matched(study, "learned", "text2grad", "scalar_sum")["pair"]["n"] == 2


def test_held_to_a_baseline_that_a_looser_penalty_does_not_move_the_report_says_the_penalty_did_not_hold_it():
    def chosen(point):
        return {**point, "chosen": True}

    text2grad = [chosen(_point("fixed 0.1", [0, 1], 0.40, [0.42, 0.41], 0.92)), _point("fixed 1", [0, 1], 0.33, [0.36, 0.35], 0.14)]
    base_chosen = chosen(_point("fixed 0.1", [0, 1], 0.30, [0.35, 0.35], 0.04))  # also its validation pick
    base_looser = _point("fixed 0.05", [0, 1], 0.29, [0.34, 0.36], 0.02)
    study = {"kl_frontier": {"learned/text2grad": text2grad, "learned/scalar_sum": [base_looser, base_chosen]},
             "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.35, 0.0),
                                              "kl_end": (0.04, 0.0), "final": {0: 0.35, 1: 0.35}}},
             "sft": {"test": {"fact_score": 0.34}}}
    assert msr.looser_penalty(study["kl_frontier"]["learned/scalar_sum"]) == (base_chosen, base_looser)
    assert msr.looser_penalty([base_looser]) is None  # no chosen point among them
    assert msr.looser_penalty([chosen(_point("adaptive", [0], 0.3, [0.3], 0.1)), base_looser]) is None
    lines, _ = msr.kl_matched_lines({0: study}, "learned", "text2grad", "scalar_sum")
    assert lines[1] == ("Task instance 0: none of the 2 KL settings tried stays within the baseline's (scalar PPO, "
                        "Text2Grad's token rewards summed, KL fixed 0.1) 0.04 nats; the lowest, fixed 1, ends at 0.14 nats "
                        "with 0.355 ± 0.000. Given a looser penalty (fixed 0.05, 2 seeds), the baseline ends at 0.02 "
                        "nats with 0.350 ± 0.000 (at fixed 0.1, the setting it is held at: 0.04 nats, 0.350 ± 0.000): "
                        "the penalty is not what holds it near the start policy.")
    # a baseline that the looser penalty does move: how far, and what it gained
    moved = {**base_looser, "kl_end": (0.60, 0.0), "final_mean_ci": (0.38, 0.0)}
    assert msr.looser_penalty_sentence(base_chosen, moved).endswith(
        "it moves 0.56 nats further from the start policy, and its score changes by +0.030.")


def test_held_to_a_baseline_that_never_left_its_start_the_report_says_the_kl_condition_leaves_no_room():
    """A baseline whose mean final KL is at or below 0 (here -0.01 nats, 0.002 below the start policy) has not moved:
    no Text2Grad setting that learns can stay within it, and the report says that instead of calling the comparison
    open; an instance whose baseline did move (0.04 nats) is still called open."""
    text2grad = [_point("fixed 0.1", [0, 1], 0.40, [0.42, 0.41], 0.92), _point("fixed 1", [0, 1], 0.33, [0.36, 0.35], 0.14)]

    def study(base_kl):
        base = {**_point("fixed 0.1", [0, 1], 0.30, [0.338, 0.338], base_kl), "chosen": True}
        return {"kl_frontier": {"learned/text2grad": text2grad, "learned/scalar_sum": [base]},
                "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.338, 0.0),
                                                 "kl_end": (base_kl, 0.0), "final": {0: 0.338, 1: 0.338}}},
                "sft": {"test": {"fact_score": 0.34}}}

    lines, numbers = msr.kl_matched_lines({0: study(-0.01), 1: study(0.04)}, "learned", "text2grad", "scalar_sum")
    assert [c["point"] for c in numbers["instances"].values()] == [None, None]
    assert lines[1].endswith("-0.01 nats; the lowest, fixed 1, ends at 0.14 nats with 0.355 ± 0.000. That is at or "
                             "below 0, the start policy's own value: the baseline's policy has not measurably moved (it "
                             "ends -0.002 from the start policy's 0.340), so only a setting that does not learn could "
                             "stay within it.")
    assert "start policy's own value" not in lines[2]
    assert lines[3:] == [
        "On instance(s) 1 no Text2Grad setting tried stays within the baseline's KL, so there the comparison at matched "
        "KL is still open.",
        "On instance(s) 0 the baseline's policy has not measurably left its start (mean final KL at or below 0), so "
        "there the KL condition leaves Text2Grad no room to learn: it holds only for a policy that stays where it "
        "started."]


def test_held_to_a_baselines_kl_the_baseline_sits_at_its_own_validation_pick_not_the_sweeps_setting():
    """The sweep chose the baseline's fixed 0.1 (0.04 nats), but its own validation score picks fixed 0.03 (0.60
    nats), as a user tuning it would: Text2Grad is held to 0.60 nats, and the looser-penalty sentence starts there."""
    text2grad = [_point("fixed 0.1", [0, 1], 0.40, [0.42, 0.41], 0.92), _point("fixed 1", [0, 1], 0.33, [0.40, 0.38], 0.50)]
    sweep_chosen = {**_point("fixed 0.1", [0, 1], 0.29, [0.35, 0.35], 0.04), "chosen": True}
    picked = _point("fixed 0.03", [0, 1], 0.31, [0.36, 0.36], 0.60)
    loosest = _point("fixed 0.01", [0, 1], 0.30, [0.37, 0.37], 1.10)
    study = {"kl_frontier": {"learned/text2grad": text2grad, "learned/scalar_sum": [sweep_chosen, picked, loosest]},
             "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.35, 0.0),
                                              "kl_end": (0.04, 0.0), "final": {0: 0.35, 1: 0.35}}},
             "sft": {"test": {"fact_score": 0.34}}}
    c = msr.kl_matched(study, "learned", "text2grad", "scalar_sum")
    # within 0.60 nats only fixed 1 (0.50 nats): +0.04 and +0.02 against the pick's 0.36
    assert (c["budget"], c["base_setting"], c["point"]["kl_setting"]) == (0.60, "fixed 0.03", "fixed 1")
    assert c["pair"]["diffs"] == pytest.approx([0.04, 0.02])
    assert c["base_looser"] == (picked, loosest)
    # at the sweep's setting (0.04 nats) no Text2Grad setting would have stayed within
    assert msr.kl_matched({**study, "kl_frontier": {**study["kl_frontier"], "learned/scalar_sum": [sweep_chosen]}},
                          "learned", "text2grad", "scalar_sum")["point"] is None
    line = msr.kl_matched_lines({0: study}, "learned", "text2grad", "scalar_sum")[0][1]
    assert line.startswith("Task instance 0: KL fixed 1 ends at 0.390 ± ")
    assert "the baseline (scalar PPO, Text2Grad's token rewards summed, KL fixed 0.03) at 0.360 ± 0.000 with 0.60" in line
    assert "(at fixed 0.03, the setting it is held at: 0.60 nats, 0.360 ± 0.000): it moves 0.50 nats further" in line


def test_text2grad_is_held_to_every_point_of_the_baselines_frontier_and_loses_where_the_baseline_uses_the_room():
    text2grad = [_point("fixed 0.1", [0, 1], 0.40, [0.42, 0.40], 0.90), _point("fixed 3", [0, 1], 0.30, [0.31, 0.33], 0.02),
                 _point("fixed 1", [0, 1], 0.35, [0.36, 0.34], 0.20)]
    base = [_point("fixed 0.1", [0, 1], 0.29, [0.30, 0.30], 0.03),          # within: only fixed 3 (+0.02)
            _point("fixed 0.1, lr 1e-05", [0, 1], 0.38, [0.39, 0.37], 0.30),  # within: fixed 3 and 1, 1 best on val
            _point("fixed 1", [0, 1], 0.2, [0.25, 0.25], 0.01)]              # nothing within 0.01 nats
    study = {"kl_frontier": {"learned/text2grad": text2grad, "learned/scalar_sum": base}}
    c = msr.frontier_dominance(study, "learned", "text2grad", "scalar_sum")
    assert [r["point"]["kl_setting"] if r["point"] else None for r in c["rows"]] == ["fixed 3", "fixed 1", None]
    assert c["rows"][0]["pair"]["diffs"] == pytest.approx([0.01, 0.03])
    assert c["rows"][1]["pair"]["diffs"] == pytest.approx([-0.03, -0.03])  # the baseline given room beats it
    assert c["ahead"] == 1
    lines, numbers = msr.frontier_dominance_lines({0: study, 1: study}, "learned", "text2grad", "scalar_sum")
    assert lines[0].startswith("Text2Grad against every point of the KL frontier of the information-matched baseline")
    assert lines[1].startswith("Task instance 0: at the baseline's KL fixed 0.1 (0.03 nats, 0.300): KL fixed 3 (0.02 "
                               "nats) 0.320, +0.020 [")
    assert "at the baseline's KL fixed 1 (0.01 nats, 0.250): no setting stays within. Text2Grad is ahead at no " \
           "larger KL at 1 of the baseline's 3 points." in lines[1]
    assert lines[-1] == "Over the 2 instances Text2Grad is ahead at no larger KL at 2 of the baseline's 6 frontier points."
    assert (numbers["ahead"], numbers["points"]) == (2, 6)
    # one point on either side is the chosen setting's own comparison (held to its KL), not a frontier
    assert msr.frontier_dominance({"kl_frontier": {**study["kl_frontier"], "learned/scalar_sum": base[:1]}},
                                  "learned", "text2grad", "scalar_sum") is None


def test_a_goal_met_at_matched_kl_by_standing_at_the_start_policy_is_named_so():
    """Held to a baseline that fell below the start policy (0.30 -> 0.28), a Text2Grad setting that never moved
    (0.30, 0.00 nats) is ahead on every seed and meets the goal; the report says it did not improve on the start
    policy, in the instance's line, the pooled line and the frontier count."""
    five = [0, 1, 2, 3, 4]

    def study(still):
        text2grad = [_point("fixed 3", five, 0.31, [still] * 5, 0.0), _point("fixed 0.1", five, 0.35, [0.40] * 5, 2.0)]
        base = [_point("fixed 0.1", five, 0.29, [0.28] * 5, 0.02), _point("fixed 0.03", five, 0.20, [0.22] * 5, 0.5)]
        return {"kl_frontier": {"learned/text2grad": text2grad, "learned/scalar_sum": base},
                "final": {"learned/scalar_sum": {"method": "scalar_sum", "arm": "learned", "final_mean_ci": (0.28, 0.0),
                                                 "kl_end": (0.02, 0.0), "final": dict.fromkeys(five, 0.28)}},
                "sft": {"test": {"fact_score": 0.30}}}

    standing, moving = study(0.30), study(0.32)
    c = msr.kl_matched(standing, "learned", "text2grad", "scalar_sum")
    assert msr.goal_met(c) and c["improves_on_start"] is False
    assert msr.kl_matched(moving, "learned", "text2grad", "scalar_sum")["improves_on_start"] is True
    lines, _ = msr.kl_matched_lines({0: standing, 1: moving}, "learned", "text2grad", "scalar_sum")
    assert ("Goal met (ahead on >= 4 of 5 seeds: yes, no late decline (<= 0.02): yes, KL no larger: yes). Text2Grad "
            "ends +0.000 from the start policy's score, the baseline -0.020: the goal is met without Text2Grad "
            "improving on the start policy by 0.01 or more. Given a looser penalty") in lines[1]
    assert "KL no larger: yes). Given a looser penalty" in lines[2]  # 0.02 above the start: an improvement
    assert lines[3].endswith("The goal is met on instance(s) 0, 1 of 2. On instance(s) 0 it is met without Text2Grad "
                             "improving on the start policy by 0.01 or more.")
    # the frontier: ahead at both of the baseline's points on both instances, above the start only on instance 1
    lines, numbers = msr.frontier_dominance_lines({0: standing, 1: moving}, "learned", "text2grad", "scalar_sum")
    assert lines[1].endswith("Text2Grad is ahead at no larger KL at 2 of the baseline's 2 points; at 0 of those 2 it "
                             "also improves on the start policy (0.300) by 0.01 or more.")
    assert lines[2].endswith("at 2 of those 2 it also improves on the start policy (0.300) by 0.01 or more.")
    assert lines[3] == ("Over the 2 instances Text2Grad is ahead at no larger KL at 4 of the baseline's 4 frontier "
                        "points, improving on its start policy by 0.01 or more at 2 of those 4.")
    assert (numbers["ahead"], numbers["ahead_improving"]) == (4, 2)
    # a study that did not record the start policy's test score counts nothing it cannot know
    del standing["sft"]
    assert msr.frontier_dominance(standing, "learned", "text2grad", "scalar_sum")["ahead_improving"] is None
    assert msr.kl_matched(standing, "learned", "text2grad", "scalar_sum")["improves_on_start"] is None


def test_a_defended_text2grad_is_also_held_to_the_information_matched_baseline_with_the_same_defence():
    assert msr.kl_baselines("text2grad") == (None, "scalar_sum")
    assert msr.kl_baselines("text2grad+refresh") == (None, "scalar_sum", "scalar_sum+refresh")
    defended = [{**_point("fixed 0.1", [0, 1], 0.40, [0.42, 0.41], 0.92), "chosen": True},
                _point("fixed 3", [0, 1], 0.33, [0.36, 0.30], 0.01)]
    same_defence = {"method": "scalar_sum+refresh", "arm": "learned", "final_mean_ci": (0.33, 0.0),
                    "kl_end": (0.03, 0.0), "final": {0: 0.34, 1: 0.32}}
    study = {"kl_frontier": {"learned/text2grad+refresh": defended},
             "final": {"learned/scalar_sum+refresh": same_defence}, "sft": {"test": {"fact_score": 0.34}}}
    lines, numbers = msr.kl_matched_lines({0: study}, "learned", "text2grad+refresh", "scalar_sum+refresh")
    assert lines[0].startswith("Text2Grad + refresh held to the KL of the information-matched baseline with the same "
                               "defence (scalar PPO, Text2Grad's token rewards summed + refresh)")
    # only fixed 3 stays within the baseline's 0.03 nats: +0.02 and -0.02, ahead on 1 of 2
    assert numbers["instances"][0]["point"]["kl_setting"] == "fixed 3"
    assert numbers["instances"][0]["pair"]["diffs"] == pytest.approx([0.02, -0.02])
    assert "Goal not met (ahead on >= 2 of 2 seeds: no" in lines[1]
    # a baseline that never ran gives no sentence rather than a comparison with another baseline
    assert msr.kl_matched_lines({0: study}, "learned", "text2grad+refresh", "scalar_sum+ensemble") == ([], {})


def test_the_refresh_control_gets_as_many_annotations_and_steps_as_the_refresh_adds():
    # 90 iterations, a refresh every 15: 6 refreshes, each annotating the 16 rollouts and fine-tuning 20 steps
    assert ms.refresh_budget(90, 16) == (96, 120)
    assert ms.refresh_budget(30, 8, every=10, steps_per_refresh=5) == (24, 15)
    # the refreshes spread over the run: 48 iterations (SmolLM2), one every 8; runs shorter than 6, every iteration
    assert ms.refresh_every(48) == 8 and ms.refresh_budget(48, 8) == (48, 120)
    assert ms.refresh_every(4) == 1 and ms.refresh_budget(4, 16) == (64, 80)
    assert ms.refresh_budget(90, 16, steps_per_refresh=ms.PPOConfig().rm_refresh_steps) == ms.refresh_budget(90, 16)


def test_the_refresh_controls_train_their_reward_models_with_the_refreshs_extra_annotations_and_steps(tmp_path, monkeypatch):
    """offline_matched: the base annotations plus the refresh's 96 SFT-policy samples, for its 120 more steps;
    steps_matched: the base annotations only, for as many more steps; swap_matched: the same 96 samples in place of as
    many noisy summaries, for as many more steps; prompts_matched: noisy summaries of the same RL posts in their place;
    each in a folder of its own."""
    trained = {}

    def stage_reward_model(cfg, data, sft, rm_base, folder, stages):
        trained[Path(folder).name] = cfg
        return Path(folder) / "model", None

    (tmp_path / "split.jsonl").write_text("")
    monkeypatch.setattr(ms.qs, "stage_data", lambda cfg, shared: {"val": tmp_path / "split.jsonl", "rl": "rl.jsonl",
                                                                   "eval": tmp_path / "split.jsonl"})
    monkeypatch.setattr(ms.qs, "stage_policy", lambda cfg, data: ("sft", "sft"))
    monkeypatch.setattr(ms.qs, "stage_reward_model", stage_reward_model)
    monkeypatch.setattr(ms, "is_adapter_only", lambda path: False)
    monkeypatch.setattr(ms, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(ms, "load_causal_lm", lambda path: torch.nn.Linear(1, 1))
    monkeypatch.setattr(ms, "_greedy", lambda *a: ({"fact_score": 0.0}, []))
    monkeypatch.setattr(ms, "check_same_start", lambda *a: None)
    monkeypatch.setenv("TEXT2GRAD_CACHE", str(tmp_path / "cache"))
    args = argparse.Namespace(output_dir=str(tmp_path / "study"), task_seed=0, preset="ci", rm_annotations=0,
                              iterations=90, batch_size=16, eval_every=15, target_kl=6.0)
    ctx = ms.build_context(args, [("learned", "text2grad"), ("learned", "text2grad+offline_matched"),
                                  ("learned", "text2grad+steps_matched"), ("learned", "scalar_sum+swap_matched"),
                                  ("learned", "text2grad+prompts_matched"), ("learned", "text2grad+rl_covered")])
    base, annotations, steps, swap, prompts, covered = (trained[f"text2grad_rm{name}"] for name in (
        "", "_offline_matched", "_steps_matched", "_swap_matched", "_prompts_matched", "_rl_covered"))
    assert (annotations.rm_extra_policy_samples, annotations.rm_steps) == (96, base.rm_steps + 120)
    assert (steps.rm_extra_policy_samples, steps.rm_steps) == (0, base.rm_steps + 120)
    assert replace(steps, rm_steps=base.rm_steps) == base  # nothing else differs
    assert replace(swap, rm_extra_replace_noisy=False) == annotations  # the same samples, none added
    assert swap.rm_extra_replace_noisy and not annotations.rm_extra_replace_noisy
    assert ctx.rm_swap_matched.endswith("text2grad_rm_swap_matched/model")
    assert replace(prompts, rm_extra_noisy_summaries=0, rm_extra_policy_samples=96) == swap  # the same 96 prompts
    assert ctx.rm_prompts_matched.endswith("text2grad_rm_prompts_matched/model")
    # every RL post, at the base reward model's annotation count and steps
    assert replace(covered, rm_extra_noisy_summaries=0, rm_extra_replace_noisy=False) == base
    assert covered.rm_extra_noisy_summaries == base.n_rl > 0 and covered.rm_extra_replace_noisy
    assert ctx.rm_rl_covered.endswith("text2grad_rm_rl_covered/model")
    assert ctx.rm_steps_matched.endswith("text2grad_rm_steps_matched/model") and ctx.rm_offline_matched != ctx.rm_steps_matched
    trained.clear()
    ctx = ms.build_context(args, [("learned", "text2grad")])  # no control asked for: none trained
    assert set(trained) == {"text2grad_rm"}
    assert ctx.rm_steps_matched == ctx.rm_offline_matched == ctx.rm_swap_matched == ctx.rm_prompts_matched == ""
    assert ctx.rm_rl_covered == ""


def test_each_defence_is_compared_with_the_run_that_differs_only_by_it_seed_by_seed():
    def run(method, finals):
        return {"method": method, "arm": "learned", "final": dict(enumerate(finals))}
    studies = {ts: {"final": {"learned/text2grad+refresh": run("text2grad+refresh", refresh),
                              "learned/text2grad+offline_matched": run("text2grad+offline_matched", control)}}
               for ts, (refresh, control) in {0: ([0.5, 0.4, 0.3], [0.3, 0.4, 0.4]), 1: ([0.2, 0.2], [0.1, 0.0])}.items()}
    defended, control, key, what = msr.DEFENCE_CONTROLS[0]
    assert (defended, control, key) == ("text2grad+refresh", "text2grad+offline_matched", "refresh_vs_offline_matched")
    lines, numbers = msr.control_lines(studies, "learned", defended, control, what)
    assert lines[0] == ("Text2Grad + refresh against its equal-annotation control (Text2Grad + offline_matched), at "
                        "the end:")
    assert numbers["instances"][0]["diffs"] == pytest.approx([0.2, 0.0, -0.1])
    assert numbers["pooled"]["n"] == 5 and numbers["pooled"]["ahead"] == 3
    assert lines[1].startswith("Task instance 0: paired difference +0.033 (") and "ahead on 1 of 3" in lines[1]
    assert lines[-1].startswith("Pooled over the 2 instances (5 seed pairs): +0.080")
    assert msr.control_lines({0: {"final": {}}}, "learned", defended, control, what) == ([], {})
    # the ensemble against one reward model on the same annotations: plain Text2Grad, on instance 0 only here
    studies[0]["final"]["learned/text2grad+ensemble"] = run("text2grad+ensemble", [0.1, 0.2, 0.3])
    studies[0]["final"]["learned/text2grad"] = run("text2grad", [0.3, 0.3, 0.3])
    lines, numbers = msr.control_lines(studies, "learned", *msr.DEFENCE_CONTROLS[1][:2], msr.DEFENCE_CONTROLS[1][3])
    assert lines == ["Text2Grad + ensemble against Text2Grad with one reward model trained on the same annotations, "
                     "at the end:", "Task instance 0: paired difference -0.100 (95 % interval [-0.348, +0.148]; ahead "
                     "on 0 of 3; exact two-sided sign test p = 0.5)."]  # the tie is dropped: 2 of 2 behind
    # the combination against each defence alone: the same ensemble never refreshed, the same refresh of one model
    studies[0]["final"]["learned/text2grad+ensemble_refresh"] = run("text2grad+ensemble_refresh", [0.4, 0.2, 0.6])
    by_control = {}
    for defended, control, key, what in msr.DEFENCE_CONTROLS[2:4]:
        assert defended == "text2grad+ensemble_refresh"
        lines, numbers = msr.control_lines(studies, "learned", defended, control, what)
        by_control[control] = numbers["instances"][0]["diffs"]
        assert lines[0] == f"Text2Grad + ensemble_refresh against {what}, at the end:"
    assert by_control["text2grad+ensemble"] == pytest.approx([0.3, 0.0, 0.3])
    assert by_control["text2grad+refresh"] == pytest.approx([-0.1, -0.2, 0.3])
    # the refresh against the same reward model never refreshed: plain Text2Grad, on instance 0 only here
    defended, control, key, what = msr.DEFENCE_CONTROLS[-1]
    assert (defended, control, key) == ("text2grad+refresh", "text2grad", "refresh_vs_none")
    lines, numbers = msr.control_lines(studies, "learned", defended, control, what)
    assert lines[0] == ("Text2Grad + refresh against Text2Grad with the same reward model, never refreshed (fewer "
                        "annotations in all), at the end:")
    assert numbers["instances"][0]["diffs"] == pytest.approx([0.2, 0.1, 0.0]) and list(numbers["instances"]) == [0]
    # with each run's final KL: said per instance, and whether the defence holds the policy nearer the start
    for ts, (defended_kl, control_kl) in {0: (0.4, 0.9), 1: (1.9, 0.8)}.items():
        studies[ts]["final"]["learned/text2grad+refresh"]["kl_end"] = (defended_kl, 0.1)
        studies[ts]["final"]["learned/text2grad+offline_matched"]["kl_end"] = (control_kl, 0.1)
    lines, numbers = msr.control_lines(studies, "learned", *msr.DEFENCE_CONTROLS[0][:2], msr.DEFENCE_CONTROLS[0][3])
    assert lines[1].endswith("; final KL 0.40 vs 0.90 nats.") and numbers["kl"] == {0: (0.4, 0.9), 1: (1.9, 0.8)}
    assert lines[-1] == ("Text2Grad + refresh's final KL is lower than the control's on instance(s) 0 and higher on 1: "
                         "it does not hold the policy nearer the start on every instance.")
    studies[1]["final"]["learned/text2grad+refresh"]["kl_end"] = (0.5, 0.1)
    lines = msr.control_lines(studies, "learned", *msr.DEFENCE_CONTROLS[0][:2], msr.DEFENCE_CONTROLS[0][3])[0]
    assert lines[-1] == "Text2Grad + refresh's final KL is lower than the control's on every instance."
    # the reward the critic gave (from the runs' logged metrics): where the defence flips its sign, the report says so
    logged = {"text2grad+refresh": [(-2.0, 0.5), (-1.0, 0.5)], "text2grad+offline_matched": [(1.0, 0.4), (2.0, 0.6)]}
    for method, metrics in logged.items():
        runs = [{"metrics": [{"reward/score_mean": score, "tokens/labelled_share": share}
                             for score, share in metrics]}, {"metrics": [{"iteration": 0}]}]
        assert msr.reward_signal(runs) == pytest.approx({"reward/score_mean": sum(x for x, _ in metrics) / 2,
                                                         "tokens/labelled_share": 0.5})
        studies[0]["final"][f"learned/{method}"]["reward_signal"] = msr.reward_signal(runs)
    assert msr.reward_signal([{"metrics": []}]) == {}
    lines, numbers = msr.control_lines(studies, "learned", *msr.DEFENCE_CONTROLS[0][:2], msr.DEFENCE_CONTROLS[0][3])
    assert lines[1].endswith("; final KL 0.40 vs 0.90 nats; the critic's token rewards summed per response, mean over "
                             "training, -1.50 vs +1.50 (share of tokens labelled +-1: 0.50 vs 0.50).")
    assert lines[2].endswith("final KL 0.50 vs 0.80 nats.")  # instance 1 logged no metrics: no reward clause
    assert lines[-1] == ("On instance(s) 0 the average response's token rewards sum below zero under Text2Grad + "
                         "refresh and above zero under the control: there the defence turns the critic's verdict on "
                         "the average response from good to poor.")
    studies[0]["final"]["learned/text2grad+refresh"]["reward_signal"]["reward/score_mean"] = 0.5
    assert not any("from good to poor" in x for x in
                   msr.control_lines(studies, "learned", *msr.DEFENCE_CONTROLS[0][:2], msr.DEFENCE_CONTROLS[0][3])[0])


# each split of the equal-annotation control: (key, defended, control, the first words of its header, diffs seed by
# seed over the final scores below)
CONTROL_SPLITS = [
    ("annotations_vs_steps", "text2grad+offline_matched", "text2grad+steps_matched",
     "Text2Grad + offline_matched against Text2Grad with a reward model trained as many steps on the base annotations "
     "only (Text2Grad + steps_matched), at the end:", [0.0, -0.1, 0.1]),
    ("steps_vs_none", "text2grad+steps_matched", "text2grad",
     "Text2Grad + steps_matched against Text2Grad with the base reward model", [0.1, 0.2, 0.0]),
    ("count_vs_kind", "text2grad+offline_matched", "text2grad+swap_matched",
     "Text2Grad + offline_matched against Text2Grad with the same samples in place of as many noisy summaries "
     "(Text2Grad + swap_matched), at the end:", [-0.05, 0.1, 0.1]),
    ("kind_vs_steps", "text2grad+swap_matched", "text2grad+steps_matched",
     "Text2Grad + swap_matched against Text2Grad with a reward model trained as many steps", [0.05, -0.2, 0.0]),
    ("samples_vs_prompts", "text2grad+swap_matched", "text2grad+prompts_matched",
     "Text2Grad + swap_matched against Text2Grad with noisy summaries of the same RL posts", [0.1, 0.0, -0.2]),
    ("prompts_vs_steps", "text2grad+prompts_matched", "text2grad+steps_matched",
     "Text2Grad + prompts_matched against Text2Grad with a reward model trained as many steps", [-0.05, -0.2, 0.2]),
    ("swap_vs_none", "text2grad+swap_matched", "text2grad",
     "Text2Grad + swap_matched against Text2Grad with the base reward model (as many annotations, fewer steps",
     [0.15, 0.0, 0.0]),
    ("rl_covered_vs_none", "text2grad+rl_covered", "text2grad",
     "Text2Grad + rl_covered against Text2Grad with the base reward model (as many annotations and steps", [0.3, 0.0, 0.1]),
]


@pytest.mark.parametrize("key,defended,control,header,diffs", CONTROL_SPLITS, ids=[c[0] for c in CONTROL_SPLITS])
def test_the_equal_annotation_control_is_split_into_its_steps_number_kind_and_prompts(key, defended, control, header,
                                                                                        diffs):
    finals = {"text2grad": [0.1, 0.1, 0.1], "text2grad+steps_matched": [0.2, 0.3, 0.1],
              "text2grad+offline_matched": [0.2, 0.2, 0.2], "text2grad+swap_matched": [0.25, 0.1, 0.1],
              "text2grad+prompts_matched": [0.15, 0.1, 0.3], "text2grad+rl_covered": [0.4, 0.1, 0.2]}
    final = {f"learned/{m}": {"method": m, "arm": "learned", "final": dict(enumerate(f))} for m, f in finals.items()}
    controls = {k: (d, c, what) for d, c, k, what in msr.DEFENCE_CONTROLS}
    assert controls[key][:2] == (defended, control)
    lines, numbers = msr.control_lines({1: {"final": final}}, "learned", *controls[key])
    assert lines[0].startswith(header)
    assert numbers["instances"][1]["diffs"] == pytest.approx(diffs)


# ------------------------------------------------------------------------------------------------
# Checkpointed runs: a run killed midway resumes at its last evaluation point
# ------------------------------------------------------------------------------------------------


def _tiny_study(tmp_path: Path, tiny_llama, bpe_tokenizer, out: str) -> ms.StudyContext:
    splits = generate_task(TaskConfig(seed=0, n_train=4, n_rl=16, n_eval=6))
    rl = tmp_path / "rl.jsonl"
    write_jsonl(rl, splits["rl"])
    sft = tmp_path / "sft"
    if not (sft / "config.json").is_file():
        tiny_llama.save_pretrained(sft)
        bpe_tokenizer.save_pretrained(sft)
    return ms.StudyContext(
        sft=str(sft), rl=str(rl), val_records=splits["eval"][:3], test_records=splits["eval"][3:], rm="", dense_rm="",
        scalar_rm="", iterations=4, eval_every=2, batch_size=4, response_length=8, kl_coef=0.1, target_kl=6.0,
        out=str(tmp_path / out), sft_scores={"val": {"fact_score": 0.0}, "test": {"fact_score": 0.0}},
        checkpoint_runs=True)


def test_a_killed_checkpointed_run_resumes_at_its_last_evaluation_point_and_ends_like_an_unbroken_one(
        tmp_path, tiny_llama, bpe_tokenizer, monkeypatch, capsys):
    spec = ms.RunSpec("oracle", "text2grad", ms.Setting(lr=1e-3, kl="fixed", lam=0.95), 0, "final")
    unbroken = ms.run_one(_tiny_study(tmp_path, tiny_llama, bpe_tokenizer, "unbroken"), spec)

    ctx = _tiny_study(tmp_path, tiny_llama, bpe_tokenizer, "killed")
    step = NLGradientPPOTrainer.step

    def killed_in_iteration_3(self):
        if self.state.step == 2:
            raise KeyboardInterrupt("killed")
        return step(self)

    monkeypatch.setattr(NLGradientPPOTrainer, "step", killed_in_iteration_3)
    with pytest.raises(KeyboardInterrupt):
        ms.run_one(ctx, spec)
    run_dir = Path(ctx.out) / spec.run_id
    partial = json.loads((run_dir / ms.PARTIAL_FILE).read_text())
    assert [p["iteration"] for p in partial["curve"]] == [0, 2] and Path(partial["checkpoint"]).name == "checkpoint-2"
    assert not (run_dir / "result.json").exists()

    monkeypatch.setattr(NLGradientPPOTrainer, "step", step)
    resumed = ms.run_one(ctx, spec)
    assert "resumed at iteration 2 of 4" in capsys.readouterr().out
    assert resumed["curve"] == unbroken["curve"] and resumed["metrics"] == unbroken["metrics"]
    assert len(resumed["metrics"]) == 4
    # the machine's load at each evaluation point, the killed part's kept: 2 of them, at iterations 2 and 4
    assert len(resumed["load_1min"]) == 2 and resumed["load_1min"][0] == partial["load_1min"][0]
    assert all(x is None or x >= 0 for x in resumed["load_1min"])
    # finished: the result is what the study reads; the checkpoints and the partial file are gone
    assert not (run_dir / ms.PARTIAL_FILE).exists() and not list((run_dir / "ppo").glob("checkpoint-*"))


def test_a_partial_run_whose_checkpoint_is_gone_starts_over(tmp_path, capsys):
    (tmp_path / ms.PARTIAL_FILE).write_text(json.dumps({"checkpoint": str(tmp_path / "ppo" / "checkpoint-6"),
                                                        "curve": [], "metrics": [], "seconds": 1.0}))
    assert ms.read_partial(tmp_path) is None
    assert "checkpoint-6 is gone, so the run starts over" in capsys.readouterr().out
    (tmp_path / "ppo" / "checkpoint-6").mkdir(parents=True)
    (tmp_path / "ppo" / "checkpoint-6" / "trainer_state.json").write_text("{}")
    assert ms.read_partial(tmp_path)["seconds"] == 1.0
    assert ms.read_partial(tmp_path / "elsewhere") is None  # no partial file: a fresh run


def test_a_report_of_a_study_still_running_names_the_runs_not_finished():
    study = {"requested_final": {"oracle/text2grad": [0, 1, 2], "oracle/scalar_sum": [0, 1, 2], "oracle/scalar_task": [0, 1, 2]},
             "final": {"oracle/text2grad": {"final": {"0": 0.78}}, "oracle/scalar_sum": {"final": {"0": 0.55, "2": 0.5}}}}
    [line] = msr.missing_runs_lines(study)
    assert line.startswith("Partial: 3 of the 9 requested final runs have finished, so every number below is over the "
                           "finished seeds only.")
    assert line.endswith(f"Not run yet: {msr.method_label('text2grad')} (oracle arm) seeds 1, 2; "
                         f"{msr.method_label('scalar_sum')} (oracle arm) seed 1; "
                         f"{msr.method_label('scalar_task')} (oracle arm) seeds 0, 1, 2.")
    study["requested_final"] = {"oracle/text2grad": [0]}
    assert msr.missing_runs_lines(study) == []  # all finished: nothing to say
    assert msr.missing_runs_lines({"final": {}}) == []  # a study stored before requests were recorded


def test_a_report_names_the_kl_frontier_runs_not_run():
    specs = ms.frontier_specs([("learned", "text2grad"), ("learned", "scalar_sum")],
                              {("learned", "text2grad"): ms.Setting(lr=1e-5, kl="fixed", lam=0.0),
                               ("learned", "scalar_sum"): ms.Setting(lr=3e-6, kl="fixed", lam=0.95)},
                              [0.1, 0.3, 1.0], [0, 1], default_coef=0.1)
    assert len(specs) == 8  # 0.1 is the chosen setting's own coefficient: the final run, not run twice
    ran = {s for s in specs if s.method == "text2grad"} | {specs[-1]}  # scalar_sum ran only at 1.0 with seed 1
    not_run = ms.runs_not_finished([s for s in specs if s not in ran], 0.1)
    assert not_run == {"learned/scalar_sum": {"fixed 0.3": [0, 1], "fixed 1": [0]}}
    # a learning-rate point is named with its learning rate, as the report labels it; the preset's coefficient too
    chosen = {("learned", "text2grad"): ms.Setting(lr=1e-5, kl="fixed", lam=0.0)}
    lr_point = ms.RunSpec("learned", "text2grad", ms.Setting(lr=3e-5, kl="fixed", lam=0.0), 2, "frontier")
    assert ms.runs_not_finished([lr_point], 0.1, chosen) == {"learned/text2grad": {"fixed 0.1, lr 3e-05": [2]}}
    study = {"final": {}, "frontier_requested": len(specs), "frontier_not_run": not_run}
    [line] = msr.missing_runs_lines(study)
    assert line == (f"Of the 8 requested runs at the KL frontier's settings, 3 have not run, so the comparisons across "
                    f"KL settings choose among those that ran. Not run yet: {msr.method_label('scalar_sum')} "
                    f"(learned arm) at KL fixed 0.3, seeds 0, 1; {msr.method_label('scalar_sum')} (learned arm) at KL "
                    f"fixed 1, seed 0.")
    instance = {"config": {"policy": "tiny", "iterations": 2, "batch_size": 4, "seeds": [0, 1]},
                "sft": {"test": {"fact_score": 0.2, "n_false": 1.0}}, **study}
    same = msr.pooled_markdown({0: instance, 1: instance}, {}, "cmd").splitlines()
    assert f"On every instance: {line}" in same
    other = msr.pooled_markdown({0: instance, 1: {**instance, "frontier_not_run": {}}}, {}, "cmd").splitlines()
    assert f"Task instance 0: {line}" in other and not any(l.startswith("Task instance 1:") for l in other)


def test_the_bradley_terry_reward_model_of_smollm2_trains_with_the_generative_reward_models_budget():
    toy = ms.resolve(ms.QuickstartConfig(preset="default"))
    assert ms.scalar_rm_recipe("default", toy)[:8] == ["--use_lora", "false", "--max_length", "256", "--max_steps",
                                                       "300", "--learning_rate", "5e-4"]
    smollm2 = replace(toy, rm_steps=40, rm_learning_rate=1e-3)  # the smollm2 preset's reward-model budget
    recipe = parse_config(ScalarRMConfig, ["--dataset_path", "pairs.jsonl", *ms.scalar_rm_recipe("smollm2", smollm2)])
    assert (recipe.use_lora, recipe.lora_r, recipe.max_steps, recipe.learning_rate) == (True, 16, 40, 1e-3)
    # the generative reward model's batch: 2 pairs per micro-step, 4 micro-steps per optimizer step
    assert recipe.per_device_train_batch_size * recipe.gradient_accumulation_steps == 8


def test_text2grad_is_compared_with_the_information_matched_baseline_of_its_own_defence():
    study = _instance([0.5, 0.4, 0.6], [0.1, 0.2, 0.1], kl=(3.0, 1.0), sft=0.25)
    refresh = {**_final("learned", "text2grad+refresh", [0.3] * 3, [0.3] * 3),
               **_final("learned", "scalar_sum+refresh", [0.35] * 3, [0.3] * 3),
               **_final("learned", "text2grad+ensemble", [0.4] * 3, [0.3] * 3)}  # no scalar_sum+ensemble ran
    keys = [("learned", m) for m in ("text2grad+refresh", "scalar_sum+refresh", "text2grad+ensemble")]
    study["final"].update(msr.summarize_final(refresh, keys, [0, 1, 2], 16))
    matched = msr.matched_comparisons(study)
    assert set(matched) == {"learned/text2grad", "learned/text2grad+refresh"}  # the ensemble has no matched pair
    assert matched["learned/text2grad"]["baseline"] == "learned/scalar_sum"
    assert matched["learned/text2grad"]["pair"]["ahead"] == 3 and not matched["learned/text2grad"]["kl_goal"]
    assert matched["learned/text2grad+refresh"]["baseline"] == "learned/scalar_sum+refresh"
    assert matched["learned/text2grad+refresh"]["pair"]["ahead"] == 0
    assert not matched["learned/text2grad"]["base_above_start"]  # 0.133 is below the 0.25 start
    lines = msr.pooled_lines({0: study}, "learned", "text2grad", "scalar_sum")[0]
    assert lines[0] == "Text2Grad against the information-matched baseline:"
    assert ("Text2Grad ends at 0.500 ± 0.248, the information-matched baseline (scalar PPO, Text2Grad's token "
            "rewards summed) at 0.133") in lines[1]
    assert "Final KL 3.00 vs 1.00 nats" in lines[1] and "KL no larger: no" in lines[1]
    assert lines[1].endswith("The information-matched baseline ends no better than the start policy.")
    md = msr.markdown(study)
    assert "Text2Grad + refresh against the information-matched baseline with the same defence:" in md
    assert "the information-matched baseline with the same defence (scalar PPO, Text2Grad's token rewards summed + " \
           "refresh) at 0.350" in md
    assert "Text2Grad + ensemble against the information-matched baseline" not in md
    # without the baseline's runs there is nothing to compare, and nothing is said
    del study["final"]["learned/scalar_sum"]
    assert msr.pooled_lines({0: study}, "learned", "text2grad", "scalar_sum") == ([], {})
    assert "learned/text2grad" not in msr.matched_comparisons(study)


def test_a_report_keeps_the_recorded_quality_of_a_critic_not_trained_in_its_folder(tmp_path):
    """A study resumed on another machine trains only the critics its new runs need: the Bradley-Terry model's
    recorded quality stays beside the generative reward model's, re-read from this folder."""
    base = ms.Setting(1e-4, "fixed", 0.95)
    out = tmp_path / "study"
    for m, scores in (("text2grad", (0.5, 0.6)), ("scalar_sum", (0.3, 0.3))):
        for seed, score in enumerate(scores):
            spec = ms.RunSpec("learned", m, base, seed, "final")
            ms._write_json(out / spec.run_id / "result.json", _result(spec, score, score))
    recorded = {"n": 52, "n_train": 467, "pairwise_accuracy": 0.923}
    ms._write_json(out / "study.json", {"critics": {"bradley_terry": recorded, "generative": {"n": 1}}})
    report = out / "shared" / "text2grad_rm" / "reward_model" / "eval" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"n_examples": 16, "token_label_accuracy": 0.625, "json_validity_rate": 1.0,
                                  "token": {"positive": {"f1": 0.43}, "negative": {"f1": 0.31}}}))
    write_jsonl(report.parent.parent / "annotations.jsonl", [{"id": i} for i in range(160)])
    argv = ["--output_dir", str(out), "--preset", "ci", "--arms", "learned", "--methods", "text2grad", "scalar_sum",
            "--seeds", "0", "1", "--sweep_knobs", "lambda", "--lambdas", "0.95", "--iterations", "2", "--eval_every", "2",
            "--phases", "report"]
    assert ms.main(argv) == 0
    critics = json.loads((out / "study.json").read_text())["critics"]
    assert critics["bradley_terry"] == recorded  # not trained here: kept
    assert critics["generative"]["token_accuracy"] == 0.625 and critics["generative"]["n_train"] == 144  # re-read
    assert "0.923 (52 held-out pairs, 467 for training)" in (out / "study.md").read_text()


def test_a_refused_resume_names_the_scores_that_differ_even_when_the_fact_score_agrees(tmp_path):
    path = tmp_path / "final" / "learned-text2grad-seed0" / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"curve": [{"iteration": 0, "val": {"fact_score": 0.225, "n_false": 0.9791666}}]}))
    with pytest.raises(SystemExit, match=r"validation n_false 1\.02083, but 1 finished run\(s\) there started from "
                                         r"one with n_false 0\.979167 ") as stop:
        ms.check_same_start(tmp_path, {"val": {"fact_score": 0.225, "n_false": 1.0208333}})
    assert "fact_score" not in str(stop.value).split("(e.g.")[0]  # the agreeing score is not named as a difference


def test_a_study_is_dated_by_its_newest_run_not_by_the_day_its_report_was_made_again(tmp_path):
    today = ms.time.strftime("%Y-%m-%d")
    assert ms.study_date(tmp_path, None) == today  # nothing ran, nothing stored
    for run, date in [("a", "2026-11-28"), ("b", "2026-11-29"), ("c", None)]:
        (tmp_path / "final" / run).mkdir(parents=True)
        (tmp_path / "final" / run / "result.json").write_text(json.dumps({"date": date} if date else {}))
    (tmp_path / "shared" / "rm").mkdir(parents=True)  # the setup's files are no runs
    (tmp_path / "shared" / "rm" / "result.json").write_text(json.dumps({"date": "2030-01-01"}))
    assert ms.study_date(tmp_path, None) == "2026-11-29"
    assert ms.study_date(tmp_path, "2026-11-30") == "2026-11-30"  # an earlier report saw runs that recorded no date
    assert ms.study_date(tmp_path, "2026-11-01") == "2026-11-29"


def test_a_lora_sft_is_merged_beside_it_in_the_cache_so_every_study_folder_shares_the_reward_models(tmp_path):
    """The reward models' cache key holds the merged start's path: merged inside a study's folder, a study resumed
    or reported in another folder trained its reward models again (minutes each for SmolLM2)."""
    sft = tmp_path / "cache" / "policy-abc" / "sft"
    sft.mkdir(parents=True)
    (tmp_path / "link").symlink_to(sft.parent)
    assert ms.merged_sft_folder(sft) == tmp_path / "cache" / "policy-abc" / "sft-merged"
    assert ms.merged_sft_folder(tmp_path / "link" / "sft") == ms.merged_sft_folder(sft)  # one path per policy


def test_a_section_with_nothing_to_say_leaves_no_gap_in_the_report():
    assert msr.paragraphs(["", "a", "", "", "", "b", "c", "", ""]) == "a\n\nb\nc"
    assert msr.paragraphs(["", ""]) == ""
    # a real report: SmolLM2's study has comparisons that print nothing for some methods
    study = json.loads((ROOT / "benchmarks" / "results" / "method_study_smollm2_v2" / "study.json").read_text())
    md = msr.markdown(study)
    assert "\n\n\n" not in md and not md.startswith("\n") and not md.endswith("\n")
    assert "\n\nText2Grad against the information-matched baseline:\n" in md  # paragraphs still apart


def test_study_processes_writing_one_report_at_once_each_leave_it_whole(tmp_path):
    # several study processes on one task instance rewrite its study.md, study.json and plots as they finish
    path = tmp_path / "study.md"
    versions = [f"report of writer {w}\n" * (2000 + 500 * w) for w in range(4)]
    assert write_at_once(lambda text: msr.write_whole(path, text), versions, times=60) == []
    assert path.read_text() in versions
    msr.write_whole(tmp_path / "plot.png", b"\x89PNG")
    assert (tmp_path / "plot.png").read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "study.md"]
