"""A reduced quickstart end to end (``--preset ci``): every phase runs through its real CLI, the artifacts exist,
the numbers are finite, a second run reuses the cached policy and reward model, and a third run pointed at given
data, policy and reward model skips the phases that would build them."""

from __future__ import annotations

import glob
import json
import math

import pytest

from text2grad.apps.quickstart import main


@pytest.mark.slow
def test_ci_preset_runs_every_phase_and_writes_the_report(tmp_path, capsys):
    out, cache = tmp_path / "run", tmp_path / "cache"
    argv = ["--preset", "ci", "--output_dir", str(out), "--cache_dir", str(cache), "--ppo_iterations", "2",
            "--eval_every", "1", "--n_report_samples", "3"]
    assert main(argv) == 0
    printed = capsys.readouterr().out

    # the run ends with the results table and the paths of the PNG and the HTML report
    assert "| SFT policy |" in printed and "| scalar PPO |" in printed and "| Text2Grad (NL-gradient PPO) |" in printed
    assert f"curves: {out / 'report' / 'curves.png'}" in printed and f"report: {out / 'report' / 'index.html'}" in printed
    for n in range(1, 8):
        assert f"[{n}/7]" in printed

    png = (out / "report" / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    page = (out / "report" / "index.html").read_text()
    assert page.count("<h3>") == 3 and "reward model critique" in page and "class='tokens'" in page
    assert "http://" not in page and "https://" not in page  # self-contained

    summary = json.loads((out / "results.json").read_text())
    assert set(summary["results"]) == {"sft", "nl_gradient", "scalar"}
    for name, scores in summary["results"].items():
        for key in ("fact_score", "fact_recall", "rouge1", "rougeL", "bleu"):
            assert math.isfinite(scores[key]), (name, key)
    for mode in ("nl_gradient", "scalar"):
        curve = summary["curves"][mode]
        assert [p["iteration"] for p in curve] == [0, 1, 2]
        assert all(math.isfinite(p["fact_score"]) for p in curve)
        metrics = [json.loads(l) for l in (out / f"ppo-{mode}" / "metrics.jsonl").read_text().splitlines()]
        assert [m["iteration"] for m in metrics] == [1, 2]  # chunked PPO resumed instead of restarting
        assert all(math.isfinite(m["objective/kl"]) and math.isfinite(m["reward/score_mean"]) for m in metrics)
        assert (out / f"ppo-{mode}" / "policy" / "config.json").is_file()
    # the two modes start from the same SFT policy, so their iteration-0 evaluations agree exactly
    assert summary["curves"]["nl_gradient"][0] == summary["curves"]["scalar"][0]
    assert summary["reward_model_eval"]["n_examples"] > 0
    # PPO starts from the mid-SFT checkpoint, the reward model from the end of the same SFT run
    commands = (out / "commands.sh").read_text().splitlines()
    command = {m: next(l for l in commands if f"python -m {m} " in l)
               for m in ("policy_optimization.sft", "reward_model.train", "policy_optimization.train")}
    assert "--max_steps 12 " in command["policy_optimization.sft"] and "--save_steps 6 " in command["policy_optimization.sft"]
    assert "/policy " in command["policy_optimization.train"] and "/sft " in command["reward_model.train"]
    # grounded span decoding: every quote the reward model wrote is in the response; the free report is kept too
    assert summary["reward_model_eval"]["unmatched_span_rate"] == 0.0
    assert (out / "reward_model" / "eval-free" / "report.json").is_file()
    annotations = [json.loads(l) for l in (out / "reward_model" / "annotations.jsonl").read_text().splitlines()]
    assert all(s in a["response"] for a in annotations for s in a["good_spans"] + a["poor_spans"])
    assert (out / "commands.sh").read_text().count("python -m ") >= 5

    # a second run reuses the cached SFT policy and reward model
    assert main(argv + ["--modes", "nl_gradient", "--ppo_iterations", "1"]) == 0
    printed = capsys.readouterr().out
    assert "using cached SFT policy" in printed and "using cached reward model" in printed
    assert "policy_optimization.sft" not in printed

    # pointing phases at given data and models skips generation, SFT, annotation and reward-model training
    (policy_dir,) = glob.glob(str(cache / "policy-*" / "policy"))
    (rm_dir,) = glob.glob(str(cache / "reward_model-*" / "model"))
    given = tmp_path / "given"
    assert main(["--preset", "ci", "--output_dir", str(given), "--cache_dir", str(tmp_path / "empty_cache"),
                 "--data_dir", str(out / "data"), "--sft_model", policy_dir, "--reward_model", rm_dir,
                 "--modes", "scalar", "--ppo_iterations", "1", "--n_report_samples", "1"]) == 0
    printed = capsys.readouterr().out
    assert f"using the given SFT policy {policy_dir}" in printed and f"using the given reward model {rm_dir}" in printed
    ran = (given / "commands.sh").read_text()
    assert "policy_optimization.sft" not in ran and "reward_model.train" not in ran and "annotation" not in ran
    assert f"--model_name_or_path {policy_dir} " in ran and rm_dir in ran
    assert not (tmp_path / "empty_cache").exists() or not any((tmp_path / "empty_cache").iterdir())
    assert not (given / "data").exists()  # the given split files were used as they are
    assert math.isfinite(json.loads((given / "results.json").read_text())["results"]["scalar"]["fact_score"])
