"""Ensemble aggregation: vote and mean - k*std against hand-computed values, and the token-level rewards of an
ensemble's feedback."""

import math

import pytest
import torch

from text2grad.core.critics import build_critic
from text2grad.core.ensemble import (
    EnsembleCritic,
    EnsembleFeedback,
    consensus_feedback,
    ensemble_score_rewards,
    mean_minus_std,
    vote,
)
from text2grad.core.feedback import Feedback
from text2grad.core.rewards import compute_score_rewards


def test_one_dissenting_member_removes_a_plus_one():
    values = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # (K=2, T=3): member 1 does not call token 1 good
    assert vote(values, min_votes=2).tolist() == [1.0, 0.0, 0.0]
    assert vote(values, min_votes=1).tolist() == [1.0, 1.0, 0.0]


def test_vote_penalises_where_any_member_says_poor_and_needs_m_good_votes():
    values = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0],
                           [1.0, 0.0, 0.0, -1.0, 1.0],
                           [1.0, 1.0, 1.0, 0.0, -0.5]])  # (K=3, T=5)
    assert vote(values, min_votes=2).tolist() == [1.0, 1.0, 0.0, -1.0, -0.5]
    assert vote(values, min_votes=3).tolist() == [1.0, 0.0, 0.0, -1.0, -0.5]


def test_vote_takes_the_mean_of_the_agreeing_members_values():
    values = torch.tensor([[0.5, -0.2], [1.0, -0.6], [0.0, 0.9]])
    out = vote(values, min_votes=2)
    assert out[0].item() == pytest.approx(0.75)  # two good votes: mean of 0.5 and 1.0
    assert out[1].item() == pytest.approx(-0.4)  # any poor vote: mean of -0.2 and -0.6


def test_vote_leaves_failed_members_out():
    values = torch.tensor([[[1.0, 1.0]], [[0.0, 0.0]]])  # (K=2, B=1, T=2); member 1 failed on the response
    valid = torch.tensor([[True], [False]])  # (K, B)
    assert vote(values, min_votes=2, valid=valid).tolist() == [[1.0, 1.0]]
    assert vote(values, min_votes=2, valid=torch.tensor([[False], [False]])).tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="min_votes"):
        vote(values, min_votes=0)


def test_mean_minus_std_hand_computed():
    values = torch.tensor([[1.0, 1.0, -1.0], [0.0, 1.0, -1.0]])
    # token 0: mean 0.5, population std 0.5 -> 0; token 1: 1 - 0; token 2: -1 - 0
    assert mean_minus_std(values, std_coef=1.0).tolist() == pytest.approx([0.0, 1.0, -1.0])
    three = torch.tensor([[1.0], [0.0], [1.0]])
    # mean 2/3, variance ((1/3)^2 * 2 + (2/3)^2) / 3 = 2/9
    assert mean_minus_std(three, std_coef=2.0).item() == pytest.approx(2 / 3 - 2 * math.sqrt(2 / 9))
    assert mean_minus_std(three, std_coef=0.0).item() == pytest.approx(2 / 3)


def test_mean_minus_std_leaves_failed_members_out():
    values = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    valid = torch.tensor([True, False])  # member 1 failed
    assert mean_minus_std(values, 1.0, valid=valid).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="std_coef"):
        mean_minus_std(values, -1.0)


def test_consensus_feedback_keeps_agreed_good_quotes_and_every_poor_one():
    a = Feedback(critique="a", good_spans=("moved to Berlin", "a job"), poor_spans=("Oslo",))
    b = Feedback(critique="b", good_spans=("moved to Berlin",), poor_spans=("a job",))
    both = consensus_feedback([a, b], min_votes=2)
    assert both.good_spans == ("moved to Berlin",)
    assert set(both.poor_spans) == {"Oslo", "a job"}
    assert both.members == (a, b) and both.ok
    failed = consensus_feedback([Feedback.failed("x"), Feedback.failed("y")], min_votes=2)
    assert not failed.ok and "every ensemble member failed" in failed.error
    assert consensus_feedback([a, Feedback.failed("x")], min_votes=2).good_spans == ("moved to Berlin", "a job")


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_ensemble_token_rewards_equal_the_single_critic_on_the_agreed_spans(bpe_tokenizer):
    text = "The author wrote a 200 page unpublished novel"
    ids = [_ids(bpe_tokenizer, text)]
    wide = Feedback(good_spans=("The author", "200 page"), poor_spans=())
    narrow = Feedback(good_spans=("The author",), poor_spans=("novel",))
    ensemble = [EnsembleFeedback(good_spans=(), members=(wide, narrow))]
    got = ensemble_score_rewards(ensemble, ids, bpe_tokenizer, aggregation="vote", min_votes=None, std_coef=1.0,
                                 mode="nl_gradient")
    agreed = compute_score_rewards([Feedback(good_spans=("The author",), poor_spans=("novel",))], ids, bpe_tokenizer,
                                   mode="nl_gradient")
    assert torch.equal(got.rewards, agreed.rewards)
    assert got.samples[0].labels == agreed.samples[0].labels
    assert (got.rewards > 0).any() and (got.rewards < 0).any()


def test_ensemble_mean_minus_std_token_rewards(bpe_tokenizer):
    text = "The author wrote a 200 page unpublished novel"
    ids = [_ids(bpe_tokenizer, text)]
    wide = Feedback(good_spans=("The author", "200 page"))
    narrow = Feedback(good_spans=("The author",))
    ensemble = [EnsembleFeedback(members=(wide, narrow))]
    got = ensemble_score_rewards(ensemble, ids, bpe_tokenizer, aggregation="mean_minus_std", min_votes=None,
                                 std_coef=0.5, mode="nl_gradient").rewards[0]
    single = [compute_score_rewards([fb], ids, bpe_tokenizer, mode="nl_gradient").rewards[0] for fb in (wide, narrow)]
    both = (single[0] > 0) & (single[1] > 0)
    one = (single[0] > 0) ^ (single[1] > 0)
    assert both.any() and one.any()
    assert torch.allclose(got[both], torch.ones(int(both.sum())))
    assert torch.allclose(got[one], torch.full((int(one.sum()),), 0.5 - 0.5 * 0.5))  # mean 0.5, std 0.5


def test_ensemble_sequence_scores_aggregate_the_members_scores(bpe_tokenizer):
    text = "The author wrote a 200 page unpublished novel"
    ids = [_ids(bpe_tokenizer, text)]
    praise = Feedback(good_spans=("The author", "200 page"))  # quote-count score +1
    blame = Feedback(poor_spans=("novel",))  # quote-count score -1
    ensemble = [EnsembleFeedback(members=(praise, blame))]
    n = len(ids[0])
    for how, expected in (("vote", -1.0), ("mean_minus_std", 0.0 - 1.0)):  # mean 0, std 1
        got = ensemble_score_rewards(ensemble, ids, bpe_tokenizer, aggregation=how, min_votes=None, std_coef=1.0,
                                     mode="scalar").rewards[0]
        assert got[n - 1].item() == pytest.approx(expected)
        assert got[: n - 1].abs().sum().item() == 0


def test_plain_feedback_passes_straight_through(bpe_tokenizer):
    ids = [_ids(bpe_tokenizer, "The author wrote a novel")]
    fb = [Feedback(good_spans=("The author",))]
    got = ensemble_score_rewards(fb, ids, bpe_tokenizer, aggregation="vote", min_votes=None, std_coef=1.0, mode="nl_gradient")
    assert torch.equal(got.rewards, compute_score_rewards(fb, ids, bpe_tokenizer, mode="nl_gradient").rewards)


def first_word_good(prompt, response):
    return Feedback(good_spans=(response.split()[0],))


def last_word_poor(prompt, response):
    return Feedback(good_spans=(response.split()[0],), poor_spans=(response.split()[-1],))


def test_ensemble_critic_from_the_registry_asks_every_member():
    critic = build_critic("ensemble", {"members": [{"critic": "tests.core.test_ensemble:first_word_good"},
                                                   {"critic": "tests.core.test_ensemble:last_word_poor"}]})
    assert isinstance(critic, EnsembleCritic)
    (fb,) = critic.feedback(["p"], ["alpha beta gamma"])
    assert isinstance(fb, EnsembleFeedback) and len(fb.members) == 2
    assert fb.good_spans == ("alpha",) and fb.poor_spans == ("gamma",)
    with pytest.raises(ValueError, match="at least 2"):
        EnsembleCritic([{"critic": "tests.core.test_ensemble:first_word_good"}])
