"""Reward-model ensembles: K members trained by the training CLI, loaded as K LoRA adapters on one shared base."""

from __future__ import annotations

import pytest
import torch
import yaml
from tests.reward_model.rm_testlib import RECORDS, train_args

from policy_optimization.rm_refresh import fine_tune, trainable_groups
from reward_model.ensemble import RewardModelEnsemble, member_paths
from reward_model.serialization import encode_example
from reward_model.train import bootstrap_resample, main
from text2grad.core.critics import build_critic
from text2grad.core.ensemble import EnsembleCritic, EnsembleFeedback
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import load_causal_lm


@pytest.fixture(scope="module")
def lora_ensemble(rm_world):
    """Two LoRA members trained by ``reward_model.train --ensemble_size 2 --bootstrap true``."""
    out = rm_world / "ensemble"
    if not (out / "member-1" / "adapter_config.json").is_file():
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert main(train_args(rm_world, out, use_lora=True, max_steps=4, ensemble_size=2, bootstrap=True)) == 0
        finally:
            torch.set_num_threads(before)
    return out


def test_bootstrap_resample_draws_with_replacement_and_depends_on_the_seed():
    records = list(range(50))
    a, b = bootstrap_resample(records, 0), bootstrap_resample(records, 1)
    assert len(a) == len(records) and set(a) <= set(records)
    assert len(set(a)) < len(records)  # with replacement: 50 draws of 50 repeat some (probability ~1)
    assert a == bootstrap_resample(records, 0) and a != b


def test_ensemble_size_trains_members_with_their_own_seeds(lora_ensemble):
    paths = member_paths(lora_ensemble)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["member-0", "member-1"]
    seeds = [yaml.safe_load(open(f"{p}/text2grad_config.yaml"))["seed"] for p in paths]
    assert seeds == [0, 1]


def test_members_share_one_base_model_in_memory(lora_ensemble, rm_world):
    ensemble = build_critic("reward_model_ensemble", {"path": str(lora_ensemble), "max_new_tokens": 8, "dtype": "fp32"})
    assert isinstance(ensemble, RewardModelEnsemble) and ensemble.adapters == ["member-0", "member-1"]
    model = ensemble.model
    names = [n for n, _ in model.named_parameters()]
    base = [n for n in names if "lora_" not in n]
    per_member = {a: sum(p.numel() for n, p in model.named_parameters() if f".{a}." in n) for a in ensemble.adapters}
    plain = load_causal_lm(str(rm_world / "base"), dtype="fp32")
    # one copy of the base weights (not two), plus each member's adapter
    assert sum(p.numel() for n, p in model.named_parameters() if n in base) == sum(p.numel() for p in plain.parameters())
    assert per_member["member-0"] == per_member["member-1"] > 0
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters()) + 2 * per_member["member-0"]
    # switching members changes the adapter, never the base weights' storage
    weight = next(p for n, p in model.named_parameters() if n.endswith("q_proj.base_layer.weight"))
    pointers = set()
    for adapter in ensemble.adapters:
        model.set_adapter(adapter)
        pointers.add(next(p for n, p in model.named_parameters() if n.endswith("q_proj.base_layer.weight")).data_ptr())
    assert pointers == {weight.data_ptr()}
    a = dict(model.named_parameters())
    lora_a = [n for n in a if "lora_A" in n and ".member-0." in n][0]
    assert not torch.equal(a[lora_a], a[lora_a.replace(".member-0.", ".member-1.")])  # different seeds, different members


def test_each_member_answers_with_its_own_adapter(lora_ensemble):
    ensemble = RewardModelEnsemble.from_critic_kwargs(path=str(lora_ensemble), max_new_tokens=6, dtype="fp32")
    prompts, responses = [r["prompt"] for r in RECORDS[:2]], [r["response"] for r in RECORDS[:2]]
    per_member = ensemble.member_feedback(prompts, responses)
    assert len(per_member) == 2 and all(len(rows) == 2 for rows in per_member)
    merged = ensemble.feedback(prompts, responses)
    assert all(isinstance(fb, EnsembleFeedback) and len(fb.members) == 2 for fb in merged)
    assert ensemble.reward_model.stats.requests == 8  # 2 members x 2 pairs, twice
    ensemble.model.set_adapter("member-1")
    alone = ensemble.reward_model.feedback(prompts, responses)
    assert [fb.raw for fb in alone] == [fb.raw for fb in per_member[1]]


def test_members_without_lora_load_as_separate_models(memorized_rm, tmp_path):
    critic = RewardModelEnsemble.from_critic_kwargs(paths=[str(memorized_rm), str(memorized_rm)], max_new_tokens=4, dtype="fp32")
    assert isinstance(critic, EnsembleCritic) and len(critic.members) == 2


def test_a_missing_ensemble_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="member-<k>"):
        member_paths(tmp_path)
    with pytest.raises(ValueError, match="needs path"):
        RewardModelEnsemble.from_critic_kwargs()


def test_a_refresh_trains_each_members_adapter_and_nothing_else(lora_ensemble):
    ensemble = RewardModelEnsemble.from_critic_kwargs(path=str(lora_ensemble), max_new_tokens=4, dtype="fp32")
    groups = trainable_groups(ensemble)
    assert [name for _, name, _ in groups] == ["member-0", "member-1"]
    assert all(rm is ensemble.reward_model for rm, _, _ in groups)  # the members share one model
    ids = [{id(p) for p in params} for _, _, params in groups]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    model, tok = ensemble.model, ensemble.reward_model.tokenizer
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    examples = [encode_example(tok, r["prompt"], r["response"], Feedback.from_dict(r), max_length=256,
                               instruction=ensemble.reward_model.instruction).as_dict() for r in RECORDS]
    model.set_adapter("member-1")
    losses = fine_tune(model, groups[1][2], examples, tok.pad_token_id, steps=2, batch_size=2, learning_rate=1e-2, seed=0)
    assert set(losses) == {"loss_first", "loss_last"}
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".member-1." in n and "lora_" in n for n in changed)  # the shared base is untouched
