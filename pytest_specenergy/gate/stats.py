"""Statistics for the regression gate, with numpy only (scipy is not a dependency).

- :func:`summarize`: n, min, max, mean, median, stddev, quartiles, IQR and relative spread.
- :func:`mann_whitney_u`: two-sided Mann-Whitney U test. Small samples without ties use the
  exact null distribution (counted by the classic recurrence); otherwise the normal
  approximation with tie and continuity correction, as scipy's ``method="asymptotic"``.
- :func:`bootstrap_ci`: a seeded percentile bootstrap interval of the ratio (or difference)
  of medians, current over baseline - the fallback when too few repeats exist for the
  U test to ever reach the significance level (3 vs 3 can at best give p = 0.1).
- :func:`welch_t`: a two-sided Welch t test (p from the regularized incomplete beta), which
  the fallback also requires, so that three non-overlapping values are not taken as proof.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any
from typing import Sequence

import numpy as np

#: Largest ``n * m`` for which the exact U distribution is counted (a few ms of numpy work).
EXACT_MAX_PAIRS = 1000


@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of one sample; spread fields are None below two values."""

    n: int
    min: float
    max: float
    mean: float
    median: float
    stddev: float | None
    q1: float
    q3: float
    iqr: float
    relative_spread: float | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return asdict(self)

    def stat(self, name: str) -> float:
        """One of ``median``, ``mean``, ``min``, ``max`` by name."""
        if name not in ("median", "mean", "min", "max"):
            raise ValueError(f"unknown statistic {name!r}; expected median, mean, min or max")
        return float(getattr(self, name))


@dataclass(frozen=True)
class MannWhitney:
    """Result of a two-sided Mann-Whitney U test.

    ``u`` is the statistic of the first sample: the number of (x, y) pairs with x > y, ties
    counting one half. ``method`` is ``exact`` or ``normal``.
    """

    u: float
    p_value: float
    method: str
    n_x: int
    n_y: int


@dataclass(frozen=True)
class Interval:
    """A bootstrap confidence interval around a point estimate."""

    low: float
    high: float
    point: float
    confidence: float
    kind: str  # "ratio" | "difference"


def _clean(values: Sequence[float | None], what: str) -> np.ndarray:
    array = np.asarray([v for v in values if v is not None], dtype=float)
    if array.size and not np.all(np.isfinite(array)):
        raise ValueError(f"{what} contains a non-finite value: {array.tolist()}")
    return array


def summarize(values: Sequence[float | None]) -> Summary:
    """Summary statistics of the defined (non-None) values; raises ValueError when empty."""
    data = _clean(values, "sample")
    if data.size == 0:
        raise ValueError("cannot summarize an empty sample (no defined values)")
    mean = float(np.mean(data))
    stddev = float(np.std(data, ddof=1)) if data.size >= 2 else None
    q1, median, q3 = (float(q) for q in np.quantile(data, [0.25, 0.5, 0.75]))
    spread = stddev / abs(mean) if stddev is not None and mean != 0 else None
    return Summary(n=int(data.size), min=float(data.min()), max=float(data.max()), mean=mean,
                   median=median, stddev=stddev, q1=q1, q3=q3, iqr=q3 - q1,
                   relative_spread=spread)


def rankdata(values: np.ndarray) -> np.ndarray:
    """Ranks starting at 1, ties getting the average of the ranks they span."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Boundaries of runs of equal values in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], sorted_values.size]
    average = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(values.size, dtype=float)
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def u_distribution(n: int, m: int) -> np.ndarray:
    """Counts of arrangements giving each U = 0 .. n*m under the null (no ties).

    Recurrence: the largest of the n + m values is either an x (adding m to U) or a y, so
    ``f(n, m, u) = f(n - 1, m, u - m) + f(n, m - 1, u)``.
    """
    size = n * m + 1
    # prev[j] = f(i - 1, j, .), built up one i at a time.
    prev = [np.zeros(size) for _ in range(m + 1)]
    for j in range(m + 1):
        prev[j][0] = 1.0
    for _ in range(1, n + 1):
        cur = [np.zeros(size) for _ in range(m + 1)]
        cur[0][0] = 1.0
        for j in range(1, m + 1):
            shifted = np.zeros(size)
            shifted[j:] = prev[j][: size - j]
            cur[j] = shifted + cur[j - 1]
        prev = cur
    return prev[m]


def min_attainable_p(n: int, m: int) -> float:
    """Smallest two-sided p the exact U test can give for sizes n and m (1 without data)."""
    if n == 0 or m == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n + m, n))


def mann_whitney_u(x: Sequence[float | None], y: Sequence[float | None]) -> MannWhitney:
    """Two-sided Mann-Whitney U test of ``x`` against ``y``.

    Exact when there are no ties and ``len(x) * len(y) <= EXACT_MAX_PAIRS``; otherwise the
    normal approximation with tie correction and a 0.5 continuity correction.
    """
    a, b = _clean(x, "first sample"), _clean(y, "second sample")
    n, m = int(a.size), int(b.size)
    if n == 0 or m == 0:
        raise ValueError(f"Mann-Whitney U needs values on both sides, got {n} and {m}")
    ranks = rankdata(np.concatenate([a, b]))
    u = float(ranks[:n].sum() - n * (n + 1) / 2.0)
    ties = np.unique(np.concatenate([a, b]), return_counts=True)[1]
    has_ties = bool(np.any(ties > 1))
    if not has_ties and n * m <= EXACT_MAX_PAIRS:
        counts = u_distribution(n, m)
        total = counts.sum()
        k = int(round(u))
        lower = float(counts[: k + 1].sum() / total)
        upper = float(counts[k:].sum() / total)
        return MannWhitney(u, min(1.0, 2.0 * min(lower, upper)), "exact", n, m)
    total_n = n + m
    tie_term = float(np.sum(ties.astype(float) ** 3 - ties)) / (total_n * (total_n - 1))
    variance = n * m / 12.0 * ((total_n + 1) - tie_term)
    if variance <= 0:  # every value tied: no evidence of any difference
        return MannWhitney(u, 1.0, "normal", n, m)
    z = max(0.0, abs(u - n * m / 2.0) - 0.5) / math.sqrt(variance)
    return MannWhitney(u, min(1.0, math.erfc(z / math.sqrt(2.0))), "normal", n, m)


@dataclass(frozen=True)
class WelchT:
    """Result of a two-sided Welch t test: statistic, Welch-Satterthwaite df and p-value."""

    t: float
    df: float
    p_value: float


def _betacf(a: float, b: float, x: float) -> float:
    # Continued fraction of the incomplete beta function (modified Lentz).
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    # The continued fraction converges fast only on this side of the mean.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return min(1.0, betainc(df / 2.0, 0.5, df / (df + t * t)))


def welch_t(x: Sequence[float | None], y: Sequence[float | None]) -> WelchT:
    """Two-sided Welch t test of mean(x) - mean(y); needs two values a side.

    Used where the rank test is powerless (three repeats a side): it assumes roughly normal
    noise, which per-repeat energy on logs satisfies well, and it keeps identical-ish samples
    from counting as different just because their few values happen not to overlap.
    """
    a, b = _clean(x, "first sample"), _clean(y, "second sample")
    if a.size < 2 or b.size < 2:
        raise ValueError(f"Welch's t test needs two values a side, got {a.size} and {b.size}")
    va, vb = float(np.var(a, ddof=1)) / a.size, float(np.var(b, ddof=1)) / b.size
    diff = float(np.mean(a) - np.mean(b))
    if va + vb == 0.0:  # no noise at all (e.g. a modeled meter): any difference is real
        return WelchT(0.0 if diff == 0 else math.copysign(math.inf, diff), math.inf,
                      1.0 if diff == 0 else 0.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va * va / (a.size - 1) if va else 0.0)
                          + (vb * vb / (b.size - 1) if vb else 0.0))
    return WelchT(t, df, t_two_sided_p(t, df))


def bootstrap_ci(baseline: Sequence[float | None], current: Sequence[float | None],
                 kind: str = "ratio", confidence: float = 0.99, resamples: int = 5000,
                 seed: int = 0) -> Interval:
    """Percentile bootstrap interval of median(current) / median(baseline) (``kind="ratio"``)
    or median(current) - median(baseline) (``kind="difference"``).

    Each side is resampled with replacement independently; the generator is seeded so the
    same data always gives the same interval (a gate must not flip on a rerun).
    """
    if kind not in ("ratio", "difference"):
        raise ValueError(f"unknown bootstrap kind {kind!r}; expected 'ratio' or 'difference'")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    base, cur = _clean(baseline, "baseline sample"), _clean(current, "current sample")
    if base.size == 0 or cur.size == 0:
        raise ValueError(f"bootstrap needs values on both sides, got {base.size} and {cur.size}")
    if kind == "ratio" and np.any(base <= 0):
        raise ValueError("a ratio of medians needs a positive baseline sample; use "
                         "kind='difference' for values that can be zero or negative")
    rng = np.random.default_rng(seed)
    base_medians = np.median(rng.choice(base, size=(resamples, base.size)), axis=1)
    cur_medians = np.median(rng.choice(cur, size=(resamples, cur.size)), axis=1)
    if kind == "ratio":
        estimates = cur_medians / base_medians
        point = float(np.median(cur) / np.median(base))
    else:
        estimates = cur_medians - base_medians
        point = float(np.median(cur) - np.median(base))
    tail = (1.0 - confidence) / 2.0
    low, high = (float(q) for q in np.quantile(estimates, [tail, 1.0 - tail]))
    return Interval(low=low, high=high, point=point, confidence=confidence, kind=kind)
