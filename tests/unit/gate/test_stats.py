"""Statistics against hand-computed and published values (scipy is not a dependency)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pytest_specenergy.gate import stats
from pytest_specenergy.gate.stats import bootstrap_ci
from pytest_specenergy.gate.stats import mann_whitney_u
from pytest_specenergy.gate.stats import min_attainable_p
from pytest_specenergy.gate.stats import summarize


def test_exact_p_of_fully_separated_3_vs_3_is_0_1():
    # 1 of C(6,3) = 20 arrangements puts all of x below y: one-sided 0.05, two-sided 0.1.
    result = mann_whitney_u([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert result.method == "exact"
    assert result.u == 0
    assert result.p_value == pytest.approx(0.1)
    assert mann_whitney_u([4.0, 5.0, 6.0], [1.0, 2.0, 3.0]).p_value == pytest.approx(0.1)


def test_exact_p_of_fully_separated_5_vs_5():
    assert mann_whitney_u(range(1, 6), range(6, 11)).p_value == pytest.approx(2 / 252)


def test_u_distribution_counts():
    # Hand count for n = m = 3: 20 arrangements, symmetric around U = 4.5.
    assert stats.u_distribution(3, 3).tolist() == [1, 1, 2, 3, 3, 3, 3, 2, 1, 1]
    assert stats.u_distribution(2, 2).tolist() == [1, 1, 2, 1, 1]
    assert stats.u_distribution(4, 6).sum() == math.comb(10, 4)


def test_scipy_documented_example():
    # scipy.stats.mannwhitneyu docs: males vs females -> U = 17, p = 0.1111 (exact),
    # p = 0.11134688653314041 (method="asymptotic", continuity-corrected).
    males, females = [19, 22, 16, 29, 24], [20, 11, 17, 12]
    exact = mann_whitney_u(males, females)
    assert (exact.u, exact.method) == (17.0, "exact")
    assert exact.p_value == pytest.approx(1 / 9)


def test_normal_approximation_matches_scipy_asymptotic(monkeypatch):
    monkeypatch.setattr(stats, "EXACT_MAX_PAIRS", 0)
    result = mann_whitney_u([19, 22, 16, 29, 24], [20, 11, 17, 12])
    assert result.method == "normal"
    assert result.p_value == pytest.approx(0.11134688653314041, rel=1e-12)


def test_normal_approximation_with_ties_by_hand():
    # x = 1 2 2 | y = 2 3 4: midranks 1, 3, 3, 3, 5, 6 -> R_x = 7, U_x = 7 - 6 = 1.
    # One tie group of 3: sum(t^3 - t) / (N (N - 1)) = 24 / 30 = 0.8,
    # var = 3 * 3 / 12 * (7 - 0.8) = 4.65; z = (|1 - 4.5| - 0.5) / sqrt(4.65).
    result = mann_whitney_u([1, 2, 2], [2, 3, 4])
    assert result.method == "normal" and result.u == 1.0
    z = 3.0 / math.sqrt(4.65)
    assert result.p_value == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert 0.16 < result.p_value < 0.17


def test_all_tied_gives_p_1():
    assert mann_whitney_u([1.0, 1.0, 1.0], [1.0, 1.0]).p_value == 1.0


def test_exact_matches_brute_force_enumeration():
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=4), rng.normal(size=5) + 0.7
    pooled = np.concatenate([x, y])
    u_obs = sum((a > b) for a in x for b in y)
    us = []
    for idx in itertools.combinations(range(9), 4):
        xs = pooled[list(idx)]
        ys = np.delete(pooled, list(idx))
        us.append(sum((a > b) for a in xs for b in ys))
    us = np.array(us)
    lower, upper = np.mean(us <= u_obs), np.mean(us >= u_obs)
    assert mann_whitney_u(x, y).p_value == pytest.approx(min(1.0, 2 * min(lower, upper)))


def test_min_attainable_p_table():
    # Exact two-sided p_min = 2 / C(2n, n) for n = m (Mann and Whitney, 1947).
    assert [round(min_attainable_p(n, n), 4) for n in (3, 4, 5, 6)] == [0.1, 0.0286, 0.0079,
                                                                        0.0022]
    assert min_attainable_p(0, 5) == 1.0


def test_summary_by_hand():
    s = summarize([1, 2, 3, 4, 10])
    assert (s.n, s.min, s.max, s.mean, s.median) == (5, 1.0, 10.0, 4.0, 3.0)
    assert (s.q1, s.q3, s.iqr) == (2.0, 4.0, 2.0)
    assert s.stddev == pytest.approx(math.sqrt(12.5))  # sum of squares 50 / (n - 1)
    assert s.relative_spread == pytest.approx(math.sqrt(12.5) / 4)
    assert s.stat("median") == 3.0 and s.stat("max") == 10.0
    one = summarize([2.5, None])
    assert one.n == 1 and one.stddev is None and one.relative_spread is None
    with pytest.raises(ValueError, match="empty sample"):
        summarize([None])
    with pytest.raises(ValueError, match="non-finite"):
        summarize([1.0, float("nan")])
    with pytest.raises(ValueError, match="unknown statistic 'p99'"):
        s.stat("p99")


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    base, cur = [1.00, 1.02, 0.98, 1.01, 0.99], [1.20, 1.23, 1.18, 1.21, 1.19]
    a = bootstrap_ci(base, cur, seed=3)
    b = bootstrap_ci(base, cur, seed=3)
    assert a == b  # same data, same seed: the gate cannot flip on a rerun
    assert a.low <= a.point <= a.high
    assert a.point == pytest.approx(1.20)
    assert 1.15 < a.low and a.high < 1.26


def test_bootstrap_of_3_vs_3_spans_the_range_ratio():
    # With three values a side, a 99% interval reaches the extreme orderings: the low end
    # is min(current) / max(baseline), so it clears a limit only when the ranges separate.
    base, cur = [1.00, 1.01, 0.99], [1.20, 1.21, 1.19]
    ci = bootstrap_ci(base, cur, confidence=0.99)
    assert ci.low == pytest.approx(1.19 / 1.01)
    assert ci.high == pytest.approx(1.21 / 0.99)


def test_bootstrap_difference_and_errors():
    ci = bootstrap_ci([0.30, 0.31, 0.29], [0.20, 0.21, 0.19], kind="difference")
    assert ci.point == pytest.approx(-0.10)
    assert ci.low == pytest.approx(0.19 - 0.31) and ci.high == pytest.approx(0.21 - 0.29)
    with pytest.raises(ValueError, match="positive baseline"):
        bootstrap_ci([0.0, 1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="both sides"):
        bootstrap_ci([], [1.0])
    with pytest.raises(ValueError, match="unknown bootstrap kind"):
        bootstrap_ci([1.0], [1.0], kind="mean")


@pytest.mark.parametrize("t, df, p", [
    # Student t table, two-sided: t_{0.995, df} and t_{0.975, df}.
    (63.657, 1, 0.01), (9.925, 2, 0.01), (5.841, 3, 0.01), (2.776, 4, 0.05), (2.228, 10, 0.05),
    (1.95996, 1e9, 0.05), (0.0, 3, 1.0),
])
def test_t_distribution_table(t, df, p):
    assert stats.t_two_sided_p(t, df) == pytest.approx(p, abs=2e-4)


def test_welch_t_by_hand():
    # means 2.5 and 6; var/n = (5/3)/4 and 10/5; t = -3.5 / sqrt(2.41667)
    # df = 2.41667^2 / ((0.41667^2) / 3 + 2^2 / 4) = 5.5208
    result = stats.welch_t([1, 2, 3, 4], [2, 4, 6, 8, 10])
    assert result.t == pytest.approx(-3.5 / math.sqrt(5 / 12 + 2))
    assert result.df == pytest.approx((5 / 12 + 2) ** 2 / ((5 / 12) ** 2 / 3 + 4 / 4))
    assert 0.06 < result.p_value < 0.08
    assert stats.welch_t([1, 1], [1, 1]).p_value == 1.0  # no noise, no difference
    assert stats.welch_t([2, 2], [1, 1]).p_value == 0.0  # no noise, a difference
    with pytest.raises(ValueError, match="two values a side"):
        stats.welch_t([1.0], [1.0, 2.0])
