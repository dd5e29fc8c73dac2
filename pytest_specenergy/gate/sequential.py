"""Sequential, limit-based verdicts for per-repeat samples: REGRESSED iff the change's lower bound
is past the limit, at any repeat count (statistics, look plan, error spending, block drift:
docs/gate.md#the-sequential-limit-test)."""

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
#: A spread this small relative to the change (or to 1) is no spread: a deterministic meter's
#: per-repeat figures still differ in their last bits where the summation order differs (1e-16
#: relative), and a standard error of that size is floating point, not measurement.
NO_SPREAD = 1e-9
SPENDINGS = ("final", "equal")


#: Integer codes of the vectorized engine (:func:`sequential_arrays`).
CODES = {0: Verdict.INCONCLUSIVE, 1: Verdict.UNCHANGED, 2: Verdict.IMPROVED, 3: Verdict.REGRESSED}
INCONCLUSIVE, UNCHANGED, IMPROVED, REGRESSED = 0, 1, 2, 3


@dataclass(frozen=True)
class SequentialPlan:
    """When to look (``start, start + step, ...`` and ``cap``) and how much error each look may
    spend: ``alpha`` bounds P(REGRESSED) at the limit over all looks, ``beta`` is the per-look level
    of the UNCHANGED / IMPROVED bound."""

    start: int = 3
    step: int = 2
    cap: int = DEFAULT_CAP
    alpha: float = DEFAULT_ALPHA
    beta: float = 0.05
    spending: str = "final"
    interim_share: float = 0.02
    #: The block drift (a fraction) allowed either way between arms not measured alongside each
    #: other.
    block_drift: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.block_drift < 0.5:
            raise ValueError(f"block_drift must lie in [0, 0.5), got {self.block_drift!r}")
        if self.start < 2:
            raise ValueError(
                f"start must be at least 2 repeats (a spread needs two), got {self.start}"
            )
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
            raise ValueError(
                f"interim_share {self.interim_share} x {interim} interim looks must "
                "be positive and leave part of alpha for the cap"
            )

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
        # the whole alpha at the cap, whatever interim_share (checked only with interim looks)
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
        levels = ", ".join(
            f"{size}:{self.alpha_at(i + 1):.3g}" for i, size in enumerate(self.looks)
        )
        drift = (
            f"; unpaired arms (blocked order, shared baseline) allow {self.block_drift:.1%} "
            "block drift per run"
        )
        return (
            f"looks at {', '.join(map(str, self.looks))} repeats; REGRESSED levels "
            f"(repeats:alpha) {levels} (total {self.alpha:g}, {self.spending} spending); "
            f"UNCHANGED/IMPROVED at {self.beta:g} per look; INCONCLUSIVE at the cap stays "
            "INCONCLUSIVE" + (drift if self.block_drift else "")
        )


DEFAULT_PLAN = SequentialPlan()


@dataclass(frozen=True)
class SequentialResult:
    """One comparison's verdict with every number behind it.

    ``estimate`` is the relative change (current / reference - 1, from geometric means);
    ``interval`` the decision interval on that scale, the worse side's bound at confidence
    ``1 - alpha_look``, the other's at ``1 - beta``. ``p_value``: the one-sided p of "within the
    limit" at the deciding look; ``p_sequential``: the repeated p-value (for FDR).
    ``more_repeats``: repeats to add for the next look (0 when decided or at the cap).
    ``projected_repeats``: a rough total at which the case would likely decide if the estimate and
    spread held, None when no number of current repeats can (a too small or noisy baseline)."""

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
    #: No spread on either side at the deciding look (a deterministic meter prices the same tokens
    #: the same way every repeat): the change is known exactly, with no interval or p-value to
    #: give (``interval`` holds the estimate, widened only by a block-drift allowance).
    exact: bool = False

    def describe(self) -> str:
        """One line with the verdict, change, interval, limit, p-values and repeats."""
        low, high = self.interval
        sign = "+" if self.worse == "up" else "-"
        if self.exact:
            line = (
                f"{self.verdict.value.upper()}: exact change {self.estimate:+.2%} (no spread in "
                f"{self.n_current} vs {self.n_reference} repeats: a deterministic meter), limit "
                f"{sign}{self.limit:.2%}, {self.method}, look {self.look}/{self.looks}"
            )
            return f"{line} - {self.note}" if self.note else line
        line = (
            f"{self.verdict.value.upper()}: change {self.estimate:+.2%} [{low:+.2%}, "
            f"{high:+.2%}], limit {sign}{self.limit:.2%}, p={self.p_value:.3g} (sequential "
            f"{self.p_sequential:.3g}), {self.method}, {self.n_current} vs {self.n_reference} "
            f"repeats, look {self.look}/{self.looks}"
        )
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
    """(regression, improvement) bound: log-ratio scale for a relative limit, the metric's unit if
    ``absolute``."""
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


def _look_stats(
    current: np.ndarray,
    reference: np.ndarray | None,
    n: int,
    ref_moments: tuple[np.ndarray, np.ndarray] | None,
    session_sd: float = 0.0,
    session_df: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, standard error, df) at ``n`` current repeats; with ``session_df``, ``session_sd``
    enters the df."""
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
    c = session_sd**2
    total = a + b  # a declared constant component: the df of the sampled terms only
    if session_df is not None:
        terms, total = terms + c * c / session_df, total + c
    with np.errstate(divide="ignore", invalid="ignore"):
        df = total**2 / terms
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


def sequential_arrays(
    current: ArrayLike,
    reference: ArrayLike | None = None,
    *,
    limit: float,
    worse: str = "up",
    plan: SequentialPlan = DEFAULT_PLAN,
    session_sd: float = 0.0,
    absolute: bool = False,
    drift: float = 0.0,
    session_df: float | None = None,
) -> SequentialArrays:
    """Run the sequential rule on many cases at once (what :func:`compare_paired` and
    :func:`compare_stored` run on one row).

    ``current`` is an (N, n) array of log values: per-repeat log differences for a paired
    comparison (``reference`` None), else the current side's, with ``reference`` (N, m) the fixed
    side's. Looks use prefixes of each row (the last look all n columns). ``session_sd`` (log
    scale): a variance component repeats cannot average away (the part of a session offset that
    does not cancel in the ratio), added in quadrature to every look's standard error;
    ``session_df``: its degrees of freedom when it is an estimate. ``absolute``: plain values, and
    ``limit`` an amount in their unit (``energy_saving:2%``, 2 points; ``accept_length:0.1``).
    ``drift`` (the estimate's scale): a bias the data cannot reveal, up to this size either way
    (the block drift between arms not measured alongside each other); each verdict's bound must
    clear the limit by it, so P(REGRESSED) <= alpha at the limit for any bias within ``drift``."""
    for name, value in (("drift", drift), ("session_sd", session_sd)):
        if not value >= 0:
            raise ValueError(f"{name} must be non-negative, got {value!r}")
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
    # Each row's outcome (SequentialArrays' fields); p_value 1 before a look: no evidence against
    # "within the limit".
    out = {
        "code": np.zeros(rows, dtype=int),
        "look": np.zeros(rows, dtype=int),
        "n_used": np.full(rows, n),
        "estimate": np.full(rows, np.nan),
        "se": np.full(rows, np.nan),
        "df": np.full(rows, np.nan),
        "p_value": np.ones(rows),
    }
    p_seq = np.ones(rows)
    ref_m = None if y is None else _prefix_moments(y, y.shape[1])
    if last == 0 and n >= 2:  # not even the first look's repeats yet: the numbers so far
        est, se, df = _look_stats(x, y, n, ref_m, session_sd, session_df)
        p_now = _tail_p(
            ((est - reg_bound) if up else (reg_bound - est)) - drift, se, df, upper=True
        )
        out.update(estimate=est, se=se, df=df, p_value=p_now)
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
        p_imp = (
            _tail_p(better - drift, s, d, upper=True) if math.isfinite(imp_bound) else np.ones(rows)
        )
        p_seq = np.where(open_, np.minimum(p_seq, p_reg / plan.weights[k - 1]), p_seq)
        new = np.where(
            p_reg <= plan.alpha_at(k),
            REGRESSED,
            np.where(
                p_ok <= plan.beta, np.where(p_imp <= plan.beta, IMPROVED, UNCHANGED), INCONCLUSIVE
            ),
        )
        take = open_ & ((new != INCONCLUSIVE) | (k == last))
        at_look = {
            "code": new,
            "look": k,
            "n_used": size,
            "estimate": e,
            "se": s,
            "df": d,
            "p_value": p_reg,
        }
        out = {name: np.where(take, value, out[name]) for name, value in at_look.items()}
        open_ &= new == INCONCLUSIVE
    return SequentialArrays(**out, p_sequential=np.minimum(p_seq, 1.0))


# -- one case -----------------------------------------------------------------------------------
def _checked(values: ArrayLike, what: str, absolute: bool) -> np.ndarray:
    """``values`` as a flat array, refused unless finite (and positive unless ``absolute``)."""
    array = np.asarray(values, dtype=float).ravel()
    valid = np.isfinite(array) if absolute else np.isfinite(array) & (array > 0)
    if array.size and not np.all(valid):
        kind = "finite" if absolute else "positive and finite"
        raise ValueError(f"{what} must be {kind}, got {array.tolist()}")
    return array


def _projection(
    est: float, se_per_unit: float, ref_var_term: float, bound: float, level: float
) -> int | None:
    """Total current repeats at which |est - bound| would reach the normal critical value."""
    gap = abs(est - bound)
    if gap == 0 or not math.isfinite(se_per_unit):
        return None
    z = _NORMAL.inv_cdf(1.0 - level)  # upper critical value
    room = (gap / z) ** 2 - ref_var_term
    return None if room <= 0 else int(math.ceil(se_per_unit**2 / room))


def _one_case(
    x: np.ndarray,
    y: np.ndarray | None,
    method: str,
    *,
    limit: float,
    worse: str,
    plan: SequentialPlan,
    session_sd: float,
    absolute: bool,
    drift: float,
    session_df: float | None = None,
) -> SequentialResult:
    """One case's verdict: ``x`` current and ``y`` stored (log) values, or ``y`` None and ``x``
    paired differences."""
    if x.size < 2:  # no look possible yet: only the estimate so far
        estimate = x.mean() - y.mean() if y is not None else (x.mean() if x.size else np.nan)
        arrays = SequentialArrays(
            np.zeros(1, int),
            np.zeros(1, int),
            np.array([x.size]),
            np.array([estimate]),
            np.array([np.nan]),
            np.array([np.nan]),
            np.ones(1),
            np.ones(1),
        )
    else:
        arrays = sequential_arrays(
            x[None, :],
            None if y is None else y[None, :],
            limit=limit,
            worse=worse,
            plan=plan,
            session_sd=session_sd,
            absolute=absolute,
            drift=drift,
            session_df=session_df,
        )
    n_current = int(arrays.n_used[0])
    var_c = float(np.var(x[:n_current], ddof=1)) if n_current > 1 else math.nan
    ref_var_term = session_sd**2 if y is None else float(np.var(y, ddof=1)) / y.size + session_sd**2
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
        verdict = CODES[int(arrays.code[0])]
        nxt = plan.next_size(n_current)
        more = (nxt - n_current) if verdict is Verdict.INCONCLUSIVE and nxt is not None else 0
        if verdict is Verdict.INCONCLUSIVE and nxt is None:
            notes.append("inconclusive at the repeat cap")
    exact = look > 0 and math.isfinite(est) and se <= NO_SPREAD * max(1.0, abs(est))
    if math.isfinite(se) and se > 0 and math.isfinite(df) and not exact:
        lo_level, hi_level = (alpha_look, plan.beta) if worse == "up" else (plan.beta, alpha_look)
        # Both quantiles in one call (the Newton solve is vectorized; the gate runs it per look).
        t_lo, t_hi = (float(v) for v in t_ppf(np.array([1.0 - lo_level, 1.0 - hi_level]), df))
        low, high = est - t_lo * se, est + t_hi * se
    elif math.isfinite(est) and (se == 0 or exact):
        low = high = est
    else:
        low, high = -math.inf, math.inf
    low, high = low - drift, high + drift  # the decision interval: what a bias within drift allows
    if drift:
        amount = f"{drift:.4g}" if absolute else f"{math.expm1(drift):.1%}"
        notes.append(
            f"block drift allowance {amount} either way (arms not measured alongside each other)"
        )
    projected = None
    if verdict is Verdict.INCONCLUSIVE and math.isfinite(est):
        worse_side = (est > reg_bound) if worse == "up" else (est < reg_bound)
        level = plan.alpha_at(len(plan.looks)) if worse_side else plan.beta
        shifted = reg_bound + drift if (worse == "up") == worse_side else reg_bound - drift
        projected = _projection(est, math.sqrt(var_c), ref_var_term, shifted, level)
        if projected is not None:
            projected = max(projected, n_current + max(more, 1))
        elif ref_var_term > 0:
            notes.append(
                "more current repeats alone cannot decide: the stored baseline's repeats (or the "
                "session component) limit the precision; re-save the baseline with more repeats, "
                "or compare in-job"
            )
    rel = lambda v: v if absolute or not math.isfinite(v) else math.expm1(v)  # noqa: E731
    return SequentialResult(
        verdict=verdict,
        estimate=rel(est),
        interval=(rel(low), rel(high)),
        p_value=float(arrays.p_value[0]),
        p_sequential=float(arrays.p_sequential[0]),
        limit=limit,
        worse=worse,
        n_current=n_current,
        n_reference=n_current if y is None else int(y.size),
        look=look,
        looks=len(plan.looks),
        alpha_look=alpha_look,
        more_repeats=int(more),
        projected_repeats=projected,
        method=method,
        note="; ".join(notes),
        exact=exact,
    )


def compare_stored(
    current: ArrayLike,
    reference: ArrayLike,
    *,
    limit: float,
    worse: str = "up",
    plan: SequentialPlan = DEFAULT_PLAN,
    session_sd: float = 0.0,
    absolute: bool = False,
    drift: float = 0.0,
    session_df: float | None = None,
) -> SequentialResult:
    """Current run's per-repeat values (e.g. session ratios) against a stored run's by Welch's t:
    the stored side is fixed, the current side grows with the plan; each needs 2+ positive values
    (finite if ``absolute``). The spread of an unchanged case's ratio across stored sessions
    estimates ``session_sd``. ``absolute``: Welch's t on the values themselves, ``limit`` an
    amount in their unit (values may be zero or negative). ``session_sd``, ``session_df`` and
    ``drift`` as for :func:`sequential_arrays`."""
    cur, ref = (
        _checked(current, "current samples", absolute),
        _checked(reference, "reference samples", absolute),
    )
    if ref.size < 2:
        raise ValueError(f"the stored reference needs at least 2 repeats, got {ref.size}")
    if cur.size < 1:
        raise ValueError("no current samples")
    x, y = (cur, ref) if absolute else (np.log(cur), np.log(ref))
    return _one_case(
        x,
        y,
        "welch-t on differences" if absolute else "welch-t on log ratios",
        limit=limit,
        worse=worse,
        plan=plan,
        session_sd=session_sd,
        absolute=absolute,
        drift=drift,
        session_df=session_df,
    )


def compare_paired(
    candidate: ArrayLike,
    reference: ArrayLike,
    *,
    limit: float,
    worse: str = "up",
    plan: SequentialPlan = DEFAULT_PLAN,
    session_sd: float = 0.0,
    absolute: bool = False,
    drift: float = 0.0,
) -> SequentialResult:
    """Candidate against reference measured in the same repeats (in-job A/B): one-sample t on the
    per-repeat ``log(candidate_r / reference_r)``; both sides grow together. Session ratios (each
    over its repeat's shared baseline) give the same answer as raw J/token: the baseline cancels.
    ``absolute``: per-repeat differences, ``limit`` an amount in their unit. ``drift``: as for
    :func:`sequential_arrays` (arms measured in separate blocks)."""
    cand, ref = (
        _checked(candidate, "candidate samples", absolute),
        _checked(reference, "reference samples", absolute),
    )
    if cand.size != ref.size:
        raise ValueError(f"paired samples need equal lengths, got {cand.size} and {ref.size}")
    d = (cand - ref) if absolute else (np.log(cand) - np.log(ref))
    return _one_case(
        d,
        None,
        "paired t on differences" if absolute else "paired t on log ratios",
        limit=limit,
        worse=worse,
        plan=plan,
        session_sd=session_sd,
        absolute=absolute,
        drift=drift,
    )


# -- per-request metrics (accept length, acceptance rate) ---------------------------------------
#: Below this many replicates in a tail the empirical share says little more than "under the
#: resampling resolution" (2e-4 at 5000): such a tail is read from the replicates' normal fit.
TAIL_MIN_REPLICATES = 10


def _bootstrap_share(boot: np.ndarray, bound: float, *, above: bool) -> float:
    """The one-sided p-value of the replicates at or ``above`` ``bound`` (else at or below):
    ``(1 + count) / (resamples + 1)`` with at least :data:`TAIL_MIN_REPLICATES` in the tail, else
    ``P(N(m, s) beyond bound)`` of the replicates' mean and spread (the large-sample bootstrap
    test; replicates of a log ratio of pooled means are near normal over a few dozen requests).
    The count alone would cap how small p gets, so Benjamini-Hochberg over a large suite could
    never reject (at 1,000 comparisons and Q = 0.05 the smallest p must reach 5e-5 over the look
    weight)."""
    count = int(np.sum(boot >= bound if above else boot <= bound))
    if count >= TAIL_MIN_REPLICATES:
        return float((1 + count) / (boot.size + 1))
    mean, sd = float(np.mean(boot)), float(np.std(boot, ddof=1)) if boot.size > 1 else 0.0
    if not sd > 0:
        return float((1 + count) / (boot.size + 1))
    z = (bound - mean) / sd if above else (mean - bound) / sd
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def compare_per_request(
    current_num: ArrayLike,
    current_den: ArrayLike,
    reference_num: ArrayLike,
    reference_den: ArrayLike,
    *,
    limit: float,
    worse: str = "down",
    offset: float = 0.0,
    paired: bool = True,
    n_repeats: int | None = None,
    plan: SequentialPlan = DEFAULT_PLAN,
    resamples: int = 4000,
    seed: int = 0,
) -> SequentialResult:
    """A pooled per-request metric ``offset + sum(num) / sum(den)`` by the energy gate's limit rule
    on a seeded bootstrap over requests, at the look ``n_repeats`` reaches (the cap's when None).

    accept_length: ``num`` accepted drafts, ``den`` verify steps, ``offset`` 1; acceptance_rate:
    ``num`` accepted, ``den`` proposed drafts, ``offset`` 0; one entry per request (its total over
    the repeats). The change is the ratio of the pooled metrics, its interval a seeded percentile
    bootstrap over requests (the same indices on both sides when ``paired``: one fixed prompt set,
    so prompt difficulty cancels); a deterministic engine's unchanged drafter is UNCHANGED at
    once. ``p_sequential`` is this look's ``p / w_look``; a caller judging several looks keeps the
    minimum (the repeated p-value)."""
    cn, cd, rn, rd = (
        np.asarray(v, float).ravel()
        for v in (current_num, current_den, reference_num, reference_den)
    )
    if cn.size != cd.size or rn.size != rd.size:
        raise ValueError("numerators and denominators need one entry per request")
    if paired and cn.size != rn.size:
        raise ValueError(f"paired requests need equal counts, got {cn.size} and {rn.size}")
    if cn.size < 2 or rn.size < 2:
        raise ValueError("need at least 2 requests a side")
    if not all(np.all(np.isfinite(arr) & (arr >= 0)) for arr in (cn, cd, rn, rd)):
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
    # One-sided bootstrap p of H0 "within the limit": the share of replicates not beyond it.
    p_reg = _bootstrap_share(boot, reg_bound, above=not up)
    p_ok = _bootstrap_share(boot, reg_bound, above=up)
    p_imp = _bootstrap_share(boot, imp_bound, above=up) if math.isfinite(imp_bound) else 1.0
    exact = bool(np.all(np.abs(boot - boot[0]) <= NO_SPREAD * max(1.0, abs(float(boot[0])))))
    if exact:  # no spread at all (deterministic engine): the point decides
        beyond = point > reg_bound if up else point < reg_bound
        inside = point < reg_bound if up else point > reg_bound
        better = (
            (point < imp_bound if up else point > imp_bound) if math.isfinite(imp_bound) else False
        )
        p_reg, p_ok, p_imp = (0.0 if shown else 1.0 for shown in (beyond, inside, better))
    if p_reg <= alpha_look:
        verdict = Verdict.REGRESSED
    elif p_ok <= plan.beta:
        verdict = Verdict.IMPROVED if p_imp <= plan.beta else Verdict.UNCHANGED
    else:
        verdict = Verdict.INCONCLUSIVE
    lo_level, hi_level = (alpha_look, plan.beta) if up else (plan.beta, alpha_look)
    low, high = (float(np.quantile(boot, lo_level)), float(np.quantile(boot, 1.0 - hi_level)))
    more, note = 0, ""
    if verdict is Verdict.INCONCLUSIVE:
        if n_repeats is not None and (nxt := plan.next_size(n_repeats)) is not None:
            more = nxt - n_repeats
        note = (
            "the spread is across requests: more repeats of the same prompts narrow it "
            "only where outputs vary run to run; more prompts narrow it for sure"
        )
    return SequentialResult(
        verdict=verdict,
        estimate=math.expm1(point),
        interval=(math.expm1(low), math.expm1(high)),
        p_value=p_reg,
        p_sequential=min(1.0, p_reg / plan.weights[look - 1]),
        limit=limit,
        worse=worse,
        n_current=int(cn.size),
        n_reference=int(rn.size),
        look=look,
        looks=len(plan.looks),
        alpha_look=alpha_look,
        more_repeats=int(more),
        projected_repeats=None,
        note=note,
        method=("paired" if paired else "two-sample") + f" bootstrap over requests ({resamples})",
        exact=exact,
    )


__all__ = [
    "CODES",
    "DEFAULT_PLAN",
    "SequentialArrays",
    "SequentialPlan",
    "SequentialResult",
    "Verdict",
    "compare_paired",
    "compare_per_request",
    "compare_stored",
    "sequential_arrays",
]
