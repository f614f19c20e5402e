"""The method study's statistics, selection rules and generated sentences (benchmarks/method_study.py), on
hand-made curves; the study itself is a benchmark (hours), its smoke run a slow test."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import method_study as ms  # noqa: E402
from benchmarks import method_study_report as msr  # noqa: E402


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
    assert lines[1] == ("The study's goal, Text2Grad ahead of that baseline at the end of training on at least 3 of 3 "
                        "seeds, is not met in the oracle arm.")
    # finals 0.5 / 0.367 (scalar_bt, 0.2, reads no critic and is left out): range 0.133 against half-width 0.248
    lo, hi, widest = msr.final_spread(summ, "oracle")
    assert (lo, hi) == (pytest.approx(0.3667, abs=1e-4), pytest.approx(0.5)) and widest == pytest.approx(0.248, abs=1e-3)
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
    assert "on 0 of 3 seeds." in lines[5]
    assert lines[3].endswith("moved by +0.000, the baseline's by +0.067.")  # flat: no claim about flattening
    # the same means with noisy seeds: the spread sentence turns; ahead on every seed: the goal is met
    tied = {**_final("oracle", "text2grad", [0.3, 0.5, 0.4], [0.3, 0.5, 0.4]),
            **_final("oracle", "scalar_collapsed", [0.29, 0.49, 0.39], [0.3, 0.3, 0.3])}
    tied_lines = msr.interpret(msr.summarize_final(tied, keys[:2], [0, 1, 2], 16), 0.2)
    assert tied_lines[1].endswith("is met in the oracle arm.")
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

    def fake_run_all(ctx, specs, jobs):  # validation rises with lambda, and is best at the lowest learning rate
        asked.extend(specs)
        return {s: {"curve": _curve([0.0, s.setting.lam - s.setting.lr * 100])} for s in specs}

    monkeypatch.setattr(ms, "run_all", fake_run_all)
    base = ms.Setting(1e-3, "fixed", 0.95)
    table = ms.sweep(None, [("oracle", "text2grad")], base, [1e-4, 3e-3], seed=7, jobs=1, knobs=("lambda",))
    assert table["oracle/text2grad"]["chosen"] == {"lr": 1e-3, "kl": "fixed", "lam": 1.0}
    assert {s.setting.lam for s in asked} == {0.0, 0.95, 1.0} and {s.setting.lr for s in asked} == {1e-3}
    assert all(s.seed == 7 and s.phase == "sweep" for s in asked)
    asked.clear()
    table = ms.sweep(None, [("oracle", "text2grad")], base, [1e-4, 3e-3], seed=7, jobs=1)
    assert table["oracle/text2grad"]["chosen"] == {"lr": 1e-4, "kl": "fixed", "lam": 1.0}
    assert {s.setting.kl for s in asked} == {"fixed", "adaptive"}


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
from benchmarks.method_study import exit_with_parent

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=exit_with_parent,
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
