"""pass@k: the unbiased estimator of the Codex paper (Chen et al., 2021), per problem and averaged."""

from __future__ import annotations

from typing import Sequence

__all__ = ["pass_at_k", "mean_pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem: ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: samples drawn for the problem (n >= 1).
        c: how many of them passed (0 <= c <= n).
        k: the k of pass@k (1 <= k <= n).

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which never forms the (huge) binomials.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c, k must be ints, got {n!r}, {c!r}, {k!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples per problem, got n={n}; draw more samples or lower k")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of `pass_at_k` over problems; ``counts`` = [(n, c), ...], one pair per problem."""
    if not counts:
        raise ValueError("no problems to average pass@k over")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
