"""benchmarks/results_tables.py: the README tables are what the committed result files give, and new studies appear."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import method_study_report as msr  # noqa: E402
from benchmarks import results_tables as rt  # noqa: E402


def test_the_committed_tables_are_what_the_result_files_give():
    for name, table in rt.tables().items():
        text = rt.TARGETS[name].read_text()
        assert rt.rewrite(text, name, table) == text, (
            f"{rt.TARGETS[name].relative_to(ROOT)}: the {name} table differs from the result files; "
            "run `python benchmarks/results_tables.py`")
    assert rt.main(["--check"]) == 0


def test_the_tables_use_the_study_reports_own_rules():
    # results_tables keeps copies so that it does not import the report's plotting stack: they must not drift
    assert (rt.TIE, rt.START_GAIN) == (msr.TIE, msr.START_GAIN)


def test_check_fails_on_a_hand_edited_figure(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    table = rt.tables()["readme"]
    first_row = table.splitlines()[2]
    edited = table.replace(first_row, re.sub(r"\d+\.\d+", lambda m: "9" + m.group(0), first_row, count=1))
    assert edited != table
    headline = rt.tables()["headline"]
    readme.write_text(f"# x\n\n<!-- results-table:headline -->\n{headline}\n<!-- /results-table:headline -->\n\n"
                      f"<!-- results-table:readme -->\n{edited}\n<!-- /results-table:readme -->\n\nmore\n")
    index = tmp_path / "index.md"
    index.write_text(f"<!-- results-table:index -->\n{rt.tables()['index']}\n<!-- /results-table:index -->\n")
    monkeypatch.setattr(rt, "TARGETS", {"headline": readme, "readme": readme, "index": index})
    before = readme.read_text()
    assert rt.main(["--check"]) == 1
    assert "README.md (readme)" in capsys.readouterr().err and readme.read_text() == before  # --check writes nothing
    assert rt.main([]) == 0 and first_row in readme.read_text() and readme.read_text().endswith("\n\nmore\n")
    assert rt.main(["--check"]) == 0


def test_a_new_study_folder_gets_rows_without_touching_the_script(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    study = json.loads((results / "method_study_smollm2" / "study.json").read_text())
    t2g = study["final"]["oracle/text2grad"]
    t2g["final"] = {seed: 0.0 for seed in t2g["final"]}  # now behind on every seed
    t2g["final_mean_ci"] = [0.0, 0.0]
    study["date"], study["cpu"], study["load_before"] = "2031-01-02", "Some CPU 9000, 2 cores", [3.5, 3.0, 2.0]
    (results / "zz_new_study").mkdir()
    (results / "zz_new_study" / "study.json").write_text(json.dumps(study))
    monkeypatch.setattr(rt, "RESULTS", results)
    tables = rt.tables()
    row = next(line for line in tables["readme"].splitlines() if "`zz_new_study`" in line)
    assert "Text2Grad 0.000 ± 0.000" in row and "ahead on 0 of 3 seeds" in row
    assert "Some CPU 9000, 2 cores; 2031-01-02; shared (load 3.5)" in row
    assert "`zz_new_study`: oracle: Text2Grad 0.000 vs scalar PPO 0.503, ahead on 0/3 seeds at the end" in tables["index"]


def test_a_study_still_running_says_how_many_of_its_runs_have_finished(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    study = json.loads((ROOT / "benchmarks" / "results" / "method_study_smollm2" / "study.json").read_text())
    for row in study["final"].values():  # one seed each: no interval
        row["final"], row["seeds"] = {"0": row["final"]["0"]}, [0]
        row["final_mean_ci"] = [row["final"]["0"], float("nan")]
    study["requested_final"] = {key: [0, 1, 2] for key in study["final"]}
    (results / "zz_running").mkdir()
    (results / "zz_running" / "study.json").write_text(json.dumps(study))
    monkeypatch.setattr(rt, "RESULTS", results)
    row = next(line for line in rt.tables()["readme"].splitlines() if "`zz_running`" in line)
    n = len(study["final"])
    assert f"1 seed; partial: {n} of {3 * n} requested runs finished" in row
    assert "nan" not in row and "± " not in row.split("from an SFT start")[1]
    assert "ahead on " in row and " of 1 seed " in row


def test_a_study_that_only_swept_gets_its_choices_and_validation_scores(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    tried = [{"setting": {"lr": lr, "kl": "fixed", "lam": 0.0, "kl_coef": None}, "val_end": v}
             for lr, v in ((3e-5, 0.183), (1e-5, 0.267), (1e-4, 0.0))]
    study = {"identity": {"preset": "default", "task_seed": 0, "iterations": 90}, "final": {}, "date": "2031-01-02",
             "cpu": "Some CPU", "command": "python benchmarks/method_study.py --phases sweep",
             "sweep": {"learned/text2grad": {"chosen": tried[1]["setting"], "tried": tried, "knobs": ["lr"]}}}
    (results / "zz_sweep").mkdir()
    (results / "zz_sweep" / "study.json").write_text(json.dumps(study))
    monkeypatch.setattr(rt, "RESULTS", results)
    (what, result, machine, command), headline = rt.study_rows(results / "zz_sweep")
    assert what.startswith("method study sweep (preset default, task instance 0, 90 PPO iterations")
    assert result == ("learned/text2grad: chose lr 1e-05, KL fixed, lambda 0 (validation, tried lr 1e-05, KL fixed, "
                      "lambda 0: 0.267, lr 3e-05, KL fixed, lambda 0: 0.183, lr 0.0001, KL fixed, lambda 0: 0.000)")
    assert headline == "learned/text2grad chose lr 1e-05, KL fixed, lambda 0 of 3 settings tried"
    assert machine.startswith("Some CPU; 2031-01-02") and command == "`python benchmarks/method_study.py --phases sweep`"


def test_every_benchmark_script_is_in_the_index_and_every_result_file_is_read():
    # helpers of other scripts: result files, these tables, and the method study's report (its own index row)
    helpers = {"result_file.py", "results_tables.py", "method_study_report.py"}
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")} - helpers
    assert {script for script, _, _ in rt.SCRIPTS} == scripts
    files = {str(p.relative_to(ROOT / "benchmarks" / "results")) for p in (ROOT / "benchmarks" / "results").glob("*/*.json")}
    known = set(rt.RESULT_FILES) | {f"{p.name}/study.json" for p in rt.studies()}
    # every committed result file has a reader (a quickstart run's own results.json is read by its row)
    assert {f for f in files if not f.endswith("-results.json")} <= known


def test_load_decides_idle_or_shared():
    base = {"machine": "M", "date": "2026-01-01"}
    assert rt.conditions({**base, "load_before": [0.3, 0.2, 0.1], "load_after": [1.9, 1, 1]}) == "M; 2026-01-01; idle (load 0.3 -> 1.9)"
    assert rt.conditions({**base, "load_before": [6.0, 5, 4]}) == "M; 2026-01-01; shared (load 6.0)"
    assert rt.conditions(base) == "M; 2026-01-01; load not recorded"


def test_equal_final_scores_are_a_tie_as_in_the_study_report_not_ahead(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    study = json.loads((ROOT / "benchmarks" / "results" / "method_study_smollm2" / "study.json").read_text())
    t2g, base = study["final"]["oracle/text2grad"], study["final"]["oracle/scalar_collapsed"]
    # the same score summed in another order: 0.6959999999999996 vs 0.6959999999999994
    t2g["final"] = {seed: 0.6959999999999996 for seed in t2g["final"]}
    base["final"] = {seed: 0.6959999999999994 for seed in base["final"]}
    (results / "zz_tied").mkdir()
    (results / "zz_tied" / "study.json").write_text(json.dumps(study))
    monkeypatch.setattr(rt, "RESULTS", results)
    row = next(line for line in rt.tables()["readme"].splitlines() if "`zz_tied`" in line)
    assert "ahead on 0 of 3 seeds" in row


def _matched(t2g, base, kl=(2.0, 1.0)):
    """A one-instance study's stored comparison of Text2Grad with scalar_sum (method_study_report.instance_comparison)."""
    diffs = [a - b for a, b in zip(t2g, base)]
    mean = sum(diffs) / len(diffs)
    return {"baseline": "learned/scalar_sum", "t2g": [sum(t2g) / len(t2g), 0.01], "base": [sum(base) / len(base), 0.01],
            "kl": list(kl), "pair": {"n": len(diffs), "diffs": diffs, "ahead": sum(d > 0 for d in diffs), "mean": mean,
                                     "interval": [mean - 0.03, mean + 0.03], "sign_p": 0.25}}


def test_the_headline_compares_text2grad_with_the_information_matched_baseline_of_the_newest_studies(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    pooled = json.loads((ROOT / "benchmarks" / "results" / "method_study_xeon" / "study.json").read_text())
    smol = json.loads((ROOT / "benchmarks" / "results" / "method_study_smollm2_v2" / "study.json").read_text())
    smol["matched"] = {"learned/text2grad": _matched([0.3, 0.45, 0.6], [0.4, 0.4, 0.4], kl=(5.0, 6.0))}
    smol.pop("matched_on_validation", None)  # at the sweep's settings here; the validation picks have a test of their own
    smol["date"] = "2026-11-29"  # the committed study's date moves as its runs finish
    older = {**smol, "date": "2020-01-01", "matched": {"learned/text2grad": _matched([0.9] * 3, [0.1] * 3)},
             "settings_from": {"study": "benchmarks/results/another_sweep/study.json"}}
    # the same settings on another machine: shown under the newest, since its other start may reverse the result
    replica = {**pooled, "date": "2026-11-20", "cpu": "another CPU"}
    for name, study in (("a_pooled", pooled), ("b_smol", smol), ("c_older_smol", older), ("d_replica", replica)):
        (results / name).mkdir()
        (results / name / "study.json").write_text(json.dumps(study))
    monkeypatch.setattr(rt, "RESULTS", results)
    table = rt.headline_table()
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert "c_older_smol" not in table  # the newer study of the same policy wins; another sweep's is not shown
    assert [r.split(" | ")[1] for r in rows] == ["0 (0.340)", "1 (0.166)", "2 (-0.346)", "pooled"] * 2 + ["0 (0.362)"]
    assert "a_pooled" in rows[0] and "d_replica" in rows[4]
    assert rt._baseline_name("learned/scalar_sum+refresh") == "scalar PPO (summed span rewards) + refresh"
    assert rt._baseline_name("learned/scalar_sum+offline_matched") == ("scalar PPO (summed span rewards) + the refresh's "
                                                                       "annotations offline")
    assert rt._baseline_name("learned/scalar_sum+steps_matched").endswith(" + the refresh's steps offline")
    assert rt._baseline_name("learned/scalar_sum+swap_matched").endswith(" + the refresh's samples in place of noisy ones")
    assert rt._baseline_name("learned/scalar_sum+prompts_matched").endswith(" + noisy summaries of the refresh's prompts")
    assert rt._baseline_name("learned/scalar_sum+rl_covered").endswith(" + every RL post annotated")
    assert "| 0 (0.340) | 0.424 | 0.347 | +0.077 [+0.058, +0.096], ahead on 5 of 5 | 0.99 vs 0.01 |" in rows[0]
    assert rows[2].endswith("| scalar PPO (Bradley-Terry RM) -0.330 |")  # at the validation-picked KL, as both sides
    assert "| 0 (0.362) | 0.450 | 0.400 | +0.050 [+0.020, +0.080], ahead on 2 of 3 | 5.00 vs 6.00 | " \
           "scalar PPO (Bradley-Terry RM) 0.596 |" in rows[8]
    together, real = [line for line in table.splitlines() if line.startswith("- ")]
    # the study and its replica (the same starts) together: each instance once with both studies' seed pairs,
    # instances 0 and 1 ahead (at larger KL), instance 2 behind (at less)
    assert together.startswith("- tiny Llama, toy task, the 2 studies together (3 task instances, each its own SFT "
                               "start; for 3 of them more than one study trained the same start, and their seed pairs "
                               "are pooled): Text2Grad ends ahead of the information-matched baseline on average on 2 "
                               "of 3, at no larger final KL on 1 of 3, and both on 0 of 3; over all 30 seed pairs")
    assert "held to the KL of each point of the baseline's own KL frontier (2 studies with one), ahead at 20 of 30 " \
           "points" in together  # the committed study's count, twice
    assert real == ("- SmolLM2-135M-Instruct (b_smol, 2026-11-29; both at lr 0.0001, KL fixed, lambda 0.95): Text2Grad "
                    "ends ahead of the information-matched baseline on average on 1 of 1 task instance, and at no larger "
                    "final KL on 1 of 1; its mean final score is above the best scalar baseline's on 0 of 1.")
    shutil.rmtree(results / "d_replica")  # one study of the policy: its own sentence
    toy = next(line for line in rt.headline_table().splitlines() if line.startswith("- tiny"))
    assert toy.startswith("- tiny Llama, toy task (a_pooled, 2026-11-29; each at the KL setting its validation score "
                          "picks per instance): Text2Grad ends ahead of the information-matched baseline on average on "
                          "2 of 3 task instances, and at no larger final KL on 1 of 3; pooled over 15 seed pairs the "
                          "paired difference is +0.024 [-0.034, +0.082], which includes zero")
    readme_table = rt.tables()["readme"]  # the headline's studies are not repeated in the table of every benchmark
    assert "c_older_smol" in readme_table and not any(n in readme_table for n in ("a_pooled", "b_smol"))
    # a baseline that ends below the start policy is said to
    smol["matched"] = {"learned/text2grad": _matched([0.3, 0.45, 0.6], [0.1, 0.2, 0.3])}
    (results / "b_smol" / "study.json").write_text(json.dumps(smol))
    assert rt.headline_table().endswith("0 of 1; the information-matched baseline ends no better than its start "
                                        "policy on instance(s) 0.")
    # a study with no information-matched comparison gives no headline row
    (results / "b_smol" / "study.json").write_text(json.dumps({**smol, "matched": {}}))
    assert "b_smol" not in rt.headline_table() and "c_older_smol" in rt.headline_table()


def test_a_one_instance_study_with_both_sides_frontier_points_is_headlined_at_its_validation_picks(tmp_path, monkeypatch):
    """Where a one-instance study ran KL frontier points for Text2Grad and the information-matched baseline, the
    headline compares each at the setting its own validation score picks, as for a study over several instances,
    not at the sweep's setting."""
    smol = json.loads((ROOT / "benchmarks" / "results" / "method_study_smollm2_v2" / "study.json").read_text())
    point = {"final_mean_ci": (0.35, 0.3), "kl_end": (10.5, 1.0)}
    smol["matched_on_validation"] = {"learned/text2grad": {
        "point": point, "base_point": {"final_mean_ci": (0.30, 0.1), "kl_end": (1.6, 0.5)},
        "pair": {"diffs": [0.05, -0.01, 0.11], "mean": 0.05, "interval": (-0.1, 0.2), "ahead": 2, "n": 3},
        "score_sources": {"recall": -0.26, "false_facts": 0.31}, "best": ("learned/scalar_bt", 0.693)}}
    results = tmp_path / "results"
    (results / "smol").mkdir(parents=True)
    (results / "smol" / "study.json").write_text(json.dumps(smol))
    monkeypatch.setattr(rt, "RESULTS", results)
    table = rt.headline_table()
    assert "| 0 (0.362) | 0.350 | 0.300 | +0.050 [-0.100, +0.200], ahead on 2 of 3 | 10.50 vs 1.60 | " \
           "scalar PPO (Bradley-Terry RM) 0.693 |" in table
    assert ("(smol, " in table and "; each at the KL setting its validation score picks): Text2Grad ends ahead" in table
            and "recall accounts for -0.260 of the mean paired difference and false facts for +0.310" in table)


def test_the_studies_of_one_policy_are_summed_up_together_with_an_exact_sign_test():
    first = {"0": {"pair": {"diffs": [0.1, 0.2, -0.05], "mean": 0.25 / 3}, "kl": (0.5, 0.6)},
             "1": {"pair": {"diffs": [-0.1, -0.2, 0.0], "mean": -0.1}, "kl": (0.1, 0.05)}}
    second = {"0": {"pair": {"diffs": [0.3, 0.1, 0.2], "mean": 0.2}, "kl": (1.0, 0.2)}}
    assert rt.across_studies_sentence("P", [first]) is None  # one study: its own sentence says it
    # 5 ahead, 3 behind, 1 tie: p = 2 (C(8,0) + C(8,1) + C(8,2) + C(8,3)) / 2^8 = 186 / 256
    assert rt.across_studies_sentence("P", [first, second]) == (
        "P, the 2 studies together (3 task instances, each its own SFT start): Text2Grad ends ahead of the "
        "information-matched baseline on average on 2 of 3, at no larger final KL on 1 of 3, and both on 1 of 3; over "
        "all 9 seed pairs it is ahead on 5 and behind on 3 (mean paired difference +0.061; exact two-sided sign test "
        "p = 0.727).")
    # the baseline's own frontier where a study ran one: Text2Grad held to the KL of each of its points
    assert rt.across_studies_sentence("P", [first, second], [{"0": (1, 2, 0), "1": (2, 2, 2)}, None]).endswith(
        "p = 0.727); held to the KL of each point of the baseline's own KL frontier (1 study with one), ahead at 3 of "
        "4 points, at 2 of those 3 also improving on its start policy by 0.01 or more.")
    assert rt._frontier_clause([None, None]) == "" and rt._frontier_clause([{"0": (1, 2, 1)}]).endswith(
        "frontier, ahead at 1 of 2 points, at 1 of those 1 also improving on its start policy by 0.01 or more")
    # a study that did not record whether it improved on its start: the count of points ahead only
    assert rt._frontier_clause([{"0": (1, 2, None)}, {"0": (1, 1, 1)}]).endswith("ahead at 2 of 3 points")
    assert rt.sign_test_p(5, 0) == 0.0625 and rt.sign_test_p(3, 3) == 1.0 and math.isnan(rt.sign_test_p(0, 0))


def test_the_headline_says_how_the_lead_at_the_validation_picks_splits_into_recall_and_false_facts():
    """Where a study recorded each pick's recall and false facts, the policy's sentence averages the split of the
    paired difference over those instances and counts where Text2Grad's pick states fewer correct facts."""
    def inst(diff, split=None):
        return {"pair": {"diffs": [diff], "mean": diff}, "kl": (1.0, 0.1), **({"split": split} if split else {})}

    recorded = {"0": inst(0.2, {"recall": -0.1, "false_facts": 0.3}), "1": inst(0.3, {"recall": 0.02, "false_facts": 0.28})}
    older = {"0": inst(0.1)}  # summarised before the split was recorded: not counted
    assert rt.across_studies_sentence("P", [recorded, older]).endswith(
        "p = 0.25); at the validation picks (2 comparisons, one per study and task instance, where it was recorded), "
        "recall accounts for -0.040 of the mean paired difference and false facts for +0.290, and Text2Grad's pick states fewer correct facts than "
        "the baseline's on 1 of 2.")
    assert rt._split_clause([older]) == ""


def test_two_studies_that_trained_the_same_start_give_one_instance_with_both_studies_seed_pairs():
    """Two machines can train the same SFT start for a task instance: that is one instance run twice, so it counts
    once, with every seed pair of both studies and their pooled means (here behind, though the newer study alone is
    ahead)."""
    same = rt.start_key("2", {"val": {"fact_score": -0.3208333333333335, "n_false": 2.875}, "test": {}})
    assert same == rt.start_key(2, {"val": {"n_false": 2.875, "fact_score": -0.32083333333333}})  # 9 digits, any order
    assert same != rt.start_key("1", {"val": {"fact_score": -0.3208333333333335, "n_false": 2.875}})  # another task
    assert rt.start_key("2", {"test": {"fact_score": 0.1}}) is None
    newer = {"2": {"pair": {"diffs": [0.01, 0.02], "mean": 0.015}, "kl": (0.1, 0.2), "t2g": (0.3,), "base": (0.285,),
                   "sft": 0.2, "start": same},
             "0": {"pair": {"diffs": [0.1, 0.1], "mean": 0.1}, "kl": (1.0, 0.1), "t2g": (0.5,), "base": (0.4,),
                   "sft": 0.3, "start": ("0", ())}}
    older = {"2": {"pair": {"diffs": [-0.1, -0.1], "mean": -0.1}, "kl": (0.0, 0.4), "t2g": (0.2,), "base": (0.3,),
                   "sft": 0.2, "start": same}}
    sentence = rt.across_studies_sentence("P", [newer, older])
    assert sentence.startswith(
        "P, the 2 studies together (2 task instances, each its own SFT start; for 1 of them more than one study trained "
        "the same start, and their seed pairs are pooled): Text2Grad ends ahead of the information-matched baseline on "
        "average on 1 of 2, at no larger final KL on 1 of 2, and both on 0 of 2; over all 6 seed pairs it is ahead on "
        "4 and behind on 2")
    merged = rt._merge_runs_of_one_start([newer["2"], older["2"]])
    assert merged["pair"]["mean"] == pytest.approx(-0.0425) and merged["kl"] == pytest.approx((0.05, 0.3))
    assert merged["t2g"][0] == pytest.approx(0.25) and merged["base"][0] == pytest.approx(0.2925)
    # the bar is the best scalar baseline any of the studies ran on that start
    newer["2"]["best"], older["2"]["best"] = ("scalar PPO (summed span rewards)", 0.285), ("scalar PPO", 0.34)
    assert rt._merge_runs_of_one_start([newer["2"], older["2"]])["best"] == ("scalar PPO", 0.34)
    # without start keys (older study files) every instance counts on its own
    plain = [{ts: {k: v for k, v in c.items() if k != "start"} for ts, c in per.items()} for per in (newer, older)]
    assert "(3 task instances, each its own SFT start)" in rt.across_studies_sentence("P", plain)


def test_the_refresh_memory_row_quotes_each_piece_size_against_the_whole_batch():
    results = [{"micro_batch_size": 8, "peak_rss_mb": 4096, "loss_first": 2.5, "loss_last": 2.25},
               {"micro_batch_size": 2, "peak_rss_mb": 1024, "loss_first": 2.5, "loss_last": 2.25}]
    result = {"machine": "M", "date": "2026-01-01", "command": "python benchmarks/rm_refresh_memory.py",
              "results": results, "ratios": [{"micro_batch_size": 2, "peak_ratio": 0.25, "time_ratio": 0.9}]}
    row, headline = rt.rm_refresh_memory_row(result)
    assert headline == ("refresh fine-tuning in micro-batches vs whole batches of 8 (4.0 GB peak RSS): pieces of 2: "
                        "peak RSS 0.25x, 0.9x the seconds per step; losses identical to 5 decimals")
    results[1]["loss_last"] = 2.26
    assert "NOT identical" in rt.rm_refresh_memory_row(result)[1]


def test_a_study_that_only_swept_several_instances_gets_each_instances_choices(tmp_path):
    def row(chosen_lr, scores):
        tried = [{"setting": {"lr": lr, "kl": "fixed", "lam": 0.95}, "val_end": v} for lr, v in scores.items()]
        return {"chosen": {"lr": chosen_lr, "kl": "fixed", "lam": 0.95}, "tried": tried}

    study = {"pooled": {}, "identity": {"preset": "default", "iterations": 90}, "cpu": "test cpu", "date": "2026-12-02",
             "command": "python benchmarks/method_study.py --phases sweep --task_seeds 1 2",
             "instances": {"1": {"sweep": {"learned/scalar_sum": row(1e-5, {3.3e-6: 0.142, 1e-5: 0.175, 3e-5: 0.096})}},
                           "2": {"sweep": {"learned/scalar_sum": row(3.3e-6, {1e-6: -0.235, 3.3e-6: -0.227})}}}}
    (tmp_path / "method_study_x").mkdir()
    (tmp_path / "method_study_x" / "study.json").write_text(json.dumps(study))
    (what, result, machine, _), headline = rt.study_rows(tmp_path / "method_study_x")
    assert what.startswith("method study sweep (preset default, task instances 1, 2, 90 PPO iterations")
    assert result == ("instance 1: learned/scalar_sum chose lr 1e-05, KL fixed, lambda 0.95 (0.175 of 3 tried)<br>"
                      "instance 2: learned/scalar_sum chose lr 3.3e-06, KL fixed, lambda 0.95 (-0.227 of 2 tried)")
    assert headline.startswith("instance 1: learned/scalar_sum chose lr 1e-05") and machine.startswith("test cpu")


def test_a_pooled_study_row_says_how_often_text2grad_is_ahead_held_to_each_point_of_the_baselines_frontier():
    folder = ROOT / "benchmarks" / "results" / "method_study_xeon"
    study = json.loads((folder / "study.json").read_text())
    numbers = study["pooled"]["learned"]["frontier_dominance_scalar_sum"]["text2grad"]
    (_, result, _, _), heads = rt.pooled_study_rows(folder, study)
    count = f"{numbers['ahead']}/{numbers['points']} ({numbers['ahead_improving']} of them above its start policy"
    assert f"learned: Text2Grad held to each of scalar_sum's frontier points, ahead at {count} by 0.01 or more)" \
        in heads.split("; ")
    assert (f"learned critic, Text2Grad held to the KL of each point of the information-matched baseline's own KL "
            f"frontier: ahead at {numbers['ahead']} of {numbers['points']} points over 3 instances, at "
            f"{numbers['ahead_improving']} of those also above its start policy by 0.01 or more") in result
    del study["pooled"]["learned"]["frontier_dominance_scalar_sum"]  # a study whose baseline ran no frontier
    assert "scalar_sum's frontier points" not in rt.pooled_study_rows(folder, study)[1]
