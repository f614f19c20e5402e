"""The PPO math: small pure functions over tensors.

Shapes: ``B`` batch, ``T`` response tokens (right-padded), ``V`` vocabulary. ``mask`` is 1.0 on real response
tokens and 0.0 on padding. Every function is unit-tested in
tests/core/test_rewards.py (hand-computed cases and property tests).

How the pieces fit in one PPO iteration (Text2Grad, paper Sec. 3.5)::

    delta      = span_token_rewards(labels)                       # (B, T) +1 / -1 / 0 (text2grad.core.rewards)
    kl         = kl_penalty(logprobs, ref_logprobs, "k1")         # (B, T)
    rewards    = delta - kl_coef * kl                             # r_t^total = delta_t + r_t^KL
    adv, ret   = gae(rewards, values, mask, gamma, lam)           # token-level advantages
    adv        = masked_whiten(adv, mask)
    loss       = policy_loss(...) + vf_coef * value_loss(...) - entropy_coef * entropy
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "masked_moments",
    "variance_from_moments",
    "whiten_with_moments",
    "explained_variance_from_moments",
    "logprobs_from_logits",
    "entropy_from_logits",
    "kl_penalty",
    "gae",
    "policy_loss",
    "value_loss",
    "explained_variance",
    "adaptive_kl_coef",
    "kl_controller_steps",
]


# --------------------------------------------------------------------------------------------------
# Masked statistics
# --------------------------------------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (all, or along ``dim``). 0 where mask is empty."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of ``x`` (Bessel-corrected by default)."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        var = var * n / (n - 1).clamp(min=1.0)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalize masked entries to unit variance (and zero mean if ``shift_mean``); padding stays 0."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(count, sum, sum of squares) of the masked entries of ``x``, a float64 tensor of shape (3,).

    Moments add up: summed over processes (an all-reduce) they describe the global batch, which is how
    `whiten_with_moments` and `explained_variance_from_moments` work across processes.
    """
    x64, m64 = x.detach().double(), mask.double()
    return torch.stack([m64.sum(), (x64 * m64).sum(), (x64 * x64 * m64).sum()])


def variance_from_moments(moments: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """The variance (Bessel-corrected by default) of the entries that `masked_moments` summarised; 0 if empty."""
    count, total, squares = moments[0], moments[1], moments[2]
    mean = total / count.clamp(min=1.0)
    var = (squares / count.clamp(min=1.0) - mean * mean).clamp(min=0.0)
    if unbiased:
        var = var * count / (count - 1).clamp(min=1.0)
    return var


def whiten_with_moments(
    x: torch.Tensor, mask: torch.Tensor, moments: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """`masked_whiten` with the mean and variance of ``moments`` (`masked_moments`, possibly summed over
    processes) instead of those of ``x`` alone; padding stays 0. ``x``, ``mask``: (B, T); moments: (3,)."""
    mean = (moments[1] / moments[0].clamp(min=1.0)).to(x.dtype)
    var = variance_from_moments(moments).to(x.dtype)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def explained_variance_from_moments(returns_moments: torch.Tensor, residual_moments: torch.Tensor) -> float:
    """1 - Var[R - V] / Var[R] from the moments of the returns and of the residuals R - V (`masked_moments`,
    possibly summed over processes): `explained_variance` over a batch split across processes."""
    var_returns = variance_from_moments(returns_moments)
    return float(1.0 - variance_from_moments(residual_moments) / var_returns.clamp(min=1e-8))


# --------------------------------------------------------------------------------------------------
# Log-probabilities, entropy, KL
# --------------------------------------------------------------------------------------------------


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log pi(token) from logits (..., V) and token ids (...), shape (...).

    Uses logsumexp instead of a full log_softmax so no second (..., V) tensor is kept.
    """
    logits = logits.float()
    picked = torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: (..., V) -> (...)."""
    logits = logits.float()
    logz = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return logz - (probs * logits).sum(-1)


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: Literal["k1", "k3"] = "k1"
) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate from the sampled tokens' log-probs, shape (B, T).

    k1 = log pi - log pi_ref (unbiased, can be negative per token);
    k3 = (r - 1) - log r with r = pi_ref / pi (unbiased and always >= 0, lower variance).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"estimator must be 'k1' or 'k3', got {estimator!r}")


# --------------------------------------------------------------------------------------------------
# Advantages and losses
# --------------------------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over per-token rewards.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last real token is 0);
    A_t = delta_t + gamma * lam * A_{t+1}; returns R_t = A_t + V_t.

    Args:
        rewards, values, mask: (B, T), right-padded.

    Returns:
        (advantages, returns), each (B, T) and zero on padding.
    """
    values = values * mask
    rewards = rewards * mask
    T = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        advantages[:, t] = last
    return advantages, (advantages + values) * mask


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO surrogate, averaged over real tokens.

    L = mean_t max(-A_t rho_t, -A_t clip(rho_t, 1 - eps, 1 + eps)), rho_t = exp(logp_t - old_logp_t).

    Returns:
        (scalar loss, stats) with ``clipfrac`` (share of tokens where clipping was active) and
        ``approx_kl`` (0.5 * mean (logp - old_logp)^2).
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    stats = {
        "clipfrac": masked_mean((clipped > unclipped).float(), mask).detach(),
        "approx_kl": (0.5 * masked_mean(log_ratio**2, mask)).detach(),
    }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss: 0.5 * mean_t max((V - R)^2, (clip(V, V_old +- eps) - R)^2)."""
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(loss_unclipped, loss_clipped), mask)
    return loss, {"vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), mask).detach()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var[R - V] / Var[R] over real tokens (1 is perfect, <= 0 is no better than a constant)."""
    var_returns = masked_var(returns, mask)
    return 1.0 - masked_var(returns - values, mask) / var_returns.clamp(min=1e-8)


def adaptive_kl_coef(kl_coef: float, observed_kl: float, target: float, n_steps: int, horizon: int) -> float:
    """Adaptive KL controller (Ziegler et al., 2019, section 2.2): move the coefficient toward the target KL.

    error = clip(observed / target - 1, -0.2, 0.2); coef *= 1 + error * n_steps / horizon.

    ``n_steps`` and ``horizon`` are in the same unit (`kl_controller_steps`). Over a run of ``N`` updates
    the coefficient can move by at most a factor ``(1 + 0.2 * n_steps / horizon) ** N``: with the usual
    episode horizon (10,000 episodes) and a run of 1,440 episodes that is 1.03, so the controller never binds.
    """
    error = min(max(observed_kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * n_steps / horizon)


def kl_controller_steps(unit: str, global_batch: int) -> int:
    """How far one PPO iteration advances the adaptive KL controller, in the unit of its horizon.

    ``"episodes"``: the rollouts of the iteration (``global_batch``), as TRL, OpenRLHF and verl count (their
    default horizon: 10,000 episodes). ``"iterations"``: 1, so a horizon of H iterations lets the coefficient
    move by up to 0.2 / H per iteration whatever the batch size (H = 10: up to x5.9 over 90 iterations).
    """
    if unit == "iterations":
        return 1
    if unit == "episodes":
        if global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {global_batch}")
        return global_batch
    raise ValueError(f"unit must be 'iterations' or 'episodes', got {unit!r}")
