"""Small statistics shared by the experiment scripts (seeds as the unit of replication)."""

from __future__ import annotations

import math
import statistics

__all__ = ["T95", "mcnemar_exact", "mean_ci95", "plus_minus"]

T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    19: 2.093,
    29: 2.045,
}
"""Two-sided 95% quantiles of Student's t by degrees of freedom (standard tables); the next listed df below
is used between entries (conservative), 1.96 beyond 29."""


def mean_ci95(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% Student-t interval; the half-width is None for a single value (one
    seed gives no interval, and printing 0 would claim certainty).

    Raises:
        ValueError: no values.
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci95 needs at least one value")
    mean = statistics.fmean(values)
    if n < 2:
        return mean, None
    df = n - 1
    t = 1.96 if df > 29 else T95[max(k for k in T95 if k <= df)]
    return mean, t * statistics.stdev(values) / math.sqrt(n)


def plus_minus(mean: float, half: float | None, spec: str = ".3f") -> str:
    """``mean +- half``, or ``mean (no interval: 1 seed)`` when `half` is None (`mean_ci95`)."""
    return f"{mean:{spec}} (no interval: 1 seed)" if half is None else f"{mean:{spec}} +- {half:{spec}}"


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes: `gained` tasks solved only after a change,
    `lost` only before it. Under the null hypothesis each discordant task goes either way with probability 1/2,
    so p = min(1, 2 * P[Binomial(gained + lost, 1/2) <= min(gained, lost)]) (McNemar 1947, exact binomial form).
    1.0 when no task is discordant.

    Raises:
        ValueError: a negative count.
    """
    if gained < 0 or lost < 0:
        raise ValueError(f"counts must be >= 0, got gained={gained}, lost={lost}")
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)
