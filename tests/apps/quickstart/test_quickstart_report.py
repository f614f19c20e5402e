"""Report helpers: log-prob bookkeeping (by label and by position in a span), rollout curves from samples.jsonl,
the PNGs, the results table, the recorded versions, the validation split, and the benchmark's
iterations-to-target rule."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import numpy
import pytest
import torch
from transformers import get_scheduler

from text2grad.apps.quickstart.pipeline import STAGES, SFT_WARMUP_STEPS, _sft_schedule_args, stage_data, start_policy_note
from text2grad.apps.quickstart.presets import PRESETS, resolve
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
from text2grad.apps.quickstart.report import (
    logprob_shift,
    logprob_shift_by_position,
    plot_confusion,
    plot_curves,
    rollout_curves,
    token_logprobs,
)
from text2grad.apps.quickstart.results import (
    describe_feedback_errors,
    feedback_error_rates,
    installed_versions,
    machine_speed,
    print_results,
    read_lock,
    results_table,
    start_policy_name,
)
from text2grad.apps.quickstart.task import FactCritic, TaskConfig, generate_task

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from quickstart_modes import first_reaching  # noqa: E402


def test_token_logprobs_match_a_manual_softmax(bpe_tokenizer, tiny_llama):
    prompt = bpe_tokenizer("The author wrote")["input_ids"]
    response = bpe_tokenizer(" a novel", add_special_tokens=False)["input_ids"]
    got = token_logprobs(tiny_llama.eval(), prompt, response)
    with torch.no_grad():
        logits = tiny_llama(input_ids=torch.tensor([prompt + response])).logits[0]
    want = [float(torch.log_softmax(logits[len(prompt) - 1 + i], -1)[t]) for i, t in enumerate(response)]
    assert len(got) == len(response) and got == pytest.approx(want, abs=1e-5)


def test_logprob_shift_groups_tokens_by_label():
    items = [
        {"labels": [1, -1, 0], "logp": {"sft": [-1.0, -1.0, -1.0], "t2g": [-0.5, -3.0, -1.0]}},
        {"labels": [-1], "logp": {"sft": [-2.0], "t2g": [-3.0]}},
    ]
    out = logprob_shift(items, "t2g")
    assert out["good"] == pytest.approx(0.5) and out["poor"] == pytest.approx(-1.5) and out["neutral"] == 0.0
    assert math.isnan(logprob_shift([{"labels": [0], "logp": {"sft": [0.0], "t2g": [0.0]}}], "t2g")["good"])


def test_rollout_curves_score_every_logged_rollout(tmp_path):
    rec = generate_task(TaskConfig(seed=1, n_train=1, n_rl=2, n_eval=1))["rl"]
    critic = FactCritic(records=rec)
    rows = [
        {"iteration": 1, "prompt": rec[0]["prompt"], "response": rec[0]["reference"],
         "feedback": {"critique": "", "good_spans": ["a", "b"], "poor_spans": [], "error": None}},
        {"iteration": 1, "prompt": rec[1]["prompt"], "response": " nothing",
         "feedback": {"critique": "", "good_spans": [], "poor_spans": [], "error": "invalid JSON"}},
        {"iteration": 2, "prompt": rec[1]["prompt"], "response": rec[1]["reference"],
         "feedback": {"critique": "", "good_spans": ["a"], "poor_spans": ["b", "c", "d"], "error": None}},
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = rollout_curves(path, critic)
    assert [p["iteration"] for p in curve] == [1, 2]
    assert curve[0]["rm_score"] == pytest.approx(0.5)  # (1 + 0) / 2: the failed feedback scores 0
    assert curve[1]["rm_score"] == pytest.approx(-0.5)
    assert curve[0]["true_fact_score"] == pytest.approx(0.5)  # reference 1.0 and " nothing" 0.0
    assert curve[1]["true_fact_score"] == pytest.approx(1.0)
    assert math.isnan(rollout_curves(path)[0]["true_fact_score"])  # no critic: unknown, not zero
    assert rollout_curves(tmp_path / "missing.jsonl", critic) == []


def test_plot_curves_writes_a_png(tmp_path):
    curves = {m: [{"iteration": 0, "fact_score": 0.1, "rougeL": 0.3}, {"iteration": 5, "fact_score": s, "rougeL": 0.4}]
              for m, s in (("nl_gradient", 0.4), ("scalar", 0.2))}
    rollouts = {m: [{"iteration": i, "rm_score": 0.1 * i, "true_fact_score": 0.05 * i} for i in range(1, 6)] for m in curves}
    metrics = {m: [{"iteration": i, "objective/kl": 0.2 * i} for i in range(1, 6)] for m in curves}
    png = plot_curves(tmp_path / "c.png", curves, rollouts, metrics)
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


def test_a_given_start_policy_is_named_as_what_it_is_and_no_sft_is_announced(capsys):
    """--preset smollm2 starts PPO from SmolLM2-135M-Instruct as given: no "tiny Llama, SFT" stage, no "SFT policy"."""
    given = QuickstartConfig(preset="smollm2", sft_model="/cache/text2grad/assets/smollm2-135m-instruct-0.1.2-v1")
    name = start_policy_name(asdict(given))
    assert name == "start policy (SmolLM2-135M-Instruct)"
    note = start_policy_note(given)
    assert note == "start policy (SmolLM2-135M-Instruct), as given: no SFT"
    results = {"sft": {"fact_score": -0.037}, "nl_gradient": {"fact_score": 0.05}}
    table = results_table(results, name)
    assert "| start policy (SmolLM2-135M-Instruct) | -0.037 |" in table and "SFT" not in table
    print_results({"config": asdict(given), "results": results, "curves": {}, "stage_seconds": {}, "total_seconds": 1.0,
                   "png": "c.png", "html": "index.html"})
    assert "SFT policy" not in capsys.readouterr().out
    built = QuickstartConfig(preset="ci")
    assert start_policy_name(asdict(built)) == "SFT policy"
    assert start_policy_note(built) == "tokenizer, tiny Llama, SFT (cached after the first run)"
    assert "start policy" in STAGES and not any("SFT" in stage for stage in STAGES)


def test_feedback_failures_during_ppo_are_measured_per_iteration_and_the_guard_is_on_outside_ci(tmp_path):
    rows = [{"iteration": 1, "samples/batch": 8.0, "samples/feedback_error": 0.0, "samples/score_error": 0.0},
            {"iteration": 2, "samples/batch": 8.0, "samples/feedback_error": 3.0, "samples/score_error": 0.0},
            {"iteration": 3, "samples/batch": 8.0, "samples/feedback_error": 1.0, "samples/score_error": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rates = feedback_error_rates({"scalar": tmp_path / "metrics.jsonl", "nl_gradient": tmp_path / "absent.jsonl"})
    assert rates == {"scalar": [0.0, 0.375, 0.25], "nl_gradient": []}
    assert describe_feedback_errors(rates, 1.0) == (
        "feedback failed in 2 of 3 PPO iterations (worst iteration 38% of its samples); the guard was off "
        "(max_feedback_error_rate 1.0: a failed sample gets zero reward)")
    assert describe_feedback_errors(rates, 0.2).endswith("PPO stops above max_feedback_error_rate 0.2")
    # the guard is on in every preset but ci, whose tiny reward model fails on up to 3 of 8 samples of an iteration
    assert {name: preset["max_feedback_error_rate"] for name, preset in PRESETS.items()} == {
        "ci": 1.0, "default": 0.2, "smollm2": 0.2, "large": 0.2}


def test_results_table_and_presets():
    table = results_table({"sft": {"fact_score": 0.25, "bleu": 10.0}, "nl_gradient": {"fact_score": 0.5, "bleu": 12.5}})
    assert "| SFT policy | 0.250 | 10.000 |" in table and "| Text2Grad (NL-gradient PPO) | 0.500 | 12.500 |" in table
    cfg = resolve(QuickstartConfig(preset="ci", sft_steps=3))
    assert cfg.sft_steps == 3 and cfg.hidden_size == 32 and cfg.ppo_seed == cfg.seed
    assert cfg.policy_sft_steps == 1  # PPO starts halfway through SFT unless told otherwise
    with pytest.raises(ValueError, match="policy_sft_steps must be between 1 and sft_steps"):
        resolve(QuickstartConfig(preset="ci", sft_steps=4, policy_sft_steps=5))
    with pytest.raises(ValueError, match="modes"):
        resolve(QuickstartConfig(modes=["ppo"]))


def test_first_reaching_is_the_first_positive_iteration_at_or_above_target():
    pts = [(0, 0.5), (5, 0.2), (10, 0.41), (15, 0.6)]
    assert first_reaching(pts, 0.4) == 10
    assert first_reaching(pts, 0.7) is None
    assert first_reaching(pts, 0.1) == 5  # iteration 0 (the SFT policy) never counts


def test_logprob_shift_by_position_separates_the_first_token_of_a_span_from_its_continuation():
    items = [
        # labels: neutral, poor run of 3, neutral, good run of 2, poor run of 1 right after the good run
        {"labels": [0, -1, -1, -1, 0, 1, 1, -1],
         "logp": {"sft": [0.0] * 8, "t2g": [-0.1, -2.0, 0.5, 0.3, -0.1, 0.2, 0.0, -1.0]}},
    ]
    out = logprob_shift_by_position(items, "t2g")
    assert out["poor_first"] == {"mean": pytest.approx(-1.5), "n": 2}  # -2.0 and -1.0 (a run starts after good)
    assert out["poor_inside"] == {"mean": pytest.approx(0.4), "n": 2}
    assert out["good_first"] == {"mean": pytest.approx(0.2), "n": 1}
    assert out["good_inside"] == {"mean": pytest.approx(0.0), "n": 1}
    assert out["neutral"] == {"mean": pytest.approx(-0.1), "n": 2}
    # the by-label means are the n-weighted means of the positions
    whole = logprob_shift(items, "t2g")
    assert whole["poor"] == pytest.approx((2 * -1.5 + 2 * 0.4) / 4)


def test_plot_confusion_writes_a_png(tmp_path):
    png = plot_confusion(tmp_path / "c.png", [[5, 1, 2], [0, 3, 4], [1, 0, 20]], ["positive", "negative", "neutral"])
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5_000


def test_installed_versions_compare_with_the_lock(tmp_path):
    lock = tmp_path / "constraints.txt"
    lock.write_text("# comment\nNumPy==0.0.1\npytest==%s\nsome_missing-pkg==1.0\n" % pytest.__version__)
    assert read_lock(lock) == {"numpy": "0.0.1", "pytest": pytest.__version__, "some-missing-pkg": "1.0"}
    v = installed_versions(lock)
    assert v["differs_from_lock"] == {"numpy": [numpy.__version__, "0.0.1"]}  # pytest matches; the missing one is absent
    assert v["packages"]["torch"] == torch.__version__ and v["lock_file"] == "constraints.txt"
    assert "pytest" not in v["missing_from_lock"] and "torch" not in v["missing_from_lock"]
    again = installed_versions(lock)
    assert again["environment_sha256"] == v["environment_sha256"] and len(v["environment_sha256"]) == 16
    assert installed_versions(tmp_path / "absent.txt")["lock_file"] is None


def test_machine_speed_is_a_positive_matmul_rate_that_follows_the_thread_count():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        speed = machine_speed(size=64, repeats=3, min_seconds=0.01)
    finally:
        torch.set_num_threads(before)
    assert math.isfinite(speed["matmul_gflops"]) and speed["matmul_gflops"] > 0
    assert speed["matmul_size"] == 64 and speed["torch_threads"] == 1 and speed["cpu_count"] >= 1
    assert isinstance(speed["cpu"], str) and speed["cpu"]
    # a 64x64 matmul is 2 * 64**3 flops: the rate is in GFLOP/s, far below 10 TFLOP/s on any CPU thread
    assert speed["matmul_gflops"] < 10_000


def test_a_shortened_sft_run_has_every_learning_rate_of_the_longer_one():
    cfg = resolve(QuickstartConfig(preset="default", sft_steps=600, policy_sft_steps=600, sft_decay_steps=1200))
    args = _sft_schedule_args(cfg)
    assert args[:2] == ["--lr_scheduler_type", "polynomial"]

    def learning_rates(name: str, steps: int, **kwargs) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.sft_learning_rate)
        sched = get_scheduler(name, opt, num_warmup_steps=SFT_WARMUP_STEPS, num_training_steps=steps, scheduler_specific_kwargs=kwargs)
        out = []
        for _ in range(cfg.sft_steps):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    short = learning_rates("polynomial", cfg.sft_steps, **json.loads(args[3]))
    long = learning_rates("linear", cfg.sft_decay_steps)
    assert short == pytest.approx(long, rel=1e-9, abs=1e-12)
    assert long[-1] > 0.45 * cfg.sft_learning_rate  # stopped halfway down the decay, not at zero
    # without a longer decay the schedule is the plain linear one; a decay shorter than the run is refused
    assert _sft_schedule_args(resolve(QuickstartConfig(preset="ci"))) == ["--lr_scheduler_type", "linear"]
    with pytest.raises(ValueError, match="sft_decay_steps"):
        resolve(QuickstartConfig(preset="default", sft_steps=600, sft_decay_steps=300))


def test_validation_split_is_disjoint_and_leaves_the_other_splits_unchanged(tmp_path):
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path), n_val=5))
    paths = stage_data(cfg, tmp_path)
    splits = {k: [json.loads(l) for l in p.read_text().splitlines()] for k, p in paths.items()}
    assert [len(splits[k]) for k in ("train", "rl", "eval", "val")] == [cfg.n_train, cfg.n_rl, cfg.n_eval, 5]
    prompts = [r["prompt"] for k in splits for r in splits[k]]
    assert len(set(prompts)) == len(prompts)
    assert [r["id"] for r in splits["val"]] == [f"val-{i}" for i in range(5)]
    plain = generate_task(TaskConfig(seed=cfg.seed, n_train=cfg.n_train, n_rl=cfg.n_rl, n_eval=cfg.n_eval))
    assert plain == {k: splits[k] for k in ("train", "rl", "eval")}  # the validation posts changed nothing else
    with pytest.raises(ValueError, match="n_val"):
        resolve(QuickstartConfig(preset="ci", n_val=0))


def test_installed_versions_reads_the_copy_python_imports_not_a_shadowed_vendored_one(tmp_path, monkeypatch):
    first, vendored = tmp_path / "site", tmp_path / "vendor"
    for folder, version in ((first, "26.3"), (vendored, "24.2")):
        info = folder / f"packaging-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: packaging\nVersion: {version}\n")
    lock = tmp_path / "constraints.txt"
    lock.write_text("packaging==26.3\n")
    monkeypatch.setattr(sys, "path", [str(first), *sys.path, str(vendored)])  # a vendor folder appended last
    got = installed_versions(lock)
    assert "packaging" not in got["differs_from_lock"]
