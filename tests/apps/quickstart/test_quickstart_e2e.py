"""The reduced quickstart end to end (``--preset ci``): every phase runs through its real CLI, the numbers equal
the committed ones (tests/apps/quickstart/expected_ci_results.json), the report opens in a real headless browser,
a second run reuses the cached policy and reward model, and a third run pointed at given data, policy and reward
model skips the phases that would build them.

The expected numbers are those of the locked install (constraints.txt) with one torch thread. After a deliberate
change of numbers (a dependency, the trainer, the presets), regenerate them with
``TEXT2GRAD_UPDATE_EXPECTED=1 python -m pytest tests/apps/quickstart/test_quickstart_e2e.py`` and commit the file.
"""

from __future__ import annotations

import glob
import json
import math
import os
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
import torch

from tests.apps.quickstart.browser import render_dom, screenshot
from text2grad.apps.quickstart import main
from text2grad.apps.quickstart.pipeline import STAGES
from text2grad.apps.quickstart.presets import PRESETS
from text2grad.apps.quickstart.results import read_lock

EXPECTED = Path(__file__).with_name("expected_ci_results.json")
# Metrics that measure the machine, not the computation.
_VOLATILE = ("time/", "throughput", "seconds", "memory", "rss")


def deterministic_numbers(out: Path) -> dict[str, Any]:
    """What a ci run computes that does not depend on the machine's speed: the eval table and curves, every PPO
    metric per iteration (losses, KL, rewards, entropy, lengths), and the reward model's held-out confusion counts.
    Floats are rounded to 6 decimals (the JSON files store more digits than any table shows)."""
    summary = json.loads((out / "results.json").read_text())

    def clean(x: Any) -> Any:
        if isinstance(x, float):
            return None if math.isnan(x) else round(x, 6)
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if not any(t in k for t in _VOLATILE)}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    ppo = {m: [clean(json.loads(l)) for l in (out / f"ppo-{m}" / "metrics.jsonl").read_text().splitlines()]
           for m in summary["curves"]}
    rm = summary["reward_model_eval"]
    return clean({
        "results": summary["results"], "curves": summary["curves"], "ppo_metrics": ppo,
        "reward_model": {"json_validity_rate": rm["json_validity_rate"], "token_confusion": rm["token_confusion"]["counts"]},
        "logprob_shift": summary["logprob_shift"],
    })


# Float metrics of the PPO update differ in the 6th decimal between CPU families (vectorized reductions sum in
# another order); a clip fraction counts tokens past a threshold, so such a difference can move a token across it.
REL_TOL, ABS_TOL, CLIPFRAC_ABS_TOL = 1e-4, 1e-5, 0.02


def assert_close(got: Any, want: Any, path: str = "") -> None:
    """``got == want`` for everything but floats, which agree within REL_TOL/ABS_TOL (CLIPFRAC_ABS_TOL for clip
    fractions)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: keys {sorted(set(got) ^ set(want))} differ"
        for k in want:
            assert_close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        tol = CLIPFRAC_ABS_TOL if "clipfrac" in path else ABS_TOL
        assert math.isclose(got, want, rel_tol=REL_TOL, abs_tol=tol), f"{path}: {got} != {want}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def test_assert_close_tolerates_rounding_and_nothing_more():
    assert_close({"a": [1.0, 0.123456], "value/clipfrac": 0.0}, {"a": [1.0, 0.123457], "value/clipfrac": 0.0022})
    for bad in ({"a": [1.0, 0.1236], "value/clipfrac": 0.0}, {"a": [1.0], "value/clipfrac": 0.0},
                {"a": [1.0, 0.123456], "value/clipfrac": 0.05}, {"b": [1.0, 0.123456], "value/clipfrac": 0.0}):
        with pytest.raises(AssertionError):
            assert_close(bad, {"a": [1.0, 0.123457], "value/clipfrac": 0.0})


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_ci_preset_runs_every_phase_matches_the_committed_numbers_and_reads_in_a_browser(tmp_path, capsys, one_thread):
    out, cache = tmp_path / "run", tmp_path / "cache"
    argv = ["--preset", "ci", "--output_dir", str(out), "--cache_dir", str(cache), "--n_report_samples", "3"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    ci = PRESETS["ci"]
    its = list(range(0, ci["ppo_iterations"] + 1, ci["eval_every"]))

    # the run ends with the results table and the paths of the PNG and the HTML report
    assert "| SFT policy |" in printed and "| scalar PPO |" in printed and "| Text2Grad (NL-gradient PPO) |" in printed
    assert f"curves: {out / 'report' / 'curves.png'}" in printed and f"report: {out / 'report' / 'index.html'}" in printed
    for n in range(1, 8):
        assert f"[{n}/7]" in printed

    # the numbers are the committed ones (same lock, same code): compare everything deterministic
    got = deterministic_numbers(out)
    if os.environ.get("TEXT2GRAD_UPDATE_EXPECTED") == "1":
        EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    expected = json.loads(EXPECTED.read_text())
    assert got["results"] == expected["results"]  # decoded text scored: exact on every CPU measured so far
    assert got["curves"] == expected["curves"]
    assert got["reward_model"] == expected["reward_model"]
    assert_close(got["ppo_metrics"], expected["ppo_metrics"], "ppo_metrics")
    assert_close(got, expected)

    # the versions that produced it are in the results file
    summary = json.loads((out / "results.json").read_text())
    versions = summary["versions"]
    assert versions["packages"]["torch"] == torch.__version__ and versions["python"]
    assert versions["lock_file"] == "constraints.txt" and versions["lock_sha256"]
    pins = read_lock()
    assert versions["packages"]["transformers"] == pins["transformers"]  # the lock was installed
    assert versions["differs_from_lock"] == {}
    # so are this machine's speed (printed first) and the seconds of every stage, to compare machines
    speed = summary["machine_speed"]
    assert speed["matmul_gflops"] > 0 and speed["torch_threads"] == 1 and speed["cpu_count"] >= 1
    assert f"machine speed: {speed['matmul_gflops']:.1f} GFLOP/s" in printed.split("[1/7]")[0]
    assert set(summary["stage_seconds"]) == set(STAGES) and all(t >= 0 for t in summary["stage_seconds"].values())

    png = (out / "report" / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (out / "report" / "rm_confusion.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "report" / "index.html").read_text()
    assert page.count("<h3>") == 3 and "reward model critique" in page and "class='tokens'" in page
    assert "http://" not in page and "https://" not in page  # self-contained
    assert "<pre>{" not in page  # the reward-model evaluation is tables, not a JSON dump

    # a real browser builds the page with every section, and draws it
    dom = render_dom(out / "report" / "index.html")
    for anchor, title in (("results", "Results"), ("reward-model", "Reward model on held-out annotations"),
                          ("logprob", "Mean change of token log-probability"), ("curves", "Curves"),
                          ("samples", "Samples"), ("provenance", "Versions and commands")):
        assert f'id="{anchor}"' in dom and title in dom, anchor
    assert "poor first" in dom and "By the critic's true labels" in dom
    # the sentences under the tables are the ones generated from this run's numbers
    assert summary["interpretation"] and all(sentence.split(":")[0] in dom for sentence in summary["interpretation"])
    assert versions["environment_sha256"] in dom and "python -m policy_optimization.train" in dom
    assert 'src="curves.png"' in dom and 'src="rm_confusion.png"' in dom
    shot = screenshot(out / "report" / "index.html", tmp_path / "report.png")
    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[0] >= 3000 and pixels.shape[1] >= 1200
    assert float(pixels[..., :3].std()) > 0.05  # drawn content, not a blank page

    for name, scores in summary["results"].items():
        for key in ("fact_score", "fact_recall", "rouge1", "rougeL", "bleu"):
            assert math.isfinite(scores[key]), (name, key)
    for mode in ("nl_gradient", "scalar"):
        curve = summary["curves"][mode]
        assert [p["iteration"] for p in curve] == its
        metrics = [json.loads(l) for l in (out / f"ppo-{mode}" / "metrics.jsonl").read_text().splitlines()]
        assert [m["iteration"] for m in metrics] == list(range(1, its[-1] + 1))  # chunked PPO resumed, not restarted
        assert all(math.isfinite(m["objective/kl"]) and math.isfinite(m["reward/score_mean"]) for m in metrics)
        assert (out / f"ppo-{mode}" / "policy" / "config.json").is_file()
    # the two modes start from the same SFT policy, so their iteration-0 evaluations agree exactly
    assert summary["curves"]["nl_gradient"][0] == summary["curves"]["scalar"][0]
    assert summary["reward_model_eval"]["n_examples"] > 0
    # PPO starts from the mid-SFT checkpoint, the reward model from the end of the same SFT run
    commands = (out / "commands.sh").read_text().splitlines()
    command = {m: next(l for l in commands if f"python -m {m} " in l)
               for m in ("policy_optimization.sft", "reward_model.train", "policy_optimization.train")}
    assert f"--max_steps {ci['sft_steps']} " in command["policy_optimization.sft"]
    assert f"--save_steps {ci['sft_steps'] // 2} " in command["policy_optimization.sft"]
    assert "/policy " in command["policy_optimization.train"] and "/sft " in command["reward_model.train"]
    # grounded span decoding: every quote the reward model wrote is in the response; the free report is kept too
    assert summary["reward_model_eval"]["unmatched_span_rate"] == 0.0
    assert (out / "reward_model" / "eval-free" / "report.json").is_file()
    annotations = [json.loads(l) for l in (out / "reward_model" / "annotations.jsonl").read_text().splitlines()]
    assert all(s in a["response"] for a in annotations for s in a["good_spans"] + a["poor_spans"])
    assert (out / "commands.sh").read_text().count("python -m ") >= 5

    # a second run reuses the cached SFT policy and reward model, with both defences on: early stopping on the
    # validation split and a reward-model refresh on the first chunk's rollouts
    second = tmp_path / "second"
    assert main(["--preset", "ci", "--output_dir", str(second), "--cache_dir", str(cache), "--n_report_samples", "1",
                 "--modes", "nl_gradient", "--ppo_iterations", "2", "--eval_every", "1",
                 "--early_stopping", "true", "--rm_refresh", "true", "--rm_refresh_steps", "4"]) == 0
    printed = capsys.readouterr().out
    assert "using cached SFT policy" in printed and "using cached reward model" in printed
    assert "policy_optimization.sft" not in printed
    summary = json.loads((second / "results.json").read_text())
    sel = summary["selection"]["nl_gradient"]
    curve = summary["curves"]["nl_gradient"]
    val = [v["fact_score"] for v in sel["validation"]]
    assert [v["iteration"] for v in sel["validation"]] == [0, 1, 2] == [p["iteration"] for p in curve]
    best = val.index(max(val))  # the first best point wins
    assert sel["selected_iteration"] == best
    assert summary["results"]["nl_gradient"] == {k: v for k, v in curve[best].items() if k != "iteration"}
    run_dir = second / "ppo-nl_gradient"
    assert (run_dir / ("selected_policy" if best else "policy") / "config.json").is_file()
    # the refresh: the critic annotated chunk 1's rollouts, the next chunk used the refreshed reward model
    assert sel["reward_models"][1] == str(run_dir / "rm-refresh-1" / "model") != sel["reward_models"][0]
    refreshed = [json.loads(l) for l in (run_dir / "rm-refresh-1" / "annotations.jsonl").read_text().splitlines()]
    assert len(refreshed) == ci["ppo_batch_size"] and all(r["id"].startswith("it1-") for r in refreshed)
    assert (run_dir / "rm-refresh-1" / "model" / "config.json").is_file()
    changes = (run_dir / "config_changes.jsonl").read_text()
    assert "rm-refresh-1" in changes  # the trainer logged the new critic on resume
    assert (second / "data" / "val.jsonl").is_file()

    # pointing phases at given data and models skips generation, SFT, annotation and reward-model training
    (policy_dir,) = glob.glob(str(cache / "policy-*" / "policy"))
    (rm_dir,) = glob.glob(str(cache / "reward_model-*" / "model"))
    given = tmp_path / "given"
    assert main(["--preset", "ci", "--output_dir", str(given), "--cache_dir", str(tmp_path / "empty_cache"),
                 "--data_dir", str(out / "data"), "--sft_model", policy_dir, "--reward_model", rm_dir,
                 "--modes", "scalar", "--ppo_iterations", "1", "--n_report_samples", "1"]) == 0
    printed = capsys.readouterr().out
    assert f"starting from {policy_dir} as given (no SFT in this run)" in printed
    assert f"using the given reward model {rm_dir}" in printed
    ran = (given / "commands.sh").read_text()
    assert "policy_optimization.sft" not in ran and "reward_model.train" not in ran and "annotation" not in ran
    assert f"--model_name_or_path {policy_dir} " in ran and rm_dir in ran
    assert not (tmp_path / "empty_cache").exists() or not any((tmp_path / "empty_cache").iterdir())
    assert not (given / "data").exists()  # the given split files were used as they are
    assert math.isfinite(json.loads((given / "results.json").read_text())["results"]["scalar"]["fact_score"])
