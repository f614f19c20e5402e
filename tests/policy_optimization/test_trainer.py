"""Text2Grad PPO trainer on a tiny CPU model: every mode trains, failures are counted, NaN stops cleanly,
resume reproduces an uninterrupted run, and a rewarded token becomes more likely."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal

import accelerate.tracking
import pytest
import torch
from accelerate.tracking import GeneralTracker
from accelerate.utils import LoggerType
from tests.policy_optimization.po_testlib import first_and_last_words
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.models import ValueModel
from policy_optimization.vllm_rollouts import start_vllm_rollouts
from reward_model.inference import GenerativeRewardModel
import policy_optimization.trainer as trainer_module
from text2grad.core.critics import CallableFeedbackSource, build_critic
from policy_optimization.trainer import (
    FeedbackFailureError,
    NLGradientPPOTrainer,
    NonFiniteError,
    find_latest_checkpoint,
)
from text2grad.core.feedback import Feedback
from text2grad.core.reward_options import SEQUENCE_SCORE_MODES
from text2grad.core.modeling import SPECIAL_TOKENS, build_tiny_llama
from text2grad.core.ppo_math import adaptive_kl_coef

REQUIRED_METRICS = [
    "reward/score_mean", "objective/kl", "objective/kl_coef", "policy/entropy", "policy/clipfrac", "loss/value",
    "value/explained_variance", "response/length_mean", "tokens/nonzero_reward_share", "spans/unmatched_rate",
    "samples/empty", "samples/feedback_error", "samples/no_matched_span", "time/generation", "time/feedback",
    "time/rewards", "time/update", "time/total",
]


def trainable_snapshot(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("mode", ["nl_gradient", "dense", "score_spread"])
def test_the_sequence_score_is_computed_only_in_the_modes_that_use_it(make_trainer, mode):
    """nl_gradient and dense have no sequence score: a scalar reward model given as scalar_source is never run."""
    calls = []

    def counting_score(prompts, responses):
        calls.append(len(responses))
        return [0.5] * len(responses)

    make_trainer(CallableFeedbackSource(first_and_last_words), reward_mode=mode, score_fn=counting_score).train()
    assert (sum(calls) > 0) == (mode in SEQUENCE_SCORE_MODES), (mode, calls)


@pytest.mark.parametrize("mode", ["nl_gradient", "scalar", "dense", "mixed"])
def test_each_reward_mode_trains_with_finite_metrics(make_trainer, mode, tmp_path):
    score_fn = (lambda prompts, responses: [0.5] * len(responses)) if mode == "mixed" else None
    trainer = make_trainer(CallableFeedbackSource(first_and_last_words), reward_mode=mode, score_fn=score_fn)
    before = trainable_snapshot(trainer)
    trainer.train()
    after = trainable_snapshot(trainer)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert any("lora_" in n for n in changed), "the policy's LoRA weights did not change"
    assert any(n.startswith("value_model.") for n in changed), "the value model did not change"

    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2]
    for m in lines:
        missing = [k for k in REQUIRED_METRICS if k not in m]
        assert not missing, missing
        for k, v in m.items():
            assert v is None or math.isfinite(v), (k, v)
        assert m["samples/batch"] == 4
    share = [m["tokens/nonzero_reward_share"] for m in lines]
    if mode == "scalar":
        assert all(m["spans/unmatched_rate"] is None for m in lines)  # no alignment in scalar mode
        assert all(0 < s <= 1 / 8 + 1e-9 for s in share)  # one rewarded token (the last) per 8-token response
    else:
        assert all(m["spans/unmatched_rate"] == 0.0 for m in lines)  # the critic quotes exact words
        assert all(s > 1 / 8 for s in share)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all("rewarded_tokens" in s for s in samples)
    assert (tmp_path / "run" / "policy" / "adapter_config.json").is_file()
    assert (tmp_path / "run" / "value_model" / "value_head.safetensors").is_file()
    assert find_latest_checkpoint(tmp_path / "run").name == "checkpoint-2"


def test_failures_are_counted_and_training_goes_on(make_trainer):
    calls = {"n": 0}

    class Flaky:
        def feedback(self, prompts, responses):
            calls["n"] += 1
            if calls["n"] == 1:
                raise ConnectionError("critic unreachable")
            out = [first_and_last_words(p, r) for p, r in zip(prompts, responses)]
            out[0] = Feedback.failed("unparseable critique")
            out[1] = Feedback(good_spans=("not in the response at all",))
            return out

    trainer = make_trainer(Flaky(), max_feedback_error_rate=1.0)  # count every failure, never stop
    first = trainer.step()
    assert first["samples/source_error"] == 4 and first["samples/feedback_error"] == 4
    assert first["reward/score_mean"] == 0.0  # no reward at all from a source that raised
    second = trainer.step()
    assert second["samples/source_error"] == 0
    assert second["samples/feedback_error"] == 1 and second["samples/no_matched_span"] >= 1
    assert second["spans/unmatched_rate"] > 0
    for v in (*first.values(), *second.values()):
        assert v is None or math.isfinite(v)

    class WrongLength:
        def feedback(self, prompts, responses):
            return [Feedback()]

    trainer.critic = WrongLength()
    with pytest.raises(TypeError, match="one per pair"):
        trainer.step()


def test_nonfinite_rewards_stop_with_a_clear_error_and_keep_the_clean_checkpoint(make_trainer, tmp_path):
    """The emergency checkpoint must not replace checkpoint-<step> of the last good iteration: that state has not
    drawn the failing batch yet, so --resume auto retries the batch instead of skipping it."""
    batches: list[list[str]] = []

    def inf_on_second_batch(prompts, responses):
        batches.append(list(prompts))
        return [float("inf") if len(batches) == 2 else 0.0] + [0.0] * (len(responses) - 1)

    source = CallableFeedbackSource(first_and_last_words)
    trainer = make_trainer(source, reward_mode="mixed", score_fn=inf_on_second_batch, save_steps=1)
    with pytest.raises(NonFiniteError, match=r"non-finite values at iteration 2 .*score rewards \(rows \[0\]\)") as err:
        trainer.train()
    run = tmp_path / "run"
    emergency, clean = run / "checkpoint-1-nonfinite", run / "checkpoint-1"
    assert f"saved for inspection to {emergency}" in str(err.value)
    assert f"--resume auto ignores it and continues from {clean}" in str(err.value)
    assert (emergency / "model.safetensors").is_file()
    clean_state = json.loads((clean / "trainer_state.json").read_text())
    assert (clean_state["step"], clean_state["data_pos"]) == (1, 4)  # untouched: before the bad batch was drawn
    assert json.loads((emergency / "trainer_state.json").read_text())["data_pos"] == 8
    assert find_latest_checkpoint(run) == clean
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]

    resumed = make_trainer(source, reward_mode="mixed", score_fn=inf_on_second_batch, save_steps=1, resume="auto")
    resumed.train()
    assert len(batches) == 3 and batches[2] == batches[1]  # the failed batch was retried, not skipped
    assert resumed.state.step == 2 and find_latest_checkpoint(run).name == "checkpoint-2"
    assert emergency.is_dir()  # rotation leaves the emergency checkpoint for the user to inspect


def test_nonfinite_loss_is_caught_during_the_update(make_trainer, tmp_path, monkeypatch):
    trainer = make_trainer(CallableFeedbackSource(first_and_last_words))
    real = trainer_module.value_loss
    monkeypatch.setattr(trainer_module, "value_loss", lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]))
    with pytest.raises(NonFiniteError, match="during the PPO update.*no clean checkpoint yet"):
        trainer.step()
    assert (tmp_path / "run" / "checkpoint-0-nonfinite" / "trainer_state.json").is_file()
    assert find_latest_checkpoint(tmp_path / "run") is None  # --resume auto would start over, not load it


@pytest.mark.parametrize(
    "options",
    [{"whiten_rewards": True}, {"entropy_coef": 0.05}, {"kl_estimator": "k3"}, {"gradient_accumulation_steps": 2},
     {"kl_horizon_unit": "iterations"}],
    ids=["whiten_rewards", "entropy_coef", "k3", "grad_accum", "horizon_in_iterations"],
)
def test_less_used_options_train_and_the_kl_controller_follows_its_formula(make_trainer, tmp_path, options):
    # A short horizon so the controller visibly moves kl_coef in one iteration; in episodes one iteration is the
    # batch (4 rollouts) of controller steps, in iterations it is one.
    options = {"kl_horizon_unit": "episodes", **options}
    trainer = make_trainer(CallableFeedbackSource(first_and_last_words), adaptive_kl=True, kl_horizon=10, **options)
    trainer.train()
    first, second = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for m in (first, second):
        for k, v in m.items():
            assert v is None or math.isfinite(v), (k, v)
    steps = 4 if options["kl_horizon_unit"] == "episodes" else 1
    expected = adaptive_kl_coef(first["objective/kl_coef"], first["objective/kl"], 6.0, steps, 10)
    assert first["objective/kl_coef"] == 0.05 and expected != pytest.approx(0.05)
    assert second["objective/kl_coef"] == pytest.approx(expected, rel=1e-12)
    if not options.get("whiten_rewards"):
        for m in (first, second):  # the KL term is the only thing between score and total reward
            assert m["reward/total_mean"] == pytest.approx(m["reward/score_mean"] - m["objective/kl_coef"] * m["objective/kl"], abs=1e-5)
    if options.get("kl_estimator") == "k3":
        assert second["objective/kl"] >= 0  # k3 is non-negative per token


@pytest.mark.parametrize("accumulation", [1, 2])
def test_single_update_per_iteration_starts_at_ratio_one(make_trainer, accumulation):
    """One epoch and one minibatch: the only optimizer step comes after every micro-batch's forward, so each
    forward sees the rollout weights and the PPO ratio is 1 (approx_kl 0, nothing clipped)."""
    trainer = make_trainer(
        CallableFeedbackSource(first_and_last_words), num_ppo_epochs=1, num_mini_batches=1,
        gradient_accumulation_steps=accumulation,
    )
    before = trainable_snapshot(trainer)
    for _ in range(2):  # also after the weights moved
        metrics = trainer.step()
        assert metrics["policy/approx_kl"] == pytest.approx(0.0, abs=1e-9)  # several updates give ~1e-5 here
        assert metrics["policy/clipfrac"] == 0.0
    after = trainable_snapshot(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_" in n)  # the update did happen


def test_progress_bar_is_shown_on_stderr(make_trainer, capsys):
    make_trainer(CallableFeedbackSource(first_and_last_words), num_iterations=1, progress_bar=True).train()
    err = capsys.readouterr().err
    assert "ppo" in err and "1/1" in err and "score=" in err


def test_report_to_sends_every_numeric_metric_to_the_tracker(make_trainer, tmp_path, monkeypatch):
    """tensorboard is not installed here, so accelerate's tensorboard tracker is replaced by a recorder; the
    trainer's own path (report_to -> Accelerator(log_with=...) -> init_trackers -> log -> end_training) is real."""
    class Recorder(GeneralTracker):
        name = "tensorboard"
        requires_logging_directory = True
        runs: list["Recorder"] = []

        def __init__(self, run_name, logging_dir, **kwargs):
            super().__init__()
            self.run_name, self.config, self.logged, self.finished = run_name, None, [], False
            Recorder.runs.append(self)

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            self.config = dict(values)

        def log(self, values, step=None, **kwargs):
            self.logged.append((step, dict(values)))

        def finish(self):
            self.finished = True

    real_find_spec = importlib.util.find_spec
    monkeypatch.setitem(accelerate.tracking.LOGGER_TYPE_TO_CLASS, "tensorboard", Recorder)
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [LoggerType.TENSORBOARD])
    with monkeypatch.context() as m:  # only while the trainer checks that the package is there
        m.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "tensorboard" else real_find_spec(name, *a))
        trainer = make_trainer(CallableFeedbackSource(first_and_last_words), report_to="tensorboard", run_name="tiny")
    trainer.train()

    (run,) = Recorder.runs
    assert run.run_name == "tiny" and run.config["report_to"] == "tensorboard" and run.config["kl_coef"] == 0.05
    assert run.finished
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [step for step, _ in run.logged] == [1, 2]
    for (_, values), line in zip(run.logged, lines):
        assert values == {k: v for k, v in line.items() if v is not None}
        assert "reward/score_mean" in values and "objective/kl" in values


def test_resume_gives_the_same_next_step_as_an_uninterrupted_run(make_trainer, tmp_path):
    source = CallableFeedbackSource(first_and_last_words)
    straight = make_trainer(source, num_iterations=3, save_steps=2, output_dir=tmp_path / "a")
    straight.train()
    expected = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[-1])
    expected_params = trainable_snapshot(straight)

    # Same config, stopped after 2 iterations (as if killed), then a fresh process resumes.
    first = make_trainer(source, num_iterations=3, save_steps=2, output_dir=tmp_path / "b")
    first.start_run()
    first.step()
    first.step()
    first.save_checkpoint()
    resumed = make_trainer(source, num_iterations=3, save_steps=2, output_dir=tmp_path / "b", resume="auto")
    resumed.train()
    assert resumed.state.step == 3
    got = json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("reward/score_mean", "objective/kl", "objective/kl_coef", "loss/policy", "loss/value", "policy/entropy", "lr"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    got_params = trainable_snapshot(resumed)
    for name, value in expected_params.items():
        assert torch.allclose(got_params[name], value, atol=1e-6), name
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2, 3]

    # A fresh run into a used directory must not silently mix runs.
    with pytest.raises(FileExistsError, match="--resume auto"):
        make_trainer(source, num_iterations=3, output_dir=tmp_path / "b").train()


def test_full_finetuning_uses_a_frozen_copy_as_reference(make_trainer):
    trainer = make_trainer(CallableFeedbackSource(first_and_last_words), use_lora=False, learning_rate=1e-3)
    assert trainer.ref_model is not None and not any(p.requires_grad for p in trainer.ref_model.parameters())
    ref_before = {n: p.clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.step()
    second = trainer.step()
    assert second["objective/kl"] != 0.0  # the policy moved away from the reference
    assert all(torch.equal(p, ref_before[n]) for n, p in trainer.ref_model.named_parameters())


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_lora_reference_is_the_policy_with_the_adapter_disabled(make_trainer, monkeypatch, precision):
    """Also under bf16 autocast: the reference forward must run in the same precision as the policy's."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
    trainer = make_trainer(CallableFeedbackSource(first_and_last_words))
    assert trainer.accelerator.mixed_precision == precision
    assert trainer.ref_model is None
    first = trainer.step()
    assert first["objective/kl"] == pytest.approx(0.0, abs=1e-5)  # LoRA B starts at zero: policy == reference
    second = trainer.step()
    assert abs(second["objective/kl"]) > 1e-6


@pytest.mark.slow
def test_rewarded_token_becomes_more_likely_and_an_untouched_one_barely_moves(tmp_path):
    """A programmatic critic praises one word wherever it appears; after PPO its probability is up while an
    equally frequent word that is never rewarded keeps its probability."""
    # A 16-token word-level vocabulary, so every word is sampled often enough to learn in a few iterations.
    words = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "fish", "bird", "rock", "rain"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + ["\u2581" + w for w in words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIAL_TOKENS)
    target, untouched = vocab["\u2581cat"], vocab["\u2581dog"]
    assert tok.decode([target, untouched]) == "cat dog"

    def praise_cat(prompt, response):
        return Feedback(critique="cat is right", good_spans=("cat",) if "cat" in response.split() else ())

    prompts = [" ".join(words[i : i + 3]) for i in range(8)]
    # Full fine-tuning: with LoRA the frozen, tiny-norm embeddings of a random 32-wide model cap how far any
    # logit can move (about 1 nat), which would test the model's capacity rather than the reward's placement.
    cfg = PPOConfig(
        output_dir=str(tmp_path / "run"), num_iterations=6, batch_size=16, num_mini_batches=2, num_ppo_epochs=2,
        response_length=4, temperature=1.0, learning_rate=2e-3, use_lora=False, kl_coef=0.01, adaptive_kl=False,
        seed=0, save_steps=0, progress_bar=False, log_samples=0,
    )
    policy = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    value = ValueModel.from_causal_lm(build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, seed=1))
    trainer = NLGradientPPOTrainer(cfg, tok, policy, None, value, CallableFeedbackSource(praise_cat), [{"prompt": p} for p in prompts])

    @torch.no_grad()
    def next_token_probs() -> torch.Tensor:
        model = trainer.policy
        model.eval()
        out = []
        for p in prompts:
            ids = torch.tensor([tok.encode(p, add_special_tokens=False)], device=model.device)  # the trainer placed it
            out.append(torch.softmax(model(input_ids=ids).logits[0, -1].float(), -1).cpu())
        return torch.stack(out).mean(0)

    before = next_token_probs()
    trainer.train()
    after = next_token_probs()
    gain = float(after[target] - before[target])
    assert after[target] > 1.8 * before[target], (float(before[target]), float(after[target]))
    assert abs(float(after[untouched] - before[untouched])) < gain / 4, (gain, float(after[untouched] - before[untouched]))
    others = [i for i in range(len(vocab)) if i >= 4 and i != target]  # every other word
    assert max(abs(float(after[i] - before[i])) for i in others) < gain / 3


def test_report_to_without_the_package_fails_early_and_clearly(make_trainer, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith(("tensorboard", "wandb")) else real(name, *a))
    with pytest.raises(ValueError, match="pip install tensorboard"):
        make_trainer(CallableFeedbackSource(first_and_last_words), report_to="tensorboard")
    with pytest.raises(ValueError, match="pip install wandb"):
        make_trainer(CallableFeedbackSource(first_and_last_words), report_to="wandb")


def test_generative_reward_model_as_the_critic(make_trainer, bpe_tokenizer, tmp_path):
    """The real reward-model class behind the registry name; an untrained model writes no parseable JSON, so
    every sample is a counted feedback error with zero reward: by default the iteration stops before the update,
    with max_feedback_error_rate 1.0 training goes on."""
    rm_dir = tmp_path / "rm"
    build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=3).save_pretrained(rm_dir)
    bpe_tokenizer.save_pretrained(rm_dir)
    source = build_critic("reward_model", {"path": str(rm_dir), "max_new_tokens": 6, "device": "cpu"})
    assert isinstance(source, GenerativeRewardModel)
    trainer = make_trainer(source, num_iterations=1)
    with pytest.raises(FeedbackFailureError, match=r"4 of 4 samples \(100%\), above max_feedback_error_rate=0.2; first cause: "):
        trainer.step()
    trainer = make_trainer(source, num_iterations=1, max_feedback_error_rate=1.0)
    metrics = trainer.step()
    assert metrics["samples/feedback_error"] + metrics["samples/empty"] == 4
    assert metrics["reward/score_mean"] == 0.0 and metrics["tokens/nonzero_reward_share"] == 0.0
    assert math.isfinite(metrics["loss/value"])


def test_sigterm_finishes_the_iteration_saves_and_stops(make_trainer, tmp_path):
    calls = {"n": 0}

    def critic_that_gets_killed(prompt, response):
        calls["n"] += 1
        if calls["n"] == 5:  # during the second iteration (4 samples per iteration)
            os.kill(os.getpid(), signal.SIGTERM)
        return first_and_last_words(prompt, response)

    trainer = make_trainer(CallableFeedbackSource(critic_that_gets_killed), num_iterations=3)
    previous = signal.getsignal(signal.SIGTERM)
    trainer.train()
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler is restored
    assert trainer.state.step == 2  # the interrupted iteration was completed, then training stopped
    assert find_latest_checkpoint(tmp_path / "run").name == "checkpoint-2"
    assert not (tmp_path / "run" / "policy").exists()  # unfinished: no final export
    resumed = make_trainer(CallableFeedbackSource(first_and_last_words), num_iterations=3, resume="auto")
    resumed.train()
    assert resumed.state.step == 3 and (tmp_path / "run" / "policy" / "adapter_config.json").is_file()


def test_vllm_sampling_under_zero3_without_gathering_is_refused_naming_the_alternatives():
    """Every process's vLLM engine holds a whole policy, which ds3_gather_for_generation false rules out; the
    trainer refuses before any engine starts (the gathered ZeRO-3 path runs in tests/policy_optimization/
    test_multiprocess.py)."""
    config = PPOConfig(generation_backend="vllm", ds3_gather_for_generation=False)
    with pytest.raises(ValueError, match="set ds3_gather_for_generation true to sample with vLLM under ZeRO-3, or use "
                                         "generation_backend hf"):
        start_vllm_rollouts(config, None, zero_stage=3, base_model_path="some/policy", lora_rank=None)
    with pytest.raises(ValueError, match="pass base_model_path"):
        start_vllm_rollouts(PPOConfig(generation_backend="vllm"), None, zero_stage=2, base_model_path="", lora_rank=16)
