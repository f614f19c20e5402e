"""Token rewards and PPO math against hand-computed values."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from text2grad.core.ppo_math import (

    adaptive_kl_coef,
    kl_controller_steps,

    entropy_from_logits,

    explained_variance,

    explained_variance_from_moments,

    masked_moments,

    variance_from_moments,

    whiten_with_moments,

    gae,

    kl_penalty,

    logprobs_from_logits,

    masked_mean,

    masked_var,

    masked_whiten,

    policy_loss,

    value_loss,

)

from text2grad.core.rewards import span_token_rewards


def test_uniform_rewards_are_the_labels():
    assert span_token_rewards([0, 1, 1, 0, -1]).tolist() == [0, 1, 1, 0, -1]


def test_linear_decay_matches_paper_formula():
    # n = 4: r_i = 1 - (i-1) * 0.9 / 3 -> 1.0, 0.7, 0.4, 0.1 ; one-token run keeps 1 ; negative runs decay too
    r = span_token_rewards([1, 1, 1, 1, 0, -1, 0, -1, -1], scheme="linear_decay")
    assert r.tolist() == pytest.approx([1.0, 0.7, 0.4, 0.1, 0.0, -1.0, 0.0, -1.0, -0.1])


def test_span_normalize_makes_each_span_worth_one():
    r = span_token_rewards([1, 1, 1, 1, 0, -1, -1], span_normalize=True)
    assert r.tolist() == pytest.approx([0.25] * 4 + [0.0, -0.5, -0.5])


def test_weighting_hook():
    r = span_token_rewards([1, 1, -1], token_ids=[5, 6, 7], weighting=lambda ids, labels: [1.0 if i == 5 else 0.2 for i in ids])
    assert r.tolist() == pytest.approx([1.0, 0.2, -0.2])
    with pytest.raises(ValueError):
        span_token_rewards([1], weighting=lambda ids, labels: [1.0])


def test_length_alone_does_not_pay():
    short = span_token_rewards([1, 0, -1])
    long = span_token_rewards([1, 0, -1] + [0] * 50)
    assert short.sum() == long.sum() == 0


def test_masked_stats():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_var(x, m).item() == pytest.approx(1.0)  # sample variance of 1,2,3
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(x, m)
    assert w[0, 3] == 0 and w[0, :3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-4)
    assert masked_mean(x, m, dim=1).tolist() == pytest.approx([2.0])


def test_logprobs_and_entropy():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    assert logprobs_from_logits(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.25))
    assert entropy_from_logits(logits).item() == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))


def test_kl_estimators():
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    assert kl_penalty(logp, ref, "k1")[0].tolist() == pytest.approx([0.5, -1.0])
    # k3 = (r - 1) - log r, r = exp(ref - logp)
    expected = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]
    assert kl_penalty(logp, ref, "k3")[0].tolist() == pytest.approx(expected)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k2")  # type: ignore[arg-type]


def test_gae_by_hand():
    # T = 3, gamma = 0.9, lam = 0.5; last token is padding.
    r = torch.tensor([[1.0, 0.0, 2.0, 5.0]])
    v = torch.tensor([[0.5, 1.0, 0.0, 7.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.5)
    d2 = 2.0 + 0.9 * 0 - 0.0  # V after the last real token is 0 (the padding value 7 is ignored)
    d1 = 0.0 + 0.9 * 0.0 - 1.0
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2, 0.0])
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 0.0, 0.0])


def test_early_token_reward_is_amplified_as_in_appendix_a():
    # Same +1 reward placed at token k = T - 20 (token level) vs at the last token T (end of sequence);
    # with V = 0, the advantage at t = 0 differs by (gamma * lam) ** -(T - k) = 0.95 ** -20 ~ 2.8.
    T = 21
    m = torch.ones(1, T)
    zeros = torch.zeros(1, T)
    early, late = zeros.clone(), zeros.clone()
    early[0, 0] = 1.0
    late[0, T - 1] = 1.0
    a_early, _ = gae(early, zeros, m, gamma=1.0, lam=0.95)
    a_late, _ = gae(late, zeros, m, gamma=1.0, lam=0.95)
    ratio = (a_early[0, 0] / a_late[0, 0]).item()
    assert ratio == pytest.approx(0.95**-20, rel=1e-5)
    assert 2.7 < ratio < 2.9


def test_policy_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    m = torch.ones(1, 3)
    loss, stats = policy_loss(new, old, adv, m, cliprange=0.2)
    # token 0: max(-1*1.5, -1*1.2) = -1.2 (clipped); token 1: max(-0.5, -0.8) = -0.5; token 2: max(2.2, 2.2) = 2.2
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 2.2) / 3)
    assert stats["clipfrac"].item() == pytest.approx(1 / 3)


def test_value_loss_by_hand():
    old = torch.tensor([[0.0, 0.0]])
    new = torch.tensor([[1.0, 0.1]])
    ret = torch.tensor([[2.0, 0.0]])
    loss, stats = value_loss(new, old, ret, torch.ones(1, 2), cliprange_value=0.2)
    # token 0: max((1-2)^2, (0.2-2)^2) = 3.24 ; token 1: max(0.01, 0.01) = 0.01
    assert loss.item() == pytest.approx(0.5 * (3.24 + 0.01) / 2)
    assert stats["vf_clipfrac"].item() == pytest.approx(0.5)


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0]])
    m = torch.ones(1, 3)
    assert explained_variance(ret, ret, m).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.0), ret, m).item() == pytest.approx(0.0, abs=1e-6)


def test_adaptive_kl():
    assert adaptive_kl_coef(0.2, observed_kl=12.0, target=6.0, n_steps=100, horizon=1000) == pytest.approx(0.2 * 1.02)
    assert adaptive_kl_coef(0.2, observed_kl=6.0, target=6.0, n_steps=100, horizon=1000) == pytest.approx(0.2)
    assert adaptive_kl_coef(0.2, observed_kl=0.0, target=6.0, n_steps=100, horizon=1000) == pytest.approx(0.2 * 0.98)
    # inside the clip: 7.5 / 6 - 1 = 0.25 -> 0.2; 6.6 / 6 - 1 = 0.1 -> coef * (1 + 0.1 * 1 / 10) = 0.2 * 1.01
    assert adaptive_kl_coef(0.2, observed_kl=6.6, target=6.0, n_steps=1, horizon=10) == pytest.approx(0.202)
    assert adaptive_kl_coef(0.2, observed_kl=7.5, target=6.0, n_steps=1, horizon=10) == pytest.approx(0.204)


def test_kl_controller_steps_per_iteration():
    assert kl_controller_steps("iterations", 16) == 1
    assert kl_controller_steps("episodes", 16) == 16
    with pytest.raises(ValueError, match="iterations"):
        kl_controller_steps("tokens", 16)


def simulate_kl_controller(unit: str, horizon: int, iterations: int = 90, batch: int = 16, coef: float = 0.2,
                           target: float = 6.0) -> list[tuple[float, float]]:
    """(coefficient, KL) per iteration of a simulated run whose policy drifts to KL = 2.4 / coef nats: 12 nats at
    the start coefficient 0.2, twice the 6-nat target; the target binds once coef reaches 0.4."""
    out = []
    for _ in range(iterations):
        kl = 2.4 / coef
        out.append((coef, kl))
        coef = adaptive_kl_coef(coef, kl, target, kl_controller_steps(unit, batch), horizon)
    return out


def test_a_horizon_in_iterations_binds_the_target_within_a_short_run():
    """90 iterations of 16 rollouts with the KL twice the target: the default horizon (10 iterations) doubles the
    coefficient and brings the KL down to the target within the run; the episode horizon of TRL and the paper's
    code (10,000 episodes), and even one as long as the run itself (1,440 episodes), leave it far above."""
    run = simulate_kl_controller("iterations", 10)
    first_bound = next(i for i, (_, kl) in enumerate(run) if kl <= 6.0 * 1.05)
    assert first_bound < 60  # bound in the first two thirds of the run
    assert run[-1][1] == pytest.approx(6.0, rel=0.05) and run[-1][0] == pytest.approx(0.4, rel=0.05)
    for horizon in (10000, 90 * 16):
        old = simulate_kl_controller("episodes", horizon)
        assert old[-1][0] < 0.25 and old[-1][1] > 9.6  # the coefficient moved by < 25 %: KL still >= 1.6 x target


# ------------------------------------------------------------------------------------------------
# Properties over random batches: (B, T) tensors with right padding
# ------------------------------------------------------------------------------------------------

_finite = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def _padded_batch(draw, max_b=3, max_t=8):
    """(rewards, values, mask): B rows of T tokens, each row right-padded after 1..T real tokens."""
    b, t = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    lengths = draw(st.lists(st.integers(1, t), min_size=b, max_size=b))
    rewards = torch.tensor(draw(st.lists(st.lists(_finite, min_size=t, max_size=t), min_size=b, max_size=b)))
    values = torch.tensor(draw(st.lists(st.lists(_finite, min_size=t, max_size=t), min_size=b, max_size=b)))
    mask = torch.tensor([[1.0] * n + [0.0] * (t - n) for n in lengths])
    return rewards, values, mask


@settings(max_examples=100, deadline=None)
@given(_padded_batch(), st.floats(0.5, 1.0))
def test_gae_with_lambda_one_and_zero_values_is_the_discounted_return(batch, gamma):
    rewards, _, mask = batch
    adv, ret = gae(rewards, torch.zeros_like(rewards), mask, gamma=gamma, lam=1.0)
    for b in range(rewards.shape[0]):
        n = int(mask[b].sum())
        expected = [sum(gamma**k * rewards[b, t + k].item() for k in range(n - t)) for t in range(n)]
        assert adv[b, :n].tolist() == pytest.approx(expected, rel=1e-4, abs=1e-4)
        assert ret[b, :n].tolist() == pytest.approx(expected, rel=1e-4, abs=1e-4)
        assert (adv[b, n:] == 0).all() and (ret[b, n:] == 0).all()


@settings(max_examples=100, deadline=None)
@given(_padded_batch(), st.integers(1, 4), _finite, st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_gae_ignores_whatever_sits_in_the_padding(batch, extra, junk, gamma, lam):
    rewards, values, mask = batch
    pad = lambda x, fill: torch.cat([x, torch.full((x.shape[0], extra), fill)], dim=1)  # noqa: E731
    adv, ret = gae(rewards, values, mask, gamma, lam)
    adv_p, ret_p = gae(pad(rewards, junk), pad(values, junk), pad(mask, 0.0), gamma, lam)
    assert torch.allclose(adv_p[:, : adv.shape[1]], adv, atol=1e-5) and (adv_p[:, adv.shape[1] :] == 0).all()
    assert torch.allclose(ret_p[:, : ret.shape[1]], ret, atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(_padded_batch())
def test_k3_is_never_negative_and_zero_only_where_policies_agree(batch):
    logp, ref, _ = batch
    k3 = kl_penalty(logp, ref, "k3")
    assert (k3 >= 0).all()
    assert (k3[logp == ref] == 0).all() and (k3[(logp - ref).abs() > 1e-2] > 0).all()
    assert torch.equal(kl_penalty(logp, ref, "k1"), logp - ref)


@settings(max_examples=100, deadline=None)
@given(_padded_batch())
def test_whitened_values_have_zero_mean_and_unit_variance_over_the_mask(batch):
    x, _, mask = batch
    if mask.sum() < 2 or masked_var(x, mask) < 1e-3:
        return  # a constant batch has no spread to normalise
    w = masked_whiten(x, mask)
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-4)
    assert masked_var(w, mask).item() == pytest.approx(1.0, rel=1e-3)
    assert (w[mask == 0] == 0).all()
    kept = masked_whiten(x, mask, shift_mean=False)  # rewards are whitened without losing their mean
    assert masked_mean(kept, mask).item() == pytest.approx(masked_mean(x, mask).item(), abs=1e-4)


@settings(max_examples=100, deadline=None)
@given(_padded_batch(), st.floats(0.05, 0.5))
def test_policy_loss_at_ratio_one_is_minus_the_mean_advantage(batch, cliprange):
    adv, logp, mask = batch
    loss, stats = policy_loss(logp, logp.clone(), adv, mask, cliprange)
    assert loss.item() == pytest.approx(-masked_mean(adv, mask).item(), rel=1e-5, abs=1e-5)
    assert stats["clipfrac"].item() == 0 and stats["approx_kl"].item() == 0
    # the clipped objective is pessimistic: never below the unclipped surrogate's loss
    moved = logp + 0.3 * torch.sign(adv)
    clipped_loss, _ = policy_loss(moved, logp, adv, mask, cliprange)
    assert clipped_loss.item() >= masked_mean(-adv * torch.exp(moved - logp), mask).item() - 1e-5


@settings(max_examples=100, deadline=None)
@given(_padded_batch(), st.floats(0.05, 0.5))
def test_value_loss_is_half_mse_when_values_did_not_move(batch, cliprange):
    values, returns, mask = batch
    loss, stats = value_loss(values, values.clone(), returns, mask, cliprange)
    assert loss.item() == pytest.approx(0.5 * masked_mean((values - returns) ** 2, mask).item(), rel=1e-5, abs=1e-5)
    assert stats["vf_clipfrac"].item() == 0


def test_whitening_over_a_batch_split_across_two_processes():
    """Global whitening: each process's (count, sum, sum of squares) are added (the all-reduce) and every
    process whitens with the global mean and variance. Hand-computed: the real entries are {1, 2, 3, 4, 6},
    mean 16/5 = 3.2, Bessel-corrected variance (4.84 + 1.44 + 0.04 + 0.64 + 7.84) / 4 = 3.7."""
    x1, m1 = torch.tensor([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # 9 is padding
    x2, m2 = torch.tensor([[4.0, 6.0]]), torch.tensor([[1.0, 1.0]])
    assert masked_moments(x1, m1).tolist() == [3.0, 6.0, 14.0]
    total = masked_moments(x1, m1) + masked_moments(x2, m2)
    assert total.tolist() == [5.0, 16.0, 66.0]
    assert float(variance_from_moments(total)) == pytest.approx(3.7)
    sd = 3.7 ** 0.5
    w1, w2 = whiten_with_moments(x1, m1, total), whiten_with_moments(x2, m2, total)
    assert w1.flatten().tolist() == pytest.approx([(1 - 3.2) / sd, (2 - 3.2) / sd, (3 - 3.2) / sd, 0.0], abs=1e-6)
    assert w2.flatten().tolist() == pytest.approx([(4 - 3.2) / sd, (6 - 3.2) / sd], abs=1e-6)
    kept = whiten_with_moments(x2, m2, total, shift_mean=False)  # the reward whitening keeps the mean
    assert kept.flatten().tolist() == pytest.approx([(4 - 3.2) / sd + 3.2, (6 - 3.2) / sd + 3.2], abs=1e-6)
    # Per process (each with its own moments) the same entries come out differently: process 2 alone has mean 5.
    alone = whiten_with_moments(x2, m2, masked_moments(x2, m2))
    assert alone.flatten().tolist() == pytest.approx([-(2 ** 0.5) / 2, (2 ** 0.5) / 2], abs=1e-6)
    # One process holding everything: the moments path equals masked_whiten and explained_variance.
    x, m = torch.cat([x1, x2]), torch.cat([m1, m2])
    assert whiten_with_moments(x, m, masked_moments(x, m)).flatten().tolist() == pytest.approx(masked_whiten(x, m).flatten().tolist(), abs=1e-6)
    values = torch.tensor([[1.5, 2.0], [2.0, 0.0], [4.0, 5.0]])
    ev = explained_variance_from_moments(masked_moments(x, m), masked_moments(x - values, m))
    assert ev == pytest.approx(float(explained_variance(values, x, m)), abs=1e-6)
