"""Sequential, limit-based verdicts for per-repeat samples (energy per token and the like).

The question a gate answers
---------------------------
A limit such as ``energy_per_token:5%`` says: fail when the metric got worse by *more than
5%*. So the null hypothesis of every comparison here is "the change is within the limit"
(H0: ratio <= 1 + L for a metric that gets worse going up), never "no change". One rule,
one hypothesis, at every repeat count:

* **REGRESSED** iff the lower confidence bound of the change lies beyond the limit: we are
  confident (1 - alpha_k) that the regression exceeds the limit.
* **UNCHANGED** iff the upper confidence bound lies inside the limit (confidence 1 - beta);
  **IMPROVED** iff that bound lies beyond the limit on the better side as well.
* **INCONCLUSIVE** otherwise: measure more repeats, up to the next look of the plan. At the
  repeat cap the case stays INCONCLUSIVE and the plugin's ``--specenergy-inconclusive``
  policy applies. It is *not* decided by the point estimate: that variant fails a true +4%
  change 23-40% of the time (``results.txt``).

Because the null is the limit itself, P(REGRESSED) is at most alpha, at any repeat count,
for any true change at or inside the limit. For a change strictly inside the limit it *falls*
as repeats are added, because the interval shrinks away from the limit. That is what "verdicts
do not change meaning with the repeat count" requires. The rule "p < alpha against no change,
plus a point estimate beyond the limit" (main's Mann-Whitney path) has the opposite behaviour.

Statistics
----------
Everything is on the log scale: per-repeat log ratios are close to normal for energy noise,
a ratio limit becomes a fixed offset, and the reported change is a ratio of geometric means.

* Stored baseline (:func:`compare_stored`): compares the current run's per-repeat session
  ratios ``q_r = spec_r / base_r`` with the stored run's ``q_j``. The arms are interleaved
  ABAB in one session, so a session offset or a slow drift moves both and cancels. Welch's t
  on ``log q``; only the current side can grow.
* In-job A/B (:func:`compare_paired`): a candidate and a reference measured in the same
  repeats, interleaved with the shared baseline. One-sample t on the per-repeat
  ``log(candidate_r / reference_r)``; the shared baseline cancels exactly, and both sides grow.
* ``session_sd`` (optional): the part of a session offset that does not cancel in the ratio
  is a per-case bias that repeats cannot average away. Declared, it is added in quadrature to
  the standard error (the history of an unchanged case's ratio across sessions estimates it).

Sequential plan and error spending
----------------------------------
Looks at ``start, start + step, ...`` up to ``cap`` repeats (default 3, 5, 7, 9, 11). The
REGRESSED level is split over the K looks by a union bound (Bonferroni). So P(REGRESSED |
change exactly at the limit) <= alpha holds however the looks are correlated, for any noise
level and any stopping:

* ``spending="final"`` (default, Haybittle-Peto style): ``alpha x interim_share`` at each
  interim look (0.02 x 5% = 0.001 by default) and the rest (4.6%) at the cap. Early looks
  stop only on overwhelming evidence, and nearly the whole alpha is kept for the cap, where
  the power is. At 3% noise in A/B mode this gives 95% power for a true +10%, against 83%
  for an equal split and 96% for a single look at 11 repeats. Unchanged cases stop after 5.1
  repeats on average instead of 11.
* ``spending="equal"``: ``alpha / K`` at every look.

UNCHANGED / IMPROVED (stopping for futility) use a fixed per-look level ``beta``. Stopping
early that way can only lower P(REGRESSED). Each result carries the *repeated p-value*
``p_sequential = min_j p_j / w_j`` over the looks taken (``w_j`` the share of alpha at look
j). ``P(p_sequential <= a) <= a`` under H0 for every ``a``, however the plan stops, so it is
the p-value to use for false-discovery-rate control across a suite (``fdr.py``).

Blocked arms and block drift
----------------------------
Arms measured one after the other (one GPU holding one engine at a time: the *blocked order*;
or a baseline shared from another case) share no drift: a block drift between them biases the
ratio, and no number of repeats averages it away. The plan's ``block_drift`` D is an explicit
allowance for it: the REGRESSED bound must clear the limit by ``log(1 + D)`` more, and the
UNCHANGED bound likewise, so P(REGRESSED) <= alpha at the limit for any drift within D either
way (the null widened to "within the limit plus a drift of at most D"). Against a stored run
each run not measured alongside its baseline brings its own drift (``gate/compare.py``:
``drift_allowance``). The verdict's note states the allowance; the price is power, which is
why one GPU runs both engines resident and interleaved where they fit.

Measured (``benchmarks/gate_simulation.py``, 5% limit, 2-3% session offset): false REGRESSED per 200 unchanged
cases 0-0.02 at 3% per-arm noise; power at a true +10% within the cap of 11: 95% in A/B
mode, 55% / 78% against a stored run of 5 / 11 repeats (a stored run of 21 repeats with a
cap of 21 reaches 96%); P(REGRESSED) at a true +4%: 1-3%, not rising with the repeat count.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pytest_specenergy.gate.settings import DEFAULT_ALPHA
from pytest_specenergy.gate.settings import DEFAULT_CAP
from pytest_specenergy.gate.tdist import t_ppf
from pytest_specenergy.gate.tdist import t_sf
from pytest_specenergy.gate.verdict import Verdict

_NORMAL = NormalDist()
WORSE_DIRECTIONS = ("up", "down")
SPENDINGS = ("final", "equal")


#: Integer codes of the vectorized engine (:func:`sequential_arrays`).
CODES = {0: Verdict.INCONCLUSIVE, 1: Verdict.UNCHANGED, 2: Verdict.IMPROVED, 3: Verdict.REGRESSED}
INCONCLUSIVE, UNCHANGED, IMPROVED, REGRESSED = 0, 1, 2, 3


@dataclass(frozen=True)
class SequentialPlan:
    """When to look and how much error each look may spend.

    ``alpha`` bounds P(REGRESSED) for a true change exactly at the limit, over all looks.
    ``beta`` is the per-look level of the UNCHANGED / IMPROVED bound. Looks are at
    ``start, start + step, ...`` and always at ``cap``.
    """

    start: int = 3
    step: int = 2
    cap: int = DEFAULT_CAP
    alpha: float = DEFAULT_ALPHA
    beta: float = 0.05
    spending: str = "final"
    interim_share: float = 0.02
    #: The block drift allowed for, either way, between arms not measured alongside each other
    #: (a fraction; the gate applies it to such comparisons only: see ``gate/compare.py``).
    block_drift: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.block_drift < 0.5:
            raise ValueError(f"block_drift must lie in [0, 0.5), got {self.block_drift!r}")
        if self.start < 2:
            raise ValueError(f"start must be at least 2 repeats (a spread needs two), got {self.start}")
        if self.step < 1:
            raise ValueError(f"step must be at least 1, got {self.step}")
        if self.cap < self.start:
            raise ValueError(f"cap ({self.cap}) must be at least start ({self.start})")
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not 0.0 < value < 0.5:
                raise ValueError(f"{name} must lie in (0, 0.5), got {value!r}")
        if self.spending not in SPENDINGS:
            raise ValueError(f"unknown spending {self.spending!r}; expected one of {SPENDINGS}")
        interim = len(self.looks) - 1
        if self.spending == "final" and interim and not 0.0 < self.interim_share * interim < 1.0:
            raise ValueError(f"interim_share {self.interim_share} x {interim} interim looks must "
                             "be positive and leave part of alpha for the cap")

    @property
    def looks(self) -> tuple[int, ...]:
        """Repeat counts at which the data are examined, the cap last."""
        sizes = list(range(self.start, self.cap + 1, self.step))
        if sizes[-1] != self.cap:
            sizes.append(self.cap)
        return tuple(sizes)

    @property
    def weights(self) -> tuple[float, ...]:
        """Share of alpha spent at each look (sums to 1)."""
        k = len(self.looks)
        if k == 1:
            return (1.0,)
        if self.spending == "equal":
            return tuple([1.0 / k] * k)
        return tuple([self.interim_share] * (k - 1) + [1.0 - self.interim_share * (k - 1)])

    def alpha_at(self, look: int) -> float:
        """Nominal one-sided REGRESSED level at look ``look`` (1-based)."""
        return self.alpha * self.weights[look - 1]

    def look_for(self, n: int) -> int:
        """The look reached with ``n`` repeats (1-based; 0 before the first look)."""
        return sum(1 for size in self.looks if size <= n)

    def next_size(self, n: int) -> int | None:
        """Repeat count of the next look after ``n`` repeats, None at or past the cap."""
        return next((size for size in self.looks if size > n), None)

    def describe(self) -> str:
        """The plan in one line."""
        levels = ", ".join(f"{size}:{self.alpha_at(i + 1):.3g}" for i, size in enumerate(self.looks))
        return (f"looks at {', '.join(map(str, self.looks))} repeats; REGRESSED levels "
                f"(repeats:alpha) {levels} (total {self.alpha:g}, {self.spending} spending); "
                f"UNCHANGED/IMPROVED at {self.beta:g} per look; INCONCLUSIVE at the cap stays "
                "INCONCLUSIVE" + (f"; unpaired arms (blocked order, shared baseline) allow "
                                  f"{self.block_drift:.1%} block drift per run" if self.block_drift else ""))


DEFAULT_PLAN = SequentialPlan()


@dataclass(frozen=True)
class SequentialResult:
    """One comparison's verdict with every number behind it.

    ``estimate`` is the relative change (current / reference - 1, from geometric means);
    ``interval`` is the decision interval on the same scale: the bound on the worse side at
    confidence ``1 - alpha_look``, the other at ``1 - beta`` (REGRESSED iff the interval lies
    beyond the limit, UNCHANGED iff inside it). ``p_value`` is the one-sided p of "the change
    is within the limit" at the deciding look, ``p_sequential`` the repeated p-value over the
    looks taken (for FDR). ``more_repeats`` is how many repeats to add for the next look (0
    when decided or at the cap); ``projected_repeats`` a rough total at which the case would
    likely decide if the estimate and spread held, None when no number of current repeats
    can decide it (a stored baseline with too few or too noisy repeats).
    """

    verdict: Verdict
    estimate: float
    interval: tuple[float, float]
    p_value: float
    p_sequential: float
    limit: float
    worse: str
    n_current: int
    n_reference: int
    look: int
    looks: int
    alpha_look: float
    more_repeats: int
    projected_repeats: int | None
    method: str
    note: str = ""

    @property
    def decided(self) -> bool:
        """True unless INCONCLUSIVE."""
        return self.verdict is not Verdict.INCONCLUSIVE

    def describe(self) -> str:
        """One line with the verdict, change, interval, limit, p-values and repeats."""
        low, high = self.interval
        sign = "+" if self.worse == "up" else "-"
        line = (f"{self.verdict.value.upper()}: change {self.estimate:+.2%} "
                f"[{low:+.2%}, {high:+.2%}], limit {sign}{self.limit:.2%}, p={self.p_value:.3g} "
                f"(sequential {self.p_sequential:.3g}), {self.method}, "
                f"{self.n_current} vs {self.n_reference} repeats, look {self.look}/{self.looks}")
        if self.more_repeats:
            line += f"; needs {self.more_repeats} more repeats"
        if self.note:
            line += f" - {self.note}"
        return line

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (strict JSON: a non-finite number becomes None)."""
        def finite(value: Any) -> Any:
            return value if not isinstance(value, float) or math.isfinite(value) else None

        record = {key: finite(value) for key, value in asdict(self).items()}
        record["verdict"] = self.verdict.value
        record["interval"] = [finite(v) for v in self.interval]
        return record


# -- bounds on the log scale ----------------------------------------------------------------
def _bounds(limit: float, worse: str, absolute: bool = False) -> tuple[float, float]:
    """(regression bound, improvement bound) on the log-ratio scale for a relative limit, or
    on the value scale for an ``absolute`` one (a difference in the metric's unit)."""
    if worse not in WORSE_DIRECTIONS:
        raise ValueError(f"worse must be 'up' or 'down', got {worse!r}")
    if not limit >= 0 or not math.isfinite(limit):
        raise ValueError(f"limit must be a non-negative fraction, got {limit!r}")
    if absolute:
        return (limit, -limit) if worse == "up" else (-limit, limit)
    up, down = math.log1p(limit), (math.log1p(-limit) if limit < 1 else -math.inf)
    if worse == "down" and limit >= 1:
        raise ValueError("a metric that regresses going down needs a limit below 100%")
    return (up, down) if worse == "up" else (down, up)


# -- the vectorized engine ----------------------------------------------------------------------
@dataclass(frozen=True)
class SequentialArrays:
    """Per-row outcome of :func:`sequential_arrays` (one row = one case)."""

    code: np.ndarray  # verdict codes, see CODES
    look: np.ndarray  # 1-based look that decided (or the last one taken)
    n_used: np.ndarray  # current repeats used at that look
    estimate: np.ndarray  # log-ratio estimate at that look
    se: np.ndarray
    df: np.ndarray
    p_value: np.ndarray  # one-sided p of H0 "within the limit" at that look
    p_sequential: np.ndarray  # repeated p-value over the looks taken


def _prefix_moments(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    head = x[:, :n]
    mean = head.mean(axis=1)
    var = head.var(axis=1, ddof=1) if n > 1 else np.full(x.shape[0], np.nan)
    return mean, var


def _look_stats(current: np.ndarray, reference: np.ndarray | None, n: int,
                ref_moments: tuple[np.ndarray, np.ndarray] | None, session_sd: float = 0.0,
                session_df: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, standard error, degrees of freedom) at a look of ``n`` current repeats.
    ``session_sd`` is added in quadrature; with ``session_df`` (the degrees of freedom of its
    estimate: an unpaired baseline's repeats - 1) it enters Welch-Satterthwaite's df too."""
    mean_c, var_c = _prefix_moments(current, n)
    a = var_c / n
    if reference is None:  # paired: current holds per-repeat log differences
        est, b, terms = mean_c, np.zeros_like(a), a * a / (n - 1)
    else:
        assert ref_moments is not None
        mean_r, var_r = ref_moments
        m = reference.shape[1]
        est, b = mean_c - mean_r, var_r / m
        terms = a * a / (n - 1) + b * b / (m - 1)
    c = session_sd ** 2
    if session_df is not None:
        terms = terms + c * c / session_df
        total = a + b + c
    else:  # the component is a declared constant: the df of the sampled terms only
        total = a + b
    with np.errstate(divide="ignore", invalid="ignore"):
        df = total ** 2 / terms
    if reference is None and session_df is None:
        df = np.full(current.shape[0], float(n - 1))
    df = np.where(np.isfinite(df) & (df > 0), df, np.inf)
    return est, np.sqrt(a + b + c), df


def _tail_p(z_num: np.ndarray, se: np.ndarray, df: np.ndarray, upper: bool) -> np.ndarray:
    """P(T > z_num/se) (upper) or P(T < z_num/se), with se = 0 handled as a point mass."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, z_num / np.where(se > 0, se, 1.0), np.sign(z_num) * np.inf)
    t = np.where((se == 0) & (z_num == 0), 0.0, t)
    p = t_sf(t if upper else -t, df)
    # A point mass exactly on the bound is neither side: p = 0.5 keeps it undecided.
    return np.where((se == 0) & (z_num == 0), 0.5, p)


def sequential_arrays(current: ArrayLike, reference: ArrayLike | None = None, *, limit: float,
                      worse: str = "up", plan: SequentialPlan = DEFAULT_PLAN,
                      session_sd: float = 0.0, absolute: bool = False, drift: float = 0.0,
                      session_df: float | None = None) -> SequentialArrays:
    """Run the sequential rule on many cases at once.

    ``current`` is an (N, n) array of log values: per-repeat log differences for a paired
    comparison (``reference`` None), or per-repeat log values of the current side with
    ``reference`` an (N, m) array of the fixed reference side's log values. Each row is one
    case; looks use prefixes of the current row (the plan's sizes up to n, the last look
    using all n columns). This is exactly what :func:`compare_paired` and
    :func:`compare_stored` run on one row.

    ``session_sd`` (log scale, default 0) is a variance component that repeats cannot average
    away - the part of a session offset that does not cancel in the ratio - added in
    quadrature to every look's standard error.

    ``absolute``: the values are plain values (not logs) and ``limit`` is an amount in their
    unit: the same rule on the difference scale (for limits such as ``energy_saving:2%``,
    which means 2 points, or ``accept_length:0.1``).

    ``drift`` (same scale as the estimate, default 0): a bias the data cannot reveal and that
    may lie either way up to this size - the block drift between arms that were not measured
    alongside each other (blocked arms on one GPU, a baseline shared from another case). The
    estimate is moved against each verdict by it: REGRESSED iff the lower bound still lies
    beyond the limit after subtracting ``drift``, UNCHANGED / IMPROVED iff the upper bound plus
    ``drift`` lies inside. So P(REGRESSED) <= alpha at the limit for any bias within ``drift``.
    ``session_df``: the degrees of freedom of ``session_sd`` when it is an estimate.
    """
    if not drift >= 0:
        raise ValueError(f"drift must be non-negative, got {drift!r}")
    if not session_sd >= 0:
        raise ValueError(f"session_sd must be non-negative, got {session_sd!r}")
    x = np.atleast_2d(np.asarray(current, dtype=float))
    y = None if reference is None else np.atleast_2d(np.asarray(reference, dtype=float))
    rows, n = x.shape
    if y is not None and (y.shape[0] != rows or y.shape[1] < 2):
        raise ValueError("reference must have one row per case and at least 2 repeats")
    if not (np.all(np.isfinite(x)) and (y is None or np.all(np.isfinite(y)))):
        raise ValueError("samples must be finite (log of positive values)")
    reg_bound, imp_bound = _bounds(limit, worse, absolute)
    up = worse == "up"
    last = plan.look_for(n)
    code = np.zeros(rows, dtype=int)
    look = np.zeros(rows, dtype=int)
    n_used = np.full(rows, n)
    est = np.full(rows, np.nan)
    se_out = np.full(rows, np.nan)
    df_out = np.full(rows, np.nan)
    p_out = np.ones(rows)  # no look yet: no evidence against "within the limit"
    p_seq = np.ones(rows)
    if last == 0:  # not even the first look's repeats yet
        if n >= 2:
            ref_m = None if y is None else _prefix_moments(y, y.shape[1])
            e, s, d = _look_stats(x, y, n, ref_m, session_sd, session_df)
            est, se_out, df_out = e, s, d
            p_out = _tail_p(((e - reg_bound) if up else (reg_bound - e)) - drift, s, d, upper=True)
        return SequentialArrays(code, look, n_used, est, se_out, df_out, p_out, p_seq)
    ref_m = None if y is None else _prefix_moments(y, y.shape[1])
    open_ = np.ones(rows, dtype=bool)
    for k in range(1, last + 1):
        size = n if k == last else plan.looks[k - 1]
        e, s, d = _look_stats(x, y, size, ref_m, session_sd, session_df)
        # p of H0 "within the limit": the data's distance beyond the regression bound, less
        # the drift that could have put it there (and, for the other verdicts, hidden it).
        beyond = (e - reg_bound) if up else (reg_bound - e)
        p_reg = _tail_p(beyond - drift, s, d, upper=True)
        p_ok = _tail_p(beyond + drift, s, d, upper=False)  # H0: at or beyond the limit
        better = (imp_bound - e) if up else (e - imp_bound)  # > 0: beyond the better limit
        p_imp = _tail_p(better - drift, s, d, upper=True) if math.isfinite(imp_bound) else np.ones(rows)
        p_seq = np.where(open_, np.minimum(p_seq, p_reg / plan.weights[k - 1]), p_seq)
        new = np.where(p_reg <= plan.alpha_at(k), REGRESSED,
                       np.where(p_ok <= plan.beta,
                                np.where(p_imp <= plan.beta, IMPROVED, UNCHANGED), INCONCLUSIVE))
        take = open_ & ((new != INCONCLUSIVE) | (k == last))
        code = np.where(take, new, code)
        look = np.where(take, k, look)
        n_used = np.where(take, size, n_used)
        est = np.where(take, e, est)
        se_out = np.where(take, s, se_out)
        df_out = np.where(take, d, df_out)
        p_out = np.where(take, p_reg, p_out)
        open_ &= new == INCONCLUSIVE
    return SequentialArrays(code, look, n_used, est, se_out, df_out, p_out, np.minimum(p_seq, 1.0))


# -- one case -----------------------------------------------------------------------------------
def _positive(values: ArrayLike, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=float).ravel()
    if array.size and not np.all(np.isfinite(array) & (array > 0)):
        raise ValueError(f"{what} must be positive and finite, got {array.tolist()}")
    return array



def _projection(est: float, se_per_unit: float, ref_var_term: float, bound: float,
                level: float) -> int | None:
    """Total current repeats at which |est - bound| would reach the normal critical value."""
    gap = abs(est - bound)
    if gap == 0 or not math.isfinite(se_per_unit):
        return None
    z = _NORMAL.inv_cdf(1.0 - level)  # upper critical value
    room = (gap / z) ** 2 - ref_var_term
    if room <= 0:
        return None
    return int(math.ceil(se_per_unit ** 2 / room))


def rel_text(amount: float, absolute: bool) -> str:
    """A drift amount in words: a relative one (log scale) as a percentage."""
    return f"{amount:.4g}" if absolute else f"{math.expm1(amount):.1%}"


def _result(arrays: SequentialArrays, *, limit: float, worse: str, plan: SequentialPlan,
            n_current: int, n_reference: int, method: str, var_c: float,
            ref_var_term: float, absolute: bool = False, drift: float = 0.0) -> SequentialResult:
    code = int(arrays.code[0])
    look = int(arrays.look[0])
    est, se, df = float(arrays.estimate[0]), float(arrays.se[0]), float(arrays.df[0])
    reg_bound, _ = _bounds(limit, worse, absolute)
    alpha_look = plan.alpha_at(max(look, 1))
    notes = []
    if look == 0:
        verdict = Verdict.INCONCLUSIVE
        more = plan.looks[0] - n_current
        notes.append(f"first look at {plan.looks[0]} repeats")
    else:
        verdict = CODES[code]
        nxt = plan.next_size(n_current)
        more = (nxt - n_current) if verdict is Verdict.INCONCLUSIVE and nxt is not None else 0
        if verdict is Verdict.INCONCLUSIVE and nxt is None:
            notes.append("inconclusive at the repeat cap")
    if math.isfinite(se) and se > 0 and math.isfinite(df):
        lo_level = alpha_look if worse == "up" else plan.beta
        hi_level = plan.beta if worse == "up" else alpha_look
        # Both quantiles in one call (the Newton solve is vectorized; the gate runs it per look).
        t_lo, t_hi = (float(v) for v in t_ppf(np.array([1.0 - lo_level, 1.0 - hi_level]), df))
        low, high = est - t_lo * se, est + t_hi * se
    elif math.isfinite(est) and se == 0:
        low = high = est
    else:
        low, high = -math.inf, math.inf
    low, high = low - drift, high + drift  # the decision interval: what a bias within drift allows
    if drift:
        notes.append(f"block drift allowance {rel_text(drift, absolute)} either way (arms not measured "
                     "alongside each other)")
    projected = None
    if verdict is Verdict.INCONCLUSIVE and math.isfinite(est):
        worse_side = (est > reg_bound) if worse == "up" else (est < reg_bound)
        level = plan.alpha_at(len(plan.looks)) if worse_side else plan.beta
        shifted = reg_bound + drift if (worse == "up") == worse_side else reg_bound - drift
        projected = _projection(est, math.sqrt(var_c), ref_var_term, shifted, level)
        if projected is not None:
            projected = max(projected, n_current + max(more, 1))
        elif ref_var_term > 0:
            notes.append("more current repeats alone cannot decide: the stored baseline's "
                         "repeats (or the session component) limit the precision; re-save the "
                         "baseline with more repeats, or compare in-job")
    rel = lambda v: v if absolute or not math.isfinite(v) else math.expm1(v)  # noqa: E731
    return SequentialResult(
        verdict=verdict, estimate=rel(est), interval=(rel(low), rel(high)),
        p_value=float(arrays.p_value[0]), p_sequential=float(arrays.p_sequential[0]),
        limit=limit, worse=worse, n_current=n_current, n_reference=n_reference,
        look=look, looks=len(plan.looks), alpha_look=alpha_look, more_repeats=int(more),
        projected_repeats=projected, method=method, note="; ".join(notes))


def _finite(values: ArrayLike, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=float).ravel()
    if array.size and not np.all(np.isfinite(array)):
        raise ValueError(f"{what} must be finite, got {array.tolist()}")
    return array


def compare_stored(current: ArrayLike, reference: ArrayLike, *, limit: float, worse: str = "up",
                   plan: SequentialPlan = DEFAULT_PLAN, session_sd: float = 0.0,
                   absolute: bool = False, drift: float = 0.0,
                   session_df: float | None = None) -> SequentialResult:
    """Current run's per-repeat values (e.g. session ratios) against a stored run's.

    Welch's t on log values; the stored side is fixed, the current side grows with the plan.
    Both need at least 2 positive values. Returns the sequential verdict at the look the
    current repeat count reaches. ``session_sd``: see :func:`sequential_arrays` (the spread of
    an unchanged case's ratio across stored sessions estimates it). ``absolute``: Welch's t on
    the values themselves, ``limit`` an amount in their unit (values may be zero or negative).
    ``drift``, ``session_df``: see :func:`sequential_arrays`.
    """
    check = _finite if absolute else _positive
    cur, ref = check(current, "current samples"), check(reference, "reference samples")
    if ref.size < 2:
        raise ValueError(f"the stored reference needs at least 2 repeats, got {ref.size}")
    if cur.size < 1:
        raise ValueError("no current samples")
    x, y = (cur, ref) if absolute else (np.log(cur), np.log(ref))
    if cur.size < 2:
        arrays = SequentialArrays(np.zeros(1, int), np.zeros(1, int), np.array([1]),
                                  np.array([x.mean() - y.mean()]), np.array([np.nan]),
                                  np.array([np.nan]), np.ones(1), np.ones(1))
    else:
        arrays = sequential_arrays(x[None, :], y[None, :], limit=limit, worse=worse, plan=plan,
                                   session_sd=session_sd, absolute=absolute, drift=drift,
                                   session_df=session_df)
    used = int(arrays.n_used[0])
    var_c = float(np.var(x[:used], ddof=1)) if used > 1 else math.nan
    var_r = float(np.var(y, ddof=1))
    return _result(arrays, limit=limit, worse=worse, plan=plan, n_current=used,
                   n_reference=int(ref.size),
                   method="welch-t on differences" if absolute else "welch-t on log ratios",
                   var_c=var_c, ref_var_term=var_r / ref.size + session_sd ** 2, absolute=absolute,
                   drift=drift)


def compare_paired(candidate: ArrayLike, reference: ArrayLike, *, limit: float, worse: str = "up",
                   plan: SequentialPlan = DEFAULT_PLAN, session_sd: float = 0.0,
                   absolute: bool = False, drift: float = 0.0) -> SequentialResult:
    """Candidate against reference measured in the same repeats (in-job A/B).

    Per-repeat ``log(candidate_r / reference_r)``, one-sample t; both sides grow together.
    Passing session ratios (each over the shared baseline of its repeat) gives the same
    answer as passing raw J/token: the baseline cancels. ``absolute``: per-repeat differences
    ``candidate_r - reference_r``, ``limit`` an amount in their unit. ``drift``: see
    :func:`sequential_arrays` (candidate and reference measured in separate blocks).
    """
    check = _finite if absolute else _positive
    cand, ref = check(candidate, "candidate samples"), check(reference, "reference samples")
    if cand.size != ref.size:
        raise ValueError(f"paired samples need equal lengths, got {cand.size} and {ref.size}")
    d = (cand - ref) if absolute else (np.log(cand) - np.log(ref))
    if d.size < 2:
        arrays = SequentialArrays(np.zeros(1, int), np.zeros(1, int), np.array([d.size]),
                                  np.array([d.mean() if d.size else np.nan]), np.array([np.nan]),
                                  np.array([np.nan]), np.ones(1), np.ones(1))
    else:
        arrays = sequential_arrays(d[None, :], None, limit=limit, worse=worse, plan=plan,
                                   session_sd=session_sd, absolute=absolute, drift=drift)
    used = int(arrays.n_used[0])
    var_c = float(np.var(d[:used], ddof=1)) if used > 1 else math.nan
    return _result(arrays, limit=limit, worse=worse, plan=plan, n_current=used,
                   n_reference=used,
                   method="paired t on differences" if absolute else "paired t on log ratios",
                   var_c=var_c, ref_var_term=session_sd ** 2, absolute=absolute, drift=drift)


# -- per-request metrics (accept length, acceptance rate) ---------------------------------------
#: Below this many bootstrap replicates in a tail the empirical share says little more than
#: "under (count + 1) / (resamples + 1)": the resampling resolution, 2e-4 at 5000 resamples.
#: Such a tail is read from the replicates' normal fit instead (see :func:`_bootstrap_share`).
TAIL_MIN_REPLICATES = 10


def _bootstrap_share(boot: np.ndarray, bound: float, *, above: bool) -> float:
    """The share of bootstrap replicates at or ``above`` ``bound`` (else at or below), as a
    one-sided p-value, resolved beyond the resampling resolution.

    With at least :data:`TAIL_MIN_REPLICATES` replicates in the tail it is the usual
    ``(1 + count) / (resamples + 1)``. With fewer, that floor would cap how small p can get
    (so Benjamini-Hochberg over a large suite could never reject: at 1,000 comparisons and
    Q = 0.05 the smallest p must reach 5e-5 over the plan's look weight), and the tail is
    instead the normal tail of the replicates' own mean and spread, ``P(N(m, s) beyond
    bound)``: the usual large-sample form of a bootstrap test, accurate where the replicates
    of a log ratio of pooled means are near normal, as they are over a few dozen requests.
    It is continuous down to about 1e-300.
    """
    count = int(np.sum(boot >= bound if above else boot <= bound))
    if count >= TAIL_MIN_REPLICATES:
        return float((1 + count) / (boot.size + 1))
    mean, sd = float(np.mean(boot)), float(np.std(boot, ddof=1)) if boot.size > 1 else 0.0
    if not sd > 0:
        return float((1 + count) / (boot.size + 1))
    z = (bound - mean) / sd if above else (mean - bound) / sd
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def compare_per_request(current_num: ArrayLike, current_den: ArrayLike, reference_num: ArrayLike,
                        reference_den: ArrayLike, *, limit: float, worse: str = "down",
                        offset: float = 0.0, paired: bool = True, n_repeats: int | None = None,
                        plan: SequentialPlan = DEFAULT_PLAN, resamples: int = 4000,
                        seed: int = 0) -> SequentialResult:
    """A pooled per-request metric ``offset + sum(num) / sum(den)`` judged on its requests.

    accept_length: ``num`` = accepted drafts, ``den`` = verify steps, ``offset`` = 1;
    acceptance_rate: ``num`` = accepted, ``den`` = proposed drafts, ``offset`` = 0. Each entry
    is one request's total over the run's repeats. The change is the ratio of the pooled
    metrics, current over reference; its interval is a seeded percentile bootstrap over
    requests - resampling the same request indices on both sides when ``paired`` (the same
    fixed prompt set in both runs, so prompt difficulty cancels), each side on its own
    otherwise. The decision is the same limit rule as the energy gate, at the level of the
    look ``n_repeats`` reaches (the cap's when None). A deterministic engine gives identical
    per-request values, so an unchanged drafter is UNCHANGED at once and a changed one is
    decided by how consistently its requests moved. ``p_sequential`` is this look's
    ``p / w_look``; a caller that judges the metric at several looks keeps the minimum over
    them (that minimum is the repeated p-value).
    """
    cn, cd = np.asarray(current_num, float).ravel(), np.asarray(current_den, float).ravel()
    rn, rd = np.asarray(reference_num, float).ravel(), np.asarray(reference_den, float).ravel()
    if cn.size != cd.size or rn.size != rd.size:
        raise ValueError("numerators and denominators need one entry per request")
    if paired and cn.size != rn.size:
        raise ValueError(f"paired requests need equal counts, got {cn.size} and {rn.size}")
    if cn.size < 2 or rn.size < 2:
        raise ValueError("need at least 2 requests a side")
    for arr in (cn, cd, rn, rd):
        if not np.all(np.isfinite(arr) & (arr >= 0)):
            raise ValueError("per-request counts must be finite and non-negative")
    if cd.sum() <= 0 or rd.sum() <= 0:
        raise ValueError("no denominators (no verify steps / proposals) on one side")
    reg_bound, imp_bound = _bounds(limit, worse)
    look = len(plan.looks) if n_repeats is None else max(1, plan.look_for(n_repeats))
    alpha_look = plan.alpha_at(look)

    def metric(num: np.ndarray, den: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return offset + num.sum(axis=-1) / den.sum(axis=-1)

    point = math.log(float(metric(cn, cd)) / float(metric(rn, rd)))
    rng = np.random.default_rng(seed)
    idx_c = rng.integers(0, cn.size, size=(resamples, cn.size))
    idx_r = idx_c if paired else rng.integers(0, rn.size, size=(resamples, rn.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = np.log(metric(cn[idx_c], cd[idx_c]) / metric(rn[idx_r], rd[idx_r]))
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        raise ValueError("no bootstrap replicate had a defined metric on both sides")
    up = worse == "up"
    # One-sided bootstrap p of H0 "within the limit": the share of replicates not beyond it
    # (beyond the resampling resolution, the bootstrap's normal tail: _bootstrap_share).
    p_reg = _bootstrap_share(boot, reg_bound, above=not up)
    p_ok = _bootstrap_share(boot, reg_bound, above=up)
    p_imp = _bootstrap_share(boot, imp_bound, above=up) if math.isfinite(imp_bound) else 1.0
    if np.all(boot == boot[0]):  # no spread at all (deterministic engine): the point decides
        beyond = point > reg_bound if up else point < reg_bound
        inside = point < reg_bound if up else point > reg_bound
        better = (point < imp_bound if up else point > imp_bound) if math.isfinite(imp_bound) else False
        p_reg = 0.0 if beyond else 1.0
        p_ok = 0.0 if inside else 1.0
        p_imp = 0.0 if better else 1.0
    if p_reg <= alpha_look:
        verdict = Verdict.REGRESSED
    elif p_ok <= plan.beta:
        verdict = Verdict.IMPROVED if p_imp <= plan.beta else Verdict.UNCHANGED
    else:
        verdict = Verdict.INCONCLUSIVE
    lo_level, hi_level = (alpha_look, plan.beta) if up else (plan.beta, alpha_look)
    low, high = (float(np.quantile(boot, lo_level)), float(np.quantile(boot, 1.0 - hi_level)))
    nxt = plan.next_size(n_repeats) if n_repeats is not None else None
    more = 0
    if verdict is Verdict.INCONCLUSIVE and nxt is not None and n_repeats is not None:
        more = nxt - n_repeats
    note = ""
    if verdict is Verdict.INCONCLUSIVE:
        note = ("the spread is across requests: more repeats of the same prompts narrow it "
                "only where outputs vary run to run; more prompts narrow it for sure")
    return SequentialResult(
        verdict=verdict, estimate=math.expm1(point), interval=(math.expm1(low), math.expm1(high)),
        p_value=p_reg, p_sequential=min(1.0, p_reg / plan.weights[look - 1]), limit=limit,
        worse=worse, n_current=int(cn.size), n_reference=int(rn.size), look=look,
        looks=len(plan.looks), alpha_look=alpha_look, more_repeats=int(more),
        projected_repeats=None,
        method=("paired" if paired else "two-sample") + f" bootstrap over requests ({resamples})",
        note=note)


__all__ = ["CODES", "DEFAULT_PLAN", "SequentialArrays", "SequentialPlan",
           "SequentialResult", "Verdict", "compare_paired", "compare_per_request",
           "compare_stored", "sequential_arrays"]
