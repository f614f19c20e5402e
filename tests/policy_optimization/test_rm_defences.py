"""Defences against reward-model exploitation in PPO: an ensemble critic aggregated per token, and the on-policy
reward-model refresh (the reward model learns the annotating critic's labels on the current rollouts)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file
from tests.policy_optimization.po_testlib import first_and_last_words

from policy_optimization.ppo_config import PPOConfig
from policy_optimization.rm_refresh import (REFRESH_DIR, WEIGHTS_FILE, RewardModelRefresh, agreement,
                                            attach_training_copy, fine_tune, pick_rollouts, summed_target_loss,
                                            target_tokens)
from reward_model.inference import GenerativeRewardModel
from reward_model.serialization import collate, encode_example
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.ensemble import EnsembleCritic
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import build_tiny_llama

INSTRUCTION = "Quote the good and poor parts of the response."


def first_word_good(prompt: str, response: str) -> Feedback:
    """The annotating critic of the refresh tests: the response's first word is good."""
    words = response.split()
    return Feedback(good_spans=(words[0],)) if words else Feedback()


def first_word_of_three_good_last_poor(prompt: str, response: str) -> Feedback:
    """What a 2-of-2 vote of `first_and_last_words` and `first_word_good` leaves, computed by hand."""
    words = response.split()
    if len(words) < 3:  # first_and_last_words quotes nothing there, so the first word has one good vote of two
        return Feedback()
    return Feedback(good_spans=(words[0],), poor_spans=(words[-1],))


def _metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------------------------------
# Ensemble critic
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_with_a_two_member_ensemble_rewards_only_the_agreed_tokens(make_trainer, tmp_path):
    members = [CallableFeedbackSource(first_and_last_words), CallableFeedbackSource(first_word_good)]
    runs = {
        "ensemble": EnsembleCritic(members),
        "by_hand": CallableFeedbackSource(first_word_of_three_good_last_poor),
        "one_member": CallableFeedbackSource(first_and_last_words),
    }
    results = {}
    for name, critic in runs.items():
        trainer = make_trainer(critic, output_dir=tmp_path / name, num_iterations=1, ensemble_aggregation="vote",
                               log_samples=4, response_length=12)
        trainer.train()
        results[name] = (_metrics(tmp_path / name)[0],
                         [json.loads(line)["rewarded_tokens"] for line in (tmp_path / name / "samples.jsonl").read_text().splitlines()])
    ensemble, by_hand, one = results["ensemble"], results["by_hand"], results["one_member"]
    assert ensemble[1] == by_hand[1]  # the same tokens, the same rewards, sample by sample
    assert ensemble[0]["reward/score_mean"] == pytest.approx(by_hand[0]["reward/score_mean"])
    assert ensemble[0]["tokens/nonzero_reward"] == by_hand[0]["tokens/nonzero_reward"] > 0
    assert ensemble[1] != one[1]  # the dissenting member removed +1s


def test_ensemble_options_are_checked():
    with pytest.raises(ValueError, match="ensemble_min_votes"):
        PPOConfig(num_iterations=1, ensemble_min_votes=0)
    with pytest.raises(ValueError, match="ensemble_aggregation"):
        PPOConfig(num_iterations=1, ensemble_aggregation="median")


# --------------------------------------------------------------------------------------------------
# On-policy refresh
# --------------------------------------------------------------------------------------------------


def _reward_model(tokenizer) -> GenerativeRewardModel:
    """An untrained tiny reward model (it writes no valid feedback before a refresh)."""
    model = build_tiny_llama(tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=3)
    return GenerativeRewardModel(model, tokenizer, instruction=INSTRUCTION, prompt_format="plain", max_new_tokens=48,
                                 max_input_length=128)


REFRESH = dict(
    rm_refresh_critic="tests.policy_optimization.test_rm_defences:first_word_good", rm_refresh_steps=60,
    rm_refresh_batch_size=4, rm_refresh_learning_rate=1e-2, rm_refresh_replay_ratio=0.0, max_feedback_error_rate=1.0,
    response_length=8,
)


def _annotated_pairs(run, step: int):
    records = [json.loads(line) for line in (run / REFRESH_DIR / f"step-{step}" / "annotations.jsonl").read_text().splitlines()]
    return [r["prompt"] for r in records], [r["response"] for r in records], [Feedback.from_dict(r) for r in records]


@pytest.mark.slow
def test_refresh_teaches_the_reward_model_the_annotators_labels_on_policy_samples(make_trainer, bpe_tokenizer, tmp_path):
    f1 = {}
    for every in (1, 0):  # with the refresh, and the same run without it
        rm = _reward_model(bpe_tokenizer)
        run = tmp_path / f"every-{every}"
        trainer = make_trainer(rm, output_dir=run, num_iterations=1, rm_refresh_every=every, **REFRESH)
        if every == 0:  # the control's reward model is judged on the refreshed run's rollouts
            trainer.train()
            prompts, responses, labels = _annotated_pairs(tmp_path / "every-1", 1)
        else:
            trainer.train()
            prompts, responses, labels = _annotated_pairs(run, 1)
            logged = _metrics(run)[0]
            assert logged["rm_refresh/annotations"] == logged["rm_refresh/annotations_total"] == len(responses) == 4
            f1["before"] = logged["rm_refresh/agreement_f1_good"]
        f1[every] = agreement(rm.feedback(prompts, responses), labels, responses, rm.tokenizer)["agreement_f1_good"]
    assert f1["before"] == 0.0 and f1[0] == 0.0  # the untrained model writes no valid feedback at all
    # after the refresh it writes the annotator's labels on the policy's own samples (random byte-level text from
    # the tiny policy, so not every quote is reproduced: 0.79 on CPU)
    assert f1[1] >= 0.3


@pytest.mark.slow
def test_a_resumed_run_continues_with_the_refreshed_reward_model(make_trainer, bpe_tokenizer, tmp_path):
    run = tmp_path / "run"
    options = dict(REFRESH, rm_refresh_steps=2, rm_refresh_every=1, save_steps=1, save_total_limit=None, output_dir=run)
    first = make_trainer(_reward_model(bpe_tokenizer), num_iterations=2, **options)
    first.train()
    assert [m["rm_refresh/annotations_total"] for m in _metrics(run)] == [4, 8]
    saved = load_file(str(run / REFRESH_DIR / "step-2" / WEIGHTS_FILE))
    fresh_rm = _reward_model(bpe_tokenizer)
    assert not all(torch.equal(p, saved[n]) for n, p in fresh_rm.model.named_parameters())
    resumed = make_trainer(fresh_rm, num_iterations=3, resume="auto", **options)
    resumed.start_run()
    assert resumed.state.step == 2
    assert all(torch.equal(p, saved[n]) for n, p in fresh_rm.model.named_parameters())
    resumed.train()
    assert [m["rm_refresh/annotations_total"] for m in _metrics(run)] == [4, 8, 12]
    assert (run / REFRESH_DIR / "step-3" / "annotations.jsonl").is_file()


@pytest.mark.slow
def test_refresh_fine_tunes_every_member_of_an_ensemble_of_separate_reward_models(make_trainer, bpe_tokenizer, tmp_path):
    """Members trained without LoRA load as separate models (an `EnsembleCritic`): each is fine-tuned on its own
    bootstrap resample, and each one's weights are saved under its own name and restored on resume."""
    members = [_reward_model(bpe_tokenizer), _reward_model(bpe_tokenizer)]  # the same start (seed 3)
    start = [{n: p.detach().clone() for n, p in m.model.named_parameters()} for m in members]
    run = tmp_path / "run"
    options = dict(REFRESH, rm_refresh_steps=2, rm_refresh_every=1, ensemble_aggregation="vote", output_dir=run,
                   save_steps=1, save_total_limit=None)
    make_trainer(EnsembleCritic(members), num_iterations=1, **options).train()
    for k, member in enumerate(members):
        assert any(not torch.equal(p, start[k][n]) for n, p in member.model.named_parameters()), f"member {k} unchanged"
    assert any(not torch.equal(p, q) for p, q in zip(members[0].model.parameters(), members[1].model.parameters()))
    saved = load_file(str(run / REFRESH_DIR / "step-1" / WEIGHTS_FILE))
    assert set(saved) == {f"member-{k}.{n}" for k in (0, 1) for n, _ in members[0].model.named_parameters()}
    fresh = [_reward_model(bpe_tokenizer), _reward_model(bpe_tokenizer)]
    resumed = make_trainer(EnsembleCritic(fresh), num_iterations=2, resume="auto", **options)
    resumed.start_run()
    assert all(torch.equal(p, saved[f"member-{k}.{n}"]) for k, m in enumerate(fresh) for n, p in m.model.named_parameters())


def test_pick_rollouts_is_seeded_and_skips_empty_responses():
    responses = ["a", "", "b c", "d", "e f g", "  "]
    assert pick_rollouts(responses, None, 0, 1) == [0, 2, 3, 4]
    picked = pick_rollouts(responses, 2, 0, 1)
    assert len(picked) == 2 and set(picked) <= {0, 2, 3, 4} and picked == pick_rollouts(responses, 2, 0, 1)
    assert len({tuple(pick_rollouts(responses, 2, 0, s)) for s in range(20)}) > 1  # each refresh draws anew


def test_summed_target_loss_and_target_tokens_by_hand():
    # position 0 predicts label 1 with p = 3/4 (logits 0, ln 3); position 1 predicts label 0 with p = 1/2
    logits = torch.tensor([[[0.0, float(torch.log(torch.tensor(3.0)))], [0.0, 0.0], [5.0, -5.0]]])
    labels = torch.tensor([[-100, 1, 0]])
    expected = -torch.log(torch.tensor(3 / 4)) - torch.log(torch.tensor(1 / 2))
    assert torch.allclose(summed_target_loss(logits, labels), expected)
    assert target_tokens({"input_ids": [5, 6, 7], "labels": [-100, 1, 0]}) == 2
    assert target_tokens({"input_ids": [5, 6], "labels": [4, -100]}) == 0  # the first label is never predicted


def test_refresh_micro_batches_give_the_whole_batchs_update(bpe_tokenizer):
    """Pieces of 1 and 3 records take the same steps as whole batches of 4: the same losses, the same adapter."""
    texts = ["the cat sat on the mat", "a dog ran", "birds sing in the morning light over the quiet hills", "rain"]
    examples = [encode_example(bpe_tokenizer, f"Post {k}: {t}", t, Feedback(good_spans=(t.split()[0],)),
                               max_length=256, instruction=INSTRUCTION).as_dict() for k, t in enumerate(texts * 2)]
    assert len({len(e["input_ids"]) for e in examples}) > 1  # padding differs between the pieces
    reference = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=5)
    with torch.no_grad():  # the hand-rolled loss is the mean a transformers model computes from labels
        batch = {k: v for k, v in collate(examples[:4], bpe_tokenizer.pad_token_id).items()}
        n = sum(target_tokens(e) for e in examples[:4])
        ours = summed_target_loss(reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                  batch["labels"]) / n
        assert torch.allclose(ours, reference(**batch).loss, atol=1e-6)
    trained = {}
    for micro in (None, 1, 3):
        model = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=5)
        losses = fine_tune(model, list(model.parameters()), examples, bpe_tokenizer.pad_token_id, steps=3, batch_size=4,
                           learning_rate=1e-2, seed=0, micro_batch_size=micro)
        trained[micro] = (losses, [p.detach().clone() for p in model.parameters()])
    whole_losses, whole = trained[None]
    assert whole_losses["loss_last"] < whole_losses["loss_first"]  # it trains
    for micro in (1, 3):
        losses, params = trained[micro]
        assert losses == pytest.approx(whole_losses, rel=1e-5)
        # AdamW divides by the root of its second moment, so where a gradient is near zero the rounding of summed
        # pieces moves a weight visibly (1.5e-5 on an Intel Xeon): allow 1 % of one step of lr 1e-2. Pieces that
        # averaged per piece instead of per batch move every weight by a large part of a step.
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(params, whole))


def test_refresh_options_are_checked(make_trainer):
    with pytest.raises(ValueError, match="rm_refresh_critic"):
        PPOConfig(num_iterations=1, rm_refresh_every=2)
    with pytest.raises(ValueError, match="must be a reward model"):
        PPOConfig(num_iterations=1, rm_refresh_every=2, rm_refresh_critic="llm", critic="reference")
    with pytest.raises(ValueError, match="generative reward model"):
        make_trainer(CallableFeedbackSource(first_word_good), rm_refresh_every=1, **{k: v for k, v in REFRESH.items()})
    with pytest.raises(ValueError, match="rm_refresh_micro_batch_size must be >= 1"):
        PPOConfig(num_iterations=1, critic="reward_model", rm_refresh_every=2, **dict(REFRESH, rm_refresh_micro_batch_size=0))


# --------------------------------------------------------------------------------------------------
# Refresh of a reward model that generates through vLLM (the engine itself is tested in
# tests/reward_model/test_inference_vllm.py; here a stand-in records what it is asked to serve)
# --------------------------------------------------------------------------------------------------


class RecordingEngine:
    """Stands in for the reward model's vLLM engine wrapper: the base and adapter it was started with, and every
    adapter folder a refresh asks it to serve (with the weights that folder held at that moment)."""

    def __init__(self, base_model: str, adapter_dir: str | None):
        self.base_model, self.adapter_dir, self.dtype = base_model, adapter_dir, "fp32"
        self.served: list[dict[str, torch.Tensor]] = []

    def serve_adapter(self, adapter_dir) -> None:
        self.served.append(load_file(str(Path(adapter_dir) / "adapter_model.safetensors")))
        self.adapter_dir = str(adapter_dir)


@pytest.fixture
def saved_lora_reward_model(bpe_tokenizer, tmp_path):
    """(base model folder, LoRA adapter folder) of a tiny reward model, saved as training saves them."""
    base = build_tiny_llama(bpe_tokenizer, hidden_size=64, num_layers=2, num_heads=4, seed=3)
    base.save_pretrained(str(tmp_path / "base"))
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(str(tmp_path / "adapter"))
    return str(tmp_path / "base"), str(tmp_path / "adapter")


def _vllm_reward_model(tokenizer, base: str, adapter: str | None) -> GenerativeRewardModel:
    return GenerativeRewardModel(None, tokenizer, backend="vllm", engine=RecordingEngine(base, adapter),
                                 instruction=INSTRUCTION, prompt_format="plain", max_new_tokens=48, max_input_length=128)


def _refresh(critic) -> RewardModelRefresh:
    return RewardModelRefresh(critic, CallableFeedbackSource(first_word_good), every=1, samples=None, replay_paths=[],
                              replay_ratio=0.0, steps=3, batch_size=2, learning_rate=1e-2, seed=0)


def test_a_vllm_served_reward_model_is_refreshed_through_a_trained_copy_of_its_adapter(
        bpe_tokenizer, saved_lora_reward_model, tmp_path):
    base, adapter = saved_lora_reward_model
    rm = _vllm_reward_model(bpe_tokenizer, base, adapter)
    refresh = _refresh(rm)
    assert isinstance(rm.model, PeftModel)  # the training copy, from the engine's own base and adapter
    start = {n: t.detach().cpu().clone() for n, t in get_peft_model_state_dict(rm.model).items()}
    assert start.keys() == load_file(f"{adapter}/adapter_model.safetensors").keys()
    run = tmp_path / "run"
    prompts, responses = ["p1", "p2", "p3"], ["the cat sat", "a dog ran far", "birds sing"]
    metrics = refresh.after_iteration(1, prompts, responses, [Feedback()] * 3,
                                      SimpleNamespace(num_processes=1, is_main_process=True), run)
    assert metrics["rm_refresh/annotations"] == 3
    trained = {n: t.cpu() for n, t in get_peft_model_state_dict(rm.model).items()}  # on a GPU the copy is on cuda
    assert any(not torch.equal(trained[n], start[n]) for n in start)  # the refresh trained the adapter...
    served = rm.engine.served[-1]  # ...and the engine serves exactly what it trained
    assert len(rm.engine.served) == 1 and all(torch.equal(served[n], trained[n]) for n in trained)
    assert (run / REFRESH_DIR / "step-1" / WEIGHTS_FILE).is_file()

    # a resumed run: the engine of a fresh reward model serves the refreshed adapter again
    fresh = _vllm_reward_model(bpe_tokenizer, base, adapter)
    assert _refresh(fresh).restore(run, 1, is_main=True) == 1
    assert all(torch.equal(fresh.engine.served[-1][n], trained[n]) for n in trained)


def test_a_vllm_served_reward_model_without_an_adapter_cannot_be_refreshed(bpe_tokenizer, saved_lora_reward_model):
    rm = _vllm_reward_model(bpe_tokenizer, saved_lora_reward_model[0], None)
    with pytest.raises(ValueError, match="LoRA adapter"):
        attach_training_copy(rm)
    remote = GenerativeRewardModel(None, bpe_tokenizer, backend="openai", engine=object())
    with pytest.raises(ValueError, match="behind a server"):
        _refresh(remote)
