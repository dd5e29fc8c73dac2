"""The regression gate: one case's record against its baseline, per-repeat metrics by the sequential
limit rule, the match fraction as a fact, runs on another machine, meter, engine or scenario
INCOMPARABLE (docs/gate.md)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Sequence

import numpy as np

import pytest_specenergy.gate.sequential as sequential
import pytest_specenergy.gate.session_term as session_term
import pytest_specenergy.gate.stats as stats
from pytest_specenergy import metrics
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import Comparison
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.limits import DEFAULT_BLOCK_DRIFT
from pytest_specenergy.gate.limits import GATE_METRICS
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.machine import comparable
from pytest_specenergy.gate.machine import document_run_info
from pytest_specenergy.gate.machine import run_info
from pytest_specenergy.gate.sequential import SequentialPlan
from pytest_specenergy.gate.session_term import SessionTerm
from pytest_specenergy.gate.settings import DEFAULT_ALPHA
from pytest_specenergy.gate.settings import DEFAULT_CAP
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.gate.verdict import worst

INCONCLUSIVE_POLICIES = ("fail", "warn", "xfail")


@dataclass(frozen=True)
class MetricRow:
    """One metric of one case against its baseline. ``change_rel`` is ``current / baseline - 1``
    of the limit's statistic (None for a zero baseline); ``method``: ``sequential <test>, look
    k/K``, ``deterministic`` or ``none``. ``p_value``: the one-sided p of "within the limit" at the
    deciding look; ``p_sequential``: the repeated p-value (FDR's). ``interval`` and ``estimate``
    are on the change scale."""

    metric: str
    stat: str
    unit: str
    baseline: float | None
    current: float | None
    change_abs: float | None
    change_rel: float | None
    limit: FailLimit
    p_value: float | None
    method: str
    n_baseline: int
    n_current: int
    interval: tuple[float, float] | None
    verdict: Verdict
    note: str = ""
    p_sequential: float | None = None
    more_repeats: int = 0
    estimate: float | None = None
    #: ``equivalence`` only: the numerical ties counted as matches, (baseline, current).
    ties: tuple[int, int] | None = None
    #: No spread on either side (a deterministic meter): the change is exact, and the row has no
    #: p-value and no interval (one would read p=0 and a zero-width "interval").
    exact: bool = False

    def change_text(self) -> str:
        """The change in words: relative and absolute (points for fraction-point metrics)."""
        if self.change_abs is None:
            return "n/a"
        absolute = f"{self.change_abs:+.4g} {self.unit}"
        if GATE_METRICS[self.metric].percent_is_points:
            absolute = f"{self.change_abs * 100:+.3g} pts"
        return absolute if self.change_rel is None else f"{self.change_rel:+.2%} ({absolute})"

    def describe(self) -> str:
        """One line with every number: values, change, limit, p-value, method, verdict."""
        p = "n/a" if self.p_value is None else f"{self.p_value:.3g}"
        if self.method == "deterministic":
            how = "deterministic: one match fraction, real divergences only"
        elif self.exact:
            how = (
                f"{self.method}, {self.n_baseline} vs {self.n_current} repeats, exact: no spread "
                "on either side (a deterministic meter), the change is the measured one"
            )
            if self.interval is not None:  # only a block-drift allowance widens it
                low, high = self.interval
                how += f", with the block-drift allowance [{low:+.2%}, {high:+.2%}]"
        else:
            how = f"{self.method}, {self.n_baseline} vs {self.n_current} repeats"
            if self.interval is not None:
                low, high = self.interval
                relative_scale = "log ratios" in self.method or "bootstrap" in self.method
                span = f"{low:+.2%}, {high:+.2%}" if relative_scale else f"{low:+.4g}, {high:+.4g}"
                how += f", change interval [{span}]"
        line = (
            f"{self.metric} ({self.stat}): baseline {metrics.fmt(self.baseline, '.4g')} "
            f"{self.unit} -> current {metrics.fmt(self.current, '.4g')} {self.unit}, change "
            f"{self.change_text()}, limit {self.limit.describe()} [{self.limit.expr}]"
            f"{'' if self.exact else f', p={p}'} ({how}): {self.verdict.value.upper()}"
        )
        return f"{line} - {self.note}" if self.note else line

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (the fields in order)."""
        record = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            **record,
            "limit": self.limit.expr,
            "interval": list(self.interval) if self.interval else None,
            "verdict": self.verdict.value,
            "exact": self.exact or None,
            "ties": list(self.ties) if self.ties is not None else None,
        }


@dataclass(frozen=True)
class CaseComparison:
    """A case's verdict against its baseline, with a row per checked metric."""

    case_id: str
    verdict: Verdict
    rows: tuple[MetricRow, ...]
    reasons: tuple[str, ...] = ()
    alpha: float = DEFAULT_ALPHA
    #: In-job A/B: the reference drafter the candidate was judged against (None: a baseline).
    reference: str | None = None

    def failure_message(self, baseline_path: str | Path | None) -> str:
        """What a failing test shows: every metric's row, and the baseline file."""
        source = f"baseline {baseline_path}" if baseline_path else "its baseline"
        if self.reference is not None:
            source = f"reference drafter {self.reference} (in-job A/B)"
        if self.verdict is Verdict.NO_BASELINE:
            return f"specenergy: no baseline for {self.case_id} ({source})"
        if self.verdict is Verdict.INCOMPARABLE and self.reasons:
            return f"specenergy: {self.case_id} cannot be compared with {source}:\n" + "\n".join(
                f"  - {r}" for r in self.reasons
            )
        # The rows that decided the verdict come first.
        ordered = sorted(self.rows, key=lambda r: r.verdict.rank)
        return f"specenergy: {self.case_id} {self.verdict.value} against {source}:\n" + "\n".join(
            f"  {r.describe()}" for r in ordered
        )

    def summary(self) -> str:
        """One short line: the verdict and the deciding metrics."""
        deciding = [
            r for r in self.rows if r.verdict is self.verdict and r.verdict is not Verdict.PASSED
        ]
        detail = ", ".join(f"{r.metric} {r.change_text()}" for r in deciding)
        return f"{self.case_id}: {self.verdict.value}" + (f" ({detail})" if detail else "")

    def record(self) -> Comparison:
        """As the run document stores it (on the case's record)."""
        return Comparison.from_dict(self.as_dict(), "comparison")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {
            "case_id": self.case_id,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "alpha": self.alpha,
            "mode": "in-job" if self.reference is not None else "baseline",
            "reference": self.reference,
            "rows": [r.as_dict() for r in self.rows],
        }


# -- samples ------------------------------------------------------------------------------
def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


#: Pair metrics per repeat cycle: the per-arm metric they combine, and their definition.
_PAIR_METRICS = {
    "energy_ratio": ("energy_per_token", metrics.energy_ratio),
    "energy_saving": ("energy_per_token", lambda b, s: metrics.energy_saving(s, b)),
    "speedup": ("tbt_ms", metrics.speedup),
}


#: What the gate and the report call arms measured one after the other (one engine at a time).
BLOCKED_ORDER = "blocked order (one engine at a time)"


def drift_allowance(block_drift: float, sides: int) -> float:
    """The block drift allowed for ``sides`` (0-2) unpaired runs, added on the log scale (why:
    docs/gate.md)."""
    return (1.0 + block_drift) ** sides - 1.0 if sides > 0 else 0.0


def unpaired_reason(record: CaseRecord) -> str | None:
    """Why ``record``'s baseline repeats cannot be paired with its drafter arms by index (None: they
    can): a baseline shared from another case was measured at another time, and blocked arms ran
    one after the other, so repeat i of each shares no drift."""
    if record.baseline_from:
        return f"baseline shared from {record.baseline_from}"
    if not record.interleaved:
        return BLOCKED_ORDER
    if len(record.baseline.samples) != len(record.speculative.samples):
        return "baseline and speculative repeat counts differ"
    return None


def _baseline_level(record: CaseRecord, key: str) -> tuple[float | None, float, int]:
    """(geometric mean, variance of that mean on the log scale, its df) of the baseline's positive
    ``key`` values."""
    logs = [math.log(float(v)) for v in record.baseline.values(key) if _positive(v)]
    if not logs:
        return None, math.nan, 0
    var = float(np.var(logs, ddof=1)) / len(logs) if len(logs) > 1 else math.nan
    return math.exp(sum(logs) / len(logs)), var, len(logs) - 1


def arm_repeat_values(
    record: CaseRecord, metric: str, arm: str = "speculative"
) -> list[float | None]:
    """Per-repeat ``metric`` of a drafter arm, None where a repeat has none. A pair metric
    (ratio, saving, speedup) of a record paired by index uses the same cycle's baseline sample, so
    a drift cancels; an unpaired record (:func:`unpaired_reason`) uses the baseline's geometric
    mean, its spread carried by :func:`baseline_spread`."""
    drafter = record.arm(arm)
    if drafter is None:
        return []
    if metric not in _PAIR_METRICS:
        return [None if v is None else float(v) for v in drafter.values(metric)]
    key, combine = _PAIR_METRICS[metric]
    if unpaired_reason(record) is not None:
        level = _baseline_level(record, key)[0]
        return [
            combine(level, float(s)) if level is not None and _positive(s) else None
            for s in drafter.values(key)
        ]
    pairs = zip(record.baseline.values(key), drafter.values(key))
    return [
        combine(float(b), float(s)) if _positive(b) and _positive(s) else None for b, s in pairs
    ]


@dataclass(frozen=True)
class BaselineSpread:
    """An unpaired record's baseline uncertainty in a pair metric: the variance of log(baseline
    geometric mean), which all repeats share (more do not shrink it), its df, and |d value / d log
    baseline| at the metric's level."""

    var_log: float
    df: float
    scale: float


def baseline_spread(
    record: CaseRecord, metric: str, values: Sequence[float]
) -> BaselineSpread | None:
    """An unpaired record's pair-metric :class:`BaselineSpread` (else None); ``var_log`` nan below 2
    repeats."""
    if metric not in _PAIR_METRICS or unpaired_reason(record) is None:
        return None
    _, var, df = _baseline_level(record, _PAIR_METRICS[metric][0])
    level = sum(values) / len(values) if values else math.nan
    # q = s / b and speedup = b / s move by their own level per unit of log b; saving = 1 - s / b by
    # 1 - saving.
    scale = abs(1.0 - level) if metric == "energy_saving" else abs(level)
    return BaselineSpread(var, float(df), scale)


#: Metrics a block drift moves (energy and time); counters such as accept length it does not.
_DRIFTING = frozenset(_PAIR_METRICS) | {"energy_per_token", "tbt_ms"}
DRIFTING_METRICS = _DRIFTING


def request_accept_lengths(record: CaseRecord, arm: str = "speculative") -> list[float] | None:
    """Each request's accept length averaged over the repeats of ``arm``, or None (when:
    docs/gate.md)."""
    drafter = record.arm(arm)
    lists = [s.accept_lengths for s in drafter.samples] if drafter is not None else []
    if (
        not lists
        or any(v is None for v in lists)
        or len({len(v) for v in lists}) != 1
        or len(lists[0]) < 2
    ):
        return None
    return [float(v) for v in np.asarray(lists, dtype=float).mean(axis=0)]


def metric_samples(record: CaseRecord, metric: str) -> list[float]:
    """The values the gate compares: the speculative arm's defined per-repeat ``metric``, or the
    match fraction."""
    if metric == "equivalence":
        value = record.matched_fraction
        return [] if value is None else [float(value)]
    return [v for v in arm_repeat_values(record, metric) if v is not None]


# -- comparison ---------------------------------------------------------------------------
def gate_plan(
    alpha: float = DEFAULT_ALPHA,
    repeats: int = 3,
    cap: int = DEFAULT_CAP,
    block_drift: float = DEFAULT_BLOCK_DRIFT,
) -> SequentialPlan:
    """The gate's plan: looks at ``repeats`` (at least 2), ``repeats + 2``, ... and ``cap``, total
    level ``alpha``."""
    start = max(2, int(repeats))
    return SequentialPlan(
        start=start, step=2, cap=max(int(cap), start), alpha=alpha, block_drift=block_drift
    )


def _sequential(
    limit: FailLimit,
    base: list[float],
    cur: list[float],
    b: float,
    plan: SequentialPlan,
    paired: bool,
    requests: tuple[list[float], list[float]] | None,
    seed: int,
    resamples: int,
    spreads: Sequence[BaselineSpread] = (),
    drift: float = 0.0,
    session: SessionTerm | None = None,
) -> tuple[sequential.SequentialResult | None, str]:
    """The sequential verdict of one per-repeat metric, or (None, why it cannot be judged);
    ``session``: the between-session term of a stored comparison (``gate/session_term.py``)."""
    absolute, threshold = not limit.relative, limit.threshold
    if not absolute and min(base + cur) <= 0:
        # Values that reach zero (a drafter accepting nothing): the limit as an amount at the
        # baseline's level, so a collapse still regresses.
        if b <= 0:
            return None, (
                f"a relative limit needs a positive baseline value, got {b:.4g}; use "
                f"an absolute limit ({limit.metric}:<amount in {limit.unit}>)"
            )
        absolute, threshold = True, limit.threshold * abs(b)
    if any(not math.isfinite(s.var_log) for s in spreads):
        return (
            None,
            f"{limit.metric}: an unpaired baseline needs at least 2 repeats to carry its spread "
            "into the test",
        )
    # Amounts on the log scale for a relative limit, else in the metric's unit at its level.
    scale = 1.0 if not absolute else abs(b)
    terms = [(s.var_log * (1.0 if not absolute else s.scale**2), max(s.df, 1.0)) for s in spreads]
    if session is not None and session.sd > 0:  # df None: declared, no sampling error of its own
        terms.append((session.variance * scale**2, session.df))
    extra: dict[str, Any] = {}
    if terms:
        total = sum(t for t, _ in terms)
        dfs = sum(t * t / df for t, df in terms if df is not None)
        extra = {
            "session_sd": math.sqrt(total),
            "session_df": total * total / dfs if dfs > 0 else None,
        }
    if drift:
        scale = max((s.scale for s in spreads), default=abs(b)) if absolute else 1.0
        extra["drift"] = drift * scale if absolute else math.log1p(drift)
    try:
        if requests is not None:
            ref_req, cur_req = requests
            level = sum(ref_req) / len(ref_req)
            result = sequential.compare_per_request(
                cur_req,
                [1.0] * len(cur_req),
                ref_req,
                [1.0] * len(ref_req),
                worse=limit.worse,
                limit=threshold / level if absolute else threshold,
                paired=len(cur_req) == len(ref_req),
                n_repeats=len(cur),
                plan=plan,
                resamples=resamples,
                seed=seed,
            )
        elif paired:
            result = sequential.compare_paired(
                cur,
                base,
                limit=threshold,
                worse=limit.worse,
                plan=plan,
                absolute=absolute,
                drift=extra.get("drift", 0.0),
            )
        else:
            if len(base) < 2:
                return None, (
                    f"the stored baseline has {len(base)} repeat of {limit.metric}; the "
                    "sequential rule needs at least 2 (save it with --specenergy-repeats=3 or "
                    "more)"
                )
            result = sequential.compare_stored(
                cur, base, limit=threshold, worse=limit.worse, plan=plan, absolute=absolute, **extra
            )
    except ValueError as exc:
        return None, f"{limit.metric} cannot be judged: {exc}"
    return result, ""


def compare_metric(
    limit: FailLimit,
    base: Sequence[float],
    cur: Sequence[float],
    alpha: float = DEFAULT_ALPHA,
    *,
    plan: SequentialPlan | None = None,
    paired: bool = False,
    requests: tuple[list[float], list[float]] | None = None,
    seed: int = 0,
    resamples: int = 5000,
    spreads: Sequence[BaselineSpread] = (),
    drift: float = 0.0,
    unpaired: str = "",
    session: SessionTerm | None = None,
) -> MetricRow:
    """Compare one metric's reference and current samples under ``limit``: per-repeat metrics by the
    sequential rule under ``plan`` (default :func:`gate_plan` at ``alpha``): Welch's t against a
    stored run, a paired t when ``paired`` (sample i of both sides from one repeat cycle), or a
    bootstrap over ``requests`` (reference, current per-request values). The exact-match fraction
    is compared as a fact. Arms not measured alongside their baseline (named in ``unpaired``)
    carry the baselines' ``spreads`` and allow a block drift of ``drift`` either way; the row's
    method says so."""
    info = GATE_METRICS[limit.metric]
    base, cur = list(base), list(cur)
    unjudged = MetricRow(
        limit.metric,
        limit.stat,
        info.unit,
        None,
        None,
        None,
        None,
        limit,
        None,
        "none",
        len(base),
        len(cur),
        None,
        Verdict.INCOMPARABLE,
    )
    if not base or not cur:
        side = "baseline" if not base else "current"
        return dataclasses.replace(unjudged, note=f"the {side} record has no {limit.metric} values")
    b, c = stats.summarize(base).stat(limit.stat), stats.summarize(cur).stat(limit.stat)
    measured = dataclasses.replace(
        unjudged,
        baseline=b,
        current=c,
        change_abs=c - b,
        change_rel=None if b == 0 else c / b - 1.0,
    )
    if not info.per_repeat:
        # The exact-match fraction of greedy outputs: one number, the fact itself.
        worse = limit.worse_amount(b, c)
        verdict, note = Verdict.PASSED, ""
        if worse > limit.threshold:
            verdict = Verdict.REGRESSED
        elif -worse > limit.threshold:
            verdict, note = (
                Verdict.IMPROVED,
                "better beyond the limit: consider updating the baseline",
            )
        return dataclasses.replace(measured, method="deterministic", verdict=verdict, note=note)
    result, why = _sequential(
        limit,
        base,
        cur,
        b,
        plan or gate_plan(alpha),
        paired,
        requests,
        seed,
        resamples,
        spreads,
        drift if requests is None else 0.0,
        session if requests is None else None,
    )
    if result is None:
        return dataclasses.replace(measured, note=why)
    verdict = result.verdict
    notes = [result.note] if result.note else []
    if session is not None and requests is None:
        notes.append(session.describe())
    if verdict is Verdict.INCONCLUSIVE and result.more_repeats:
        notes.insert(
            0,
            f"needs {result.more_repeats} more repeats (look {result.look}/"
            f"{result.looks}); more repeats would decide",
        )
    elif verdict is Verdict.IMPROVED:
        notes.insert(0, "better beyond the limit: consider updating the baseline")
    how = (
        f"{result.method}, unpaired: {unpaired}" if unpaired and requests is None else result.method
    )
    method = f"sequential {how}, look {max(result.look, 1)}/{result.looks}"
    low, high = result.interval
    # Exact (no spread): no p-value, and an interval only where a drift allowance widens it.
    interval = None if result.exact and math.isclose(low, high, rel_tol=1e-12) else (low, high)
    return dataclasses.replace(
        measured,
        p_value=None if result.exact else result.p_value,
        method=method,
        interval=interval,
        exact=result.exact,
        verdict=verdict,
        note="; ".join(notes),
        p_sequential=result.p_sequential,
        more_repeats=result.more_repeats,
        estimate=result.estimate,
    )


def _accept_requests(
    limit: FailLimit, reference: CaseRecord, reference_arm: str, current: CaseRecord
) -> tuple[list[float], list[float]] | None:
    """Per-request accept lengths of both sides, when both carry them (a bootstrap over requests)."""
    if limit.metric != "accept_length":
        return None
    ref_req, cur_req = (
        request_accept_lengths(reference, reference_arm),
        request_accept_lengths(current),
    )
    return (ref_req, cur_req) if ref_req and cur_req else None


#: Metrics of drafting itself: the A/A control (``Drafter("none")``, the twin's own config in a
#: second engine) drafts nothing, so their limits do not apply to it.
DRAFTING_METRICS = frozenset({"accept_length", "acceptance_rate"})


def applicable(limits: Sequence[FailLimit], record: CaseRecord) -> list[FailLimit]:
    """The limits that apply to ``record``: all of them, but an A/A control's drafting metrics."""
    if record.drafter_name != "none":
        return list(limits)
    return [limit for limit in limits if limit.metric not in DRAFTING_METRICS]


def compare_case(
    baseline_record: CaseRecord | None,
    current_record: CaseRecord,
    limits: Sequence[FailLimit],
    alpha: float = DEFAULT_ALPHA,
    *,
    baseline_info: dict[str, Any] | None = None,
    current_info: dict[str, Any] | None = None,
    plan: SequentialPlan | None = None,
    seed: int = 0,
    resamples: int = 5000,
    history: Sequence[CaseRecord] | None = None,
) -> CaseComparison:
    """A case's record against its baseline; ``*_info`` add run facts (``machine_key``) to
    :func:`run_info`'s. ``history``: the test's records in the stored sessions of its machine key
    (the compare run's included), for the between-session term (``gate/session_term.py``); None:
    the baseline record alone."""
    case_id = current_record.key
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if baseline_record is None:
        return CaseComparison(case_id, Verdict.NO_BASELINE, (), ("no baseline record",), alpha)
    reasons = comparable(
        {**run_info(baseline_record), **(baseline_info or {})},
        {**run_info(current_record), **(current_info or {})},
    )
    if reasons:
        return CaseComparison(case_id, Verdict.INCOMPARABLE, (), tuple(reasons), alpha)
    plan = plan or gate_plan(alpha)
    sessions = list(history) if history is not None else [baseline_record]
    rows = [
        _with_ties(
            _stored_row(
                limit, baseline_record, current_record, alpha, plan, seed, resamples, sessions
            ),
            baseline_record.ties,
            current_record.ties,
        )
        for limit in applicable(limits, current_record)
    ]
    return CaseComparison(case_id, worst(r.verdict for r in rows), tuple(rows), (), alpha)


def _stored_row(
    limit: FailLimit,
    baseline_record: CaseRecord,
    current_record: CaseRecord,
    alpha: float,
    plan: SequentialPlan,
    seed: int,
    resamples: int,
    sessions: Sequence[CaseRecord] = (),
) -> MetricRow:
    """One metric against the stored record; an unpaired pair metric carries the baseline spread and
    block drift; a per-repeat metric the between-session term of ``sessions`` (the test's stored
    records), and an absolute one with too few of them is not judged."""
    base, cur = (
        metric_samples(baseline_record, limit.metric),
        metric_samples(current_record, limit.metric),
    )
    spreads = [
        s
        for s in (
            baseline_spread(baseline_record, limit.metric, base),
            baseline_spread(current_record, limit.metric, cur),
        )
        if s is not None
    ]
    why = [
        f"{side} {r}"
        for side, r in (
            ("current", unpaired_reason(current_record)),
            ("stored", unpaired_reason(baseline_record)),
        )
        if r
    ]
    unpaired = "; ".join(why) if limit.metric in _PAIR_METRICS else ""
    # Each run not measured alongside its baseline brings its own block drift: both allowed for.
    drift = drift_allowance(plan.block_drift, len(why)) if unpaired else 0.0
    term = None
    if GATE_METRICS[limit.metric].per_repeat:
        measured = not str(current_record.source).startswith("modeled")
        samples = [metric_samples(r, limit.metric) for r in sessions]
        samples = [v for v in samples if len(v) >= 2 and min(v) > 0]
        refused = session_term.refusal(limit.metric, len(samples), measured)
        if refused is not None:
            row = compare_metric(limit, base, cur, alpha, plan=plan)
            return dataclasses.replace(
                row, verdict=Verdict.INCOMPARABLE, note=refused, p_value=None, interval=None
            )
        term = session_term.session_term(limit.metric, samples, measured)
    return compare_metric(
        limit,
        base,
        cur,
        alpha,
        plan=plan,
        requests=_accept_requests(limit, baseline_record, "speculative", current_record),
        seed=seed,
        resamples=resamples,
        spreads=spreads,
        drift=drift,
        unpaired=unpaired,
        session=term,
    )


def _with_ties(
    row: MetricRow, baseline_ties: int, current_ties: int, baseline_side: str = "baseline"
) -> MetricRow:
    """An ``equivalence`` row with the numerical ties it counted as matches beside it."""
    if row.metric != "equivalence" or row.method != "deterministic":
        return row
    note = row.note
    if baseline_ties or current_ties:
        note = "; ".join(
            filter(
                None,
                (
                    note,
                    f"numerical ties counted as matches: {baseline_side} "
                    f"{baseline_ties}, current {current_ties}",
                ),
            )
        )
    return dataclasses.replace(row, ties=(baseline_ties, current_ties), note=note)


def compare_in_job(
    record: CaseRecord,
    limits: Sequence[FailLimit],
    alpha: float = DEFAULT_ALPHA,
    *,
    plan: SequentialPlan | None = None,
    seed: int = 0,
    resamples: int = 5000,
) -> CaseComparison:
    """In-job A/B: the candidate (speculative arm) against the reference drafter's arm of the same
    repeat cycles (``record.reference``) by the paired sequential rule (the shared baseline
    cancels); no stored baseline needed. ``equivalence`` compares the match fraction with the
    reference's when recorded, else with 1.0 (a lossless reference on a deterministic engine)."""
    case_id = record.key
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    label = record.reference_label
    if record.reference is None:
        return CaseComparison(
            case_id,
            Verdict.NO_BASELINE,
            (),
            ("no reference arm in the record",),
            alpha,
            reference=label,
        )
    if record.reference.source != record.speculative.source:
        return CaseComparison(
            case_id,
            Verdict.INCOMPARABLE,
            (),
            (
                f"the reference arm's energy source {record.reference.source!r} differs from the "
                f"candidate's {record.speculative.source!r}",
            ),
            alpha,
            reference=label,
        )
    plan = plan or gate_plan(alpha)
    rows = []
    for limit in applicable(limits, record):
        if limit.metric == "equivalence":
            ref_value = record.reference_matched_fraction
            row = compare_metric(
                limit,
                [1.0 if ref_value is None else float(ref_value)],
                metric_samples(record, "equivalence"),
                alpha,
                plan=plan,
            )
            if ref_value is None:
                row = dataclasses.replace(
                    row,
                    note="; ".join(
                        filter(
                            None,
                            (
                                row.note,
                                "reference equivalence not in the record: compared with 1.0",
                            ),
                        )
                    ),
                )
            rows.append(_with_ties(row, record.reference_ties, record.ties, "reference"))
            continue
        # (reference, candidate) per-repeat values from the same repeat cycles.
        pairs = [
            (r, c)
            for r, c in zip(
                arm_repeat_values(record, limit.metric, "reference"),
                arm_repeat_values(record, limit.metric),
            )
            if r is not None and c is not None
        ]
        # Blocked arms: the candidate's and the reference's repeats ran in separate blocks.
        blocked = not record.interleaved and limit.metric in _DRIFTING
        rows.append(
            compare_metric(
                limit,
                [r for r, _ in pairs],
                [c for _, c in pairs],
                alpha,
                plan=plan,
                paired=True,
                requests=_accept_requests(limit, record, "reference", record),
                seed=seed,
                resamples=resamples,
                drift=plan.block_drift if blocked else 0.0,
                unpaired=f"{BLOCKED_ORDER}: candidate and reference in separate blocks"
                if blocked
                else "",
            )
        )
    return CaseComparison(
        case_id, worst(r.verdict for r in rows), tuple(rows), (), alpha, reference=label
    )


def compare_documents(
    baseline_document: RunDocument,
    current_document: RunDocument,
    limits: Sequence[FailLimit],
    alpha: float = DEFAULT_ALPHA,
    **kwargs: Any,
) -> list[CaseComparison]:
    """Compare every result of a run with the baseline run's of the same key (or NO_BASELINE)."""
    baseline = {r.key: r for r in baseline_document.results}
    b_info, c_info = document_run_info(baseline_document), document_run_info(current_document)
    return [
        compare_case(
            baseline.get(r.key),
            r,
            limits,
            alpha,
            baseline_info=b_info,
            current_info=c_info,
            **kwargs,
        )
        for r in current_document.results
    ]


def repeats_needed(comparison: CaseComparison) -> int:
    """Repeats of each arm the next look needs: INCONCLUSIVE per-repeat rows' largest
    ``more_repeats`` (else 0)."""
    if comparison.verdict is not Verdict.INCONCLUSIVE:
        return 0
    return max(
        (
            r.more_repeats
            for r in comparison.rows
            if r.verdict is Verdict.INCONCLUSIVE and GATE_METRICS[r.metric].per_repeat
        ),
        default=0,
    )


@dataclass(frozen=True)
class Resolution:
    """What to do with a case INCONCLUSIVE at the cap (``fail``, ``warn``, ``xfail``), and the
    message."""

    action: str
    message: str


def resolve_inconclusive(
    policy: str, comparison: CaseComparison | None = None, baseline_path: str | Path | None = None
) -> Resolution:
    """Apply the inconclusive policy (``fail``, ``warn`` or ``xfail``)."""
    if policy not in INCONCLUSIVE_POLICIES:
        raise ValueError(
            f"unknown inconclusive policy {policy!r}; expected one of "
            f"{', '.join(INCONCLUSIVE_POLICIES)}"
        )
    detail = comparison.failure_message(baseline_path) if comparison else "inconclusive"
    return Resolution(policy, f"{detail}\n(inconclusive at the repeat cap; policy: {policy})")


__all__ = [
    "CaseComparison",
    "DEFAULT_ALPHA",
    "DEFAULT_CAP",
    "INCONCLUSIVE_POLICIES",
    "MetricRow",
    "Resolution",
    "Verdict",
    "arm_repeat_values",
    "comparable",
    "compare_case",
    "compare_documents",
    "compare_in_job",
    "compare_metric",
    "document_run_info",
    "gate_plan",
    "metric_samples",
    "repeats_needed",
    "baseline_spread",
    "BaselineSpread",
    "unpaired_reason",
    "DRIFTING_METRICS",
    "BLOCKED_ORDER",
    "drift_allowance",
    "request_accept_lengths",
    "resolve_inconclusive",
    "run_info",
]
