"""Small statistics shared by the experiment scripts (seeds as the unit of replication)."""

from __future__ import annotations

import math
import statistics

__all__ = ["T95", "mean_ci95", "plus_minus"]

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
