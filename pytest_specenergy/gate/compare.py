"""The regression gate: compare one case's record against its baseline and give a verdict.

A metric REGRESSES only when both hold (asv's rule, not pytest-benchmark's bare threshold):

1. its chosen statistic moved beyond the fail limit in the metric's worse direction, and
2. the move is significant: a two-sided Mann-Whitney U test at ``p < alpha`` over the
   per-repeat samples, used when both sides have at least 4 samples *and* the sizes can
   reach ``alpha`` at all (at 0.01 that takes 5 vs 5; 4 vs 4 can at best give p = 0.029);
   with fewer samples (at least 3 a side) a seeded bootstrap interval of the median ratio
   (or difference, for absolute limits) at ``1 - alpha`` must lie entirely beyond the limit
   *and* Welch's t test (on log values for ratios) must give ``p < alpha``. For 3 vs 3 the
   interval alone only says every current repeat is beyond every baseline repeat by more
   than the limit - which pure noise achieves 1 time in 20 when the limit is 0 - so the t
   test keeps the false-positive rate near alpha, while a 20% shift under 1% noise still
   regresses at once. Below 3 samples a side nothing is significant.

Beyond the limit but not significant is INCONCLUSIVE: the caller adds repeats up to a cap
(:func:`needs_more_repeats`), then applies its policy (:func:`resolve_inconclusive`).
Better beyond the limit and significant is IMPROVED (the baseline has gone stale).

Pooled-counter metrics (accept_length, acceptance_rate) and the exact-match fraction have no
per-repeat variance - greedy decoding is deterministic - so they are compared directly.

Runs that differ in machine key, meter, engine name or version, CUDA-graph setting or the
scenario (model, batch, corpus digest, generation) are INCOMPARABLE with the reasons listed:
never a silent comparison of numbers that cannot be compared.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Mapping
from typing import Sequence

import numpy as np

from pytest_specenergy.gate import stats
from pytest_specenergy.gate.limits import DEFAULT_ALPHA
from pytest_specenergy.gate.limits import GATE_METRICS
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.machine import comparable
from pytest_specenergy.gate.machine import document_run_info
from pytest_specenergy.gate.machine import run_info

#: Fewest samples a side for the U test (when the sizes can also reach alpha).
MIN_MANN_WHITNEY = 4
#: Fewest samples a side for any significance (the bootstrap fallback).
MIN_SIGNIFICANCE = 3
INCONCLUSIVE_POLICIES = ("fail", "warn", "xfail")


class Verdict(str, enum.Enum):
    """Outcome of comparing a case (or one metric) with its baseline."""

    PASSED = "passed"
    REGRESSED = "regressed"
    IMPROVED = "improved"
    INCONCLUSIVE = "inconclusive"
    INCOMPARABLE = "incomparable"
    NO_BASELINE = "no baseline"

    @property
    def mark(self) -> str:
        """asv-style change mark: ``+`` worse, ``-`` better, ``~`` inconclusive, ``x``
        incomparable, ``?`` no baseline, blank unchanged."""
        return _MARKS[self]


_MARKS = {Verdict.PASSED: " ", Verdict.REGRESSED: "+", Verdict.IMPROVED: "-",
          Verdict.INCONCLUSIVE: "~", Verdict.INCOMPARABLE: "x", Verdict.NO_BASELINE: "?"}
# Worst first: the case verdict is the worst of its metric verdicts.
_SEVERITY = (Verdict.INCOMPARABLE, Verdict.REGRESSED, Verdict.INCONCLUSIVE, Verdict.IMPROVED,
             Verdict.PASSED)


@dataclass(frozen=True)
class MetricRow:
    """One metric of one case against its baseline.

    ``change_rel`` is ``current / baseline - 1`` (None for a zero baseline); ``method`` says
    what decided significance: ``mann-whitney``, ``bootstrap+welch``, ``too few repeats``
    or ``deterministic``. ``p_value`` belongs to that test (Welch's for ``bootstrap+welch``,
    the U test's otherwise; None when deterministic); ``interval`` is the bootstrap's.
    """

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

    def change_text(self) -> str:
        """The change in words: relative and absolute (points for fraction-point metrics)."""
        if self.change_abs is None:
            return "n/a"
        absolute = f"{self.change_abs:+.4g} {self.unit}"
        if GATE_METRICS[self.metric].percent_is_points:
            absolute = f"{self.change_abs * 100:+.3g} pts"
        if self.change_rel is None:
            return absolute
        return f"{self.change_rel:+.2%} ({absolute})"

    def describe(self) -> str:
        """One line with every number: values, change, limit, p-value, method, verdict."""
        p = "n/a" if self.p_value is None else f"{self.p_value:.3g}"
        if self.method == "deterministic":
            how = "deterministic: pooled counters"
        else:
            how = f"{self.method}, {self.n_baseline} vs {self.n_current} repeats"
        line = (f"{self.metric} ({self.stat}): baseline {_num(self.baseline)} {self.unit} -> "
                f"current {_num(self.current)} {self.unit}, change {self.change_text()}, "
                f"limit {self.limit.describe()} [{self.limit.expr}], p={p} ({how}): "
                f"{self.verdict.value.upper()}")
        return f"{line} - {self.note}" if self.note else line

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {"metric": self.metric, "stat": self.stat, "unit": self.unit,
                "baseline": self.baseline, "current": self.current,
                "change_abs": self.change_abs, "change_rel": self.change_rel,
                "limit": self.limit.expr, "p_value": self.p_value, "method": self.method,
                "n_baseline": self.n_baseline, "n_current": self.n_current,
                "interval": list(self.interval) if self.interval else None,
                "verdict": self.verdict.value, "note": self.note}


@dataclass(frozen=True)
class CaseComparison:
    """A case's verdict against its baseline, with a row per checked metric."""

    case_id: str
    verdict: Verdict
    rows: tuple[MetricRow, ...]
    reasons: tuple[str, ...] = ()
    alpha: float = DEFAULT_ALPHA

    def rows_with(self, verdict: Verdict) -> list[MetricRow]:
        """The metric rows that got ``verdict``."""
        return [r for r in self.rows if r.verdict is verdict]

    def failure_message(self, baseline_path: str | Path | None) -> str:
        """What a failing test shows: per metric the baseline and current values, change,
        limit, p-value and verdict, plus the baseline file."""
        source = f"baseline {baseline_path}" if baseline_path else "its baseline"
        if self.verdict is Verdict.NO_BASELINE:
            return f"specenergy: no baseline for {self.case_id} ({source})"
        if self.verdict is Verdict.INCOMPARABLE and self.reasons:
            return (f"specenergy: {self.case_id} cannot be compared with {source}:\n"
                    + "\n".join(f"  - {r}" for r in self.reasons))
        # The rows that decided the verdict come first.
        ordered = sorted(self.rows, key=lambda r: _SEVERITY.index(r.verdict))
        return (f"specenergy: {self.case_id} {self.verdict.value} against {source}:\n"
                + "\n".join(f"  {r.describe()}" for r in ordered))

    def summary(self) -> str:
        """One short line: the verdict and the deciding metrics."""
        deciding = [r for r in self.rows if r.verdict is self.verdict and r.verdict
                    is not Verdict.PASSED]
        detail = ", ".join(f"{r.metric} {r.change_text()}" for r in deciding)
        return f"{self.case_id}: {self.verdict.value}" + (f" ({detail})" if detail else "")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {"case_id": self.case_id, "verdict": self.verdict.value,
                "reasons": list(self.reasons), "alpha": self.alpha,
                "rows": [r.as_dict() for r in self.rows]}


# -- samples ------------------------------------------------------------------------------
def _arm_samples(record: Mapping[str, Any], arm: str) -> list[Mapping[str, Any]]:
    samples = (record.get(arm) or {}).get("samples") or []
    return [s for s in samples if isinstance(s, Mapping)]


def _paired(record: Mapping[str, Any], key: str, combine: Any) -> list[float]:
    # Repeat i of each arm ran back to back, so pairing by index cancels slow drift.
    values = []
    for base, spec in zip(_arm_samples(record, "baseline"), _arm_samples(record, "speculative")):
        b, s = base.get(key), spec.get(key)
        if b is not None and s is not None and b > 0 and s > 0:
            values.append(combine(b, s))
    return values


def metric_samples(record: Mapping[str, Any], metric: str) -> list[float]:
    """The values the gate compares for ``metric``: per-repeat samples, or one pooled value."""
    if metric in ("energy_per_token", "tbt_ms"):
        return [float(s[metric]) for s in _arm_samples(record, "speculative")
                if s.get(metric) is not None]
    if metric == "energy_saving":
        return _paired(record, "energy_per_token", lambda b, s: 1.0 - s / b)
    if metric == "speedup":
        return _paired(record, "tbt_ms", lambda b, s: b / s)
    if metric == "equivalence":
        value = (record.get("equivalence") or {}).get("exact_fraction")
    else:
        value = record.get(metric)
    return [] if value is None else [float(value)]


# -- comparison ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Test:
    worse: bool  # significantly worse
    better: bool  # significantly better
    method: str
    p_value: float | None
    interval: tuple[float, float] | None = None
    note: str = ""


def _significance(limit: FailLimit, base: list[float], cur: list[float], alpha: float,
                  seed: int, resamples: int) -> _Test:
    n_b, n_c = len(base), len(cur)
    if min(n_b, n_c) >= MIN_MANN_WHITNEY and stats.min_attainable_p(n_b, n_c) < alpha:
        p = stats.mann_whitney_u(cur, base).p_value
        return _Test(p < alpha, p < alpha, "mann-whitney", p)
    if min(n_b, n_c) < MIN_SIGNIFICANCE:
        return _Test(False, False, "too few repeats", stats.mann_whitney_u(cur, base).p_value,
                     note=f"needs at least {MIN_SIGNIFICANCE} repeats a side to judge "
                          "significance; more repeats would decide")
    kind = "ratio" if limit.relative else "difference"
    if kind == "ratio" and min(base + cur) <= 0:
        return _Test(False, False, "too few repeats", stats.mann_whitney_u(cur, base).p_value,
                     note="values not positive: no ratio interval")
    ci = stats.bootstrap_ci(base, cur, kind=kind, confidence=1.0 - alpha,
                            resamples=resamples, seed=seed)
    # Both ends of the interval as a worse-direction move in the limit's terms: a ratio is a
    # relative move from 1, a difference an absolute move from 0.
    origin = 1.0 if kind == "ratio" else 0.0
    ends = [limit.worse_amount(origin, end) for end in (ci.low, ci.high)]
    # With 3 values a side the interval only says the ranges separate, which noise alone
    # does 1 time in 20; Welch's t (on logs for ratios) must agree at alpha too.
    if kind == "ratio":
        welch = stats.welch_t(np.log(cur), np.log(base))
    else:
        welch = stats.welch_t(cur, base)
    worse_sign = welch.t > 0 if limit.worse == "up" else welch.t < 0
    significant = welch.p_value < alpha
    return _Test(min(ends) > limit.threshold and significant and worse_sign,
                 max(ends) < -limit.threshold and significant and not worse_sign,
                 "bootstrap+welch", welch.p_value, (ci.low, ci.high))


def compare_metric(limit: FailLimit, base: Sequence[float], cur: Sequence[float],
                   alpha: float = DEFAULT_ALPHA, *, seed: int = 0,
                   resamples: int = 5000) -> MetricRow:
    """Compare one metric's baseline and current samples under ``limit``."""
    info = GATE_METRICS[limit.metric]
    base, cur = list(base), list(cur)
    n_b, n_c = len(base), len(cur)
    if not base or not cur:
        side = "baseline" if not base else "current"
        return MetricRow(limit.metric, limit.stat, info.unit, None, None, None, None, limit,
                         None, "none", n_b, n_c, None, Verdict.INCOMPARABLE,
                         f"the {side} record has no {limit.metric} values")
    b = stats.summarize(base).stat(limit.stat)
    c = stats.summarize(cur).stat(limit.stat)
    change_rel = None if b == 0 else c / b - 1.0
    worse = limit.worse_amount(b, c)
    beyond_worse, beyond_better = worse > limit.threshold, -worse > limit.threshold
    if info.per_repeat:
        test = _significance(limit, base, cur, alpha, seed, resamples)
    else:
        # Pooled counters of a greedy run: no per-repeat variance, so the value is the fact.
        test = _Test(True, True, "deterministic", None)
    note = test.note
    if beyond_worse:
        verdict = Verdict.REGRESSED if test.worse else Verdict.INCONCLUSIVE
        if not test.worse and not note:
            note = "beyond the limit but not significant; more repeats would decide"
    elif beyond_better and test.better:
        verdict = Verdict.IMPROVED
        note = "better beyond the limit: consider updating the baseline"
    else:
        verdict, note = Verdict.PASSED, ""
    return MetricRow(limit.metric, limit.stat, info.unit, b, c, c - b, change_rel, limit,
                     test.p_value, test.method, n_b, n_c, test.interval, verdict, note)


def compare_case(baseline_record: Mapping[str, Any] | None, current_record: Mapping[str, Any],
                 limits: Sequence[FailLimit], alpha: float = DEFAULT_ALPHA, *,
                 baseline_info: Mapping[str, Any] | None = None,
                 current_info: Mapping[str, Any] | None = None,
                 seed: int = 0, resamples: int = 5000) -> CaseComparison:
    """Compare a case's record (``PairResult.as_dict()``) with its baseline record.

    ``baseline_info`` / ``current_info`` add run-level facts (``machine_key``) to what the
    records themselves say (meter, engine, CUDA graphs, scenario); see :func:`run_info`.
    """
    case_id = str(current_record.get("nodeid") or current_record.get("case_id") or "?")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if baseline_record is None:
        return CaseComparison(case_id, Verdict.NO_BASELINE, (), ("no baseline record",), alpha)
    reasons = comparable({**run_info(baseline_record), **(baseline_info or {})},
                         {**run_info(current_record), **(current_info or {})})
    if reasons:
        return CaseComparison(case_id, Verdict.INCOMPARABLE, (), tuple(reasons), alpha)
    rows = tuple(compare_metric(limit, metric_samples(baseline_record, limit.metric),
                                metric_samples(current_record, limit.metric), alpha,
                                seed=seed, resamples=resamples) for limit in limits)
    verdict = next((v for v in _SEVERITY if any(r.verdict is v for r in rows)), Verdict.PASSED)
    return CaseComparison(case_id, verdict, rows, (), alpha)


def compare_documents(baseline_document: Mapping[str, Any], current_document: Mapping[str, Any],
                      limits: Sequence[FailLimit], alpha: float = DEFAULT_ALPHA,
                      **kwargs: Any) -> list[CaseComparison]:
    """Compare every result of a run with the matching result (by nodeid, else case id) of a
    baseline run; current results without a match get NO_BASELINE."""
    def key(record: Mapping[str, Any]) -> str:
        return str(record.get("nodeid") or record.get("case_id"))

    baseline = {key(r): r for r in baseline_document.get("results") or []}
    b_info, c_info = document_run_info(baseline_document), document_run_info(current_document)
    return [compare_case(baseline.get(key(r)), r, limits, alpha, baseline_info=b_info,
                         current_info=c_info, **kwargs)
            for r in current_document.get("results") or []]


def needs_more_repeats(comparison: CaseComparison) -> bool:
    """True when more repeats could settle the case: a per-repeat metric is INCONCLUSIVE."""
    return comparison.verdict is Verdict.INCONCLUSIVE and any(
        GATE_METRICS[r.metric].per_repeat for r in comparison.rows_with(Verdict.INCONCLUSIVE))


@dataclass(frozen=True)
class Resolution:
    """What to do with a case still INCONCLUSIVE at the repeat cap: ``fail`` the test,
    ``warn`` and pass, or ``xfail`` it; ``message`` is ready to show."""

    action: str
    message: str


def resolve_inconclusive(policy: str, comparison: CaseComparison | None = None,
                         baseline_path: str | Path | None = None) -> Resolution:
    """Apply the inconclusive policy (``fail``, ``warn`` or ``xfail``)."""
    if policy not in INCONCLUSIVE_POLICIES:
        raise ValueError(f"unknown inconclusive policy {policy!r}; expected one of "
                         f"{', '.join(INCONCLUSIVE_POLICIES)}")
    detail = comparison.failure_message(baseline_path) if comparison else "inconclusive"
    return Resolution(policy, f"{detail}\n(inconclusive at the repeat cap; policy: {policy})")


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


__all__ = ["CaseComparison", "DEFAULT_ALPHA", "INCONCLUSIVE_POLICIES", "MetricRow", "Resolution",
           "Verdict", "comparable", "compare_case", "compare_documents", "compare_metric",
           "document_run_info", "metric_samples", "needs_more_repeats", "resolve_inconclusive",
           "run_info"]
