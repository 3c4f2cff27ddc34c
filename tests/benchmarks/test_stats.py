"""The experiment scripts' statistics against independent computations."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.stats import mcnemar_exact, mean_ci95


def _two_sided_by_likelihood(gained: int, lost: int) -> float:
    """The exact test's other textbook form: the total probability, under Binomial(n, 1/2), of every outcome no
    more likely than the observed one."""
    n = gained + lost
    observed = math.comb(n, gained)
    return sum(math.comb(n, k) for k in range(n + 1) if math.comb(n, k) <= observed) / 2**n


@given(st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_matches_the_likelihood_form(gained, lost):
    expected = 1.0 if gained + lost == 0 else min(1.0, _two_sided_by_likelihood(gained, lost))
    assert mcnemar_exact(gained, lost) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_known_values():
    # 10 gained, 2 lost: 2 * (C(12,0) + C(12,1) + C(12,2)) / 2^12 = 158 / 4096
    assert mcnemar_exact(10, 2) == pytest.approx(158 / 4096)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(ValueError, match="counts must be >= 0"):
        mcnemar_exact(-1, 3)


def test_mean_ci95_uses_student_t():
    mean, half = mean_ci95([0.0, 1.0, 2.0])
    assert mean == 1.0
    assert half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert mean_ci95([0.5]) == (0.5, None)
    with pytest.raises(ValueError):
        mean_ci95([])
