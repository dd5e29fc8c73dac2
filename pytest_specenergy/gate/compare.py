"""The regression gate: compare one case's record against its baseline and give a verdict.

Per-repeat metrics (``energy_ratio`` by default, ``energy_per_token``, ``tbt_ms``,
``speedup``, ``energy_saving``, ``accept_length``, ``acceptance_rate``) follow one rule, the
sequential limit test of :mod:`pytest_specenergy.gate.sequential`: the null hypothesis is
"the change is within the limit", so

* **REGRESSED** iff the change's lower confidence bound lies beyond the limit (P(REGRESSED)
  <= alpha for any true change at or inside it, at every repeat count);
* **PASSED** (unchanged) iff its upper bound lies inside the limit, **IMPROVED** iff beyond
  the limit on the better side;
* **INCONCLUSIVE** otherwise: the gate asks for repeats up to the plan's next look
  (:func:`repeats_needed`), and at the cap the ``--specenergy-inconclusive`` policy applies
  (:func:`resolve_inconclusive`). Never decided by the point estimate.

Against a stored run the current per-repeat values meet the stored ones in Welch's t (on
logs for relative limits, on values for absolute ones); in-job A/B (:func:`compare_in_job`)
pairs sample i of candidate and reference (one repeat cycle) in a paired t. The energy
default is the within-session ratio speculative/baseline per repeat: the arms run
interleaved, so a session offset moves both and cancels. Accept length uses per-request
accept lengths when the samples carry them (a bootstrap over requests), per-repeat values
otherwise. Looks, levels and the cap: :func:`gate_plan`.

The exact-match fraction (``equivalence``) is one number per run and compared as a fact.

Runs that differ in machine key, meter, engine name or version, CUDA-graph setting or the
scenario (model, batch, corpus digest, generation) are INCOMPARABLE with the reasons listed:
never a silent comparison of numbers that cannot be compared.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Mapping
from typing import Sequence

import numpy as np

import pytest_specenergy.measure.metrics as metrics
from pytest_specenergy.gate import sequential
from pytest_specenergy.gate import stats
from pytest_specenergy.gate.limits import DEFAULT_ALPHA
from pytest_specenergy.gate.limits import GATE_METRICS
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.machine import comparable
from pytest_specenergy.gate.machine import document_run_info
from pytest_specenergy.gate.machine import run_info
from pytest_specenergy.gate.sequential import SequentialPlan

#: Repeat cap of the sequential plan unless ``--specenergy-max-repeats`` says otherwise.
DEFAULT_CAP = 11
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

    ``change_rel`` is ``current / baseline - 1`` of the limit's statistic (None for a zero
    baseline); ``method`` says what decided: ``sequential <test>, look k/K`` or
    ``deterministic`` (``none`` when nothing could be judged). ``p_value`` is the one-sided
    p of "within the limit" at the deciding look, ``p_sequential`` the repeated p-value over
    the looks (the one FDR uses); ``interval`` and ``estimate`` are on the change scale
    (relative change for a relative limit, difference for an absolute one);
    ``more_repeats`` is what an INCONCLUSIVE row asks for before the cap.
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
    p_sequential: float | None = None
    more_repeats: int = 0
    estimate: float | None = None

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
            how = "deterministic: one exact-match fraction"
        else:
            how = f"{self.method}, {self.n_baseline} vs {self.n_current} repeats"
            if self.interval is not None:
                low, high = self.interval
                relative_scale = "log ratios" in self.method or "bootstrap" in self.method
                span = f"{low:+.2%}, {high:+.2%}" if relative_scale else f"{low:+.4g}, {high:+.4g}"
                how += f", change interval [{span}]"
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
                "verdict": self.verdict.value, "note": self.note,
                "p_sequential": self.p_sequential, "more_repeats": self.more_repeats,
                "estimate": self.estimate}


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

    def rows_with(self, verdict: Verdict) -> list[MetricRow]:
        """The metric rows that got ``verdict``."""
        return [r for r in self.rows if r.verdict is verdict]

    def failure_message(self, baseline_path: str | Path | None) -> str:
        """What a failing test shows: per metric the baseline and current values, change,
        limit, p-value and verdict, plus the baseline file."""
        source = f"baseline {baseline_path}" if baseline_path else "its baseline"
        if self.reference is not None:
            source = f"reference drafter {self.reference} (in-job A/B)"
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
                "mode": "in-job" if self.reference is not None else "baseline",
                "reference": self.reference,
                "rows": [r.as_dict() for r in self.rows]}


# -- samples ------------------------------------------------------------------------------
def _arm_samples(record: Mapping[str, Any], arm: str) -> list[Mapping[str, Any]]:
    samples = (record.get(arm) or {}).get("samples") or []
    return [s for s in samples if isinstance(s, Mapping)]


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _sample_value(sample: Mapping[str, Any], metric: str) -> float | None:
    """One repeat's value of a per-arm metric (None when that repeat cannot give it)."""
    if metric == "accept_length":
        value = metrics.accept_length(sample.get("correct_drafts"), sample.get("verify_steps"))
    elif metric == "acceptance_rate":
        value = metrics.acceptance_rate(sample.get("correct_drafts"), sample.get("proposed_drafts"))
    else:
        value = sample.get(metric)
    return None if value is None else float(value)


def arm_repeat_values(record: Mapping[str, Any], metric: str,
                      arm: str = "speculative") -> list[float | None]:
    """Per-repeat values of ``metric`` for a drafter arm (``speculative`` or ``reference``),
    one entry per repeat cycle, None where a repeat cannot give it.

    Pair metrics use the baseline sample of the same cycle: the arms run interleaved ABAB,
    so repeat i of each arm pairs up and a session offset or slow drift cancels.
    """
    drafter = _arm_samples(record, arm)
    if metric in _PAIR_METRICS:
        key, combine = _PAIR_METRICS[metric]
        values: list[float | None] = []
        for base, spec in zip(_arm_samples(record, "baseline"), drafter):
            b, s = base.get(key), spec.get(key)
            values.append(combine(float(b), float(s)) if _positive(b) and _positive(s) else None)
        return values
    return [_sample_value(s, metric) for s in drafter]


_PAIR_METRICS = {
    "energy_ratio": ("energy_per_token", lambda b, s: s / b),
    "energy_saving": ("energy_per_token", lambda b, s: 1.0 - s / b),
    "speedup": ("tbt_ms", lambda b, s: b / s),
}


#: Sample keys that hold per-request accept lengths (``RepeatSample.accept_lengths``; the
#: longer name is accepted too).
REQUEST_ACCEPT_KEYS = ("accept_lengths", "request_accept_lengths")


def request_accept_lengths(record: Mapping[str, Any], arm: str = "speculative") -> list[float] | None:
    """Each request's accept length averaged over the repeats, when every sample of ``arm``
    carries per-request accept lengths (:data:`REQUEST_ACCEPT_KEYS`) for the same number
    (>= 2) of requests; else None (the gate then judges accept length per repeat)."""
    def lengths(sample: Mapping[str, Any]) -> Any:
        return next((sample[k] for k in REQUEST_ACCEPT_KEYS if sample.get(k) is not None), None)

    lists = [lengths(s) for s in _arm_samples(record, arm)]
    if not lists or any(not isinstance(v, (list, tuple)) for v in lists):
        return None
    sizes = {len(v) for v in lists}  # type: ignore[arg-type]
    if len(sizes) != 1 or sizes.pop() < 2:
        return None
    table = np.asarray(lists, dtype=float)
    if not np.all(np.isfinite(table)):
        return None
    return [float(v) for v in table.mean(axis=0)]


def metric_samples(record: Mapping[str, Any], metric: str) -> list[float]:
    """The values the gate compares for ``metric``: per-repeat samples of the speculative arm
    (defined repeats only), or the one exact-match fraction for ``equivalence``."""
    if metric == "equivalence":
        value = (record.get("equivalence") or {}).get("exact_fraction")
        return [] if value is None else [float(value)]
    return [v for v in arm_repeat_values(record, metric) if v is not None]


# -- comparison ---------------------------------------------------------------------------
def gate_plan(alpha: float = DEFAULT_ALPHA, repeats: int = 3, cap: int = DEFAULT_CAP) -> SequentialPlan:
    """The gate's sequential plan: looks at ``repeats``, ``repeats + 2``, ... and at ``cap``
    repeats (at least 2 repeats for the first look), REGRESSED at total level ``alpha``."""
    start = max(2, int(repeats))
    return SequentialPlan(start=start, step=2, cap=max(int(cap), start), alpha=alpha)


_FROM_SEQUENTIAL = {sequential.Verdict.REGRESSED: Verdict.REGRESSED,
                    sequential.Verdict.IMPROVED: Verdict.IMPROVED,
                    sequential.Verdict.UNCHANGED: Verdict.PASSED,
                    sequential.Verdict.INCONCLUSIVE: Verdict.INCONCLUSIVE}


def _sequential(limit: FailLimit, base: list[float], cur: list[float], b: float, plan: SequentialPlan,
                paired: bool, requests: tuple[list[float], list[float]] | None,
                seed: int, resamples: int) -> tuple[sequential.SequentialResult | None, str]:
    """The sequential verdict of one per-repeat metric, or (None, why it cannot be judged)."""
    absolute, threshold = not limit.relative, limit.threshold
    if not absolute and min(base + cur) <= 0:
        # A relative limit on values that reach zero (a drafter accepting nothing): the same
        # limit as an amount at the baseline's level, so a collapse still regresses.
        if b <= 0:
            return None, (f"a relative limit needs a positive baseline value, got {b:.4g}; use "
                          f"an absolute limit ({limit.metric}:<amount in {limit.unit}>)")
        absolute, threshold = True, limit.threshold * abs(b)
    try:
        if requests is not None:
            ref_req, cur_req = requests
            level = sum(ref_req) / len(ref_req)
            relative = threshold / level if absolute else threshold
            ones_c, ones_r = [1.0] * len(cur_req), [1.0] * len(ref_req)
            result = sequential.compare_per_request(
                cur_req, ones_c, ref_req, ones_r, limit=relative, worse=limit.worse,
                paired=len(cur_req) == len(ref_req), n_repeats=len(cur), plan=plan,
                resamples=resamples, seed=seed)
        elif paired:
            result = sequential.compare_paired(cur, base, limit=threshold, worse=limit.worse,
                                               plan=plan, absolute=absolute)
        else:
            if len(base) < 2:
                return None, (f"the stored baseline has {len(base)} repeat of {limit.metric}; "
                              "the sequential rule needs at least 2 (save it with "
                              "--specenergy-repeats=3 or more)")
            result = sequential.compare_stored(cur, base, limit=threshold, worse=limit.worse,
                                               plan=plan, absolute=absolute)
    except ValueError as exc:
        return None, f"{limit.metric} cannot be judged: {exc}"
    return result, ""


def compare_metric(limit: FailLimit, base: Sequence[float], cur: Sequence[float],
                   alpha: float = DEFAULT_ALPHA, *, plan: SequentialPlan | None = None,
                   paired: bool = False,
                   requests: tuple[list[float], list[float]] | None = None,
                   seed: int = 0, resamples: int = 5000) -> MetricRow:
    """Compare one metric's reference and current samples under ``limit``.

    Per-repeat metrics follow the sequential rule (``gate/sequential.py``) under ``plan``
    (default :func:`gate_plan` at ``alpha``): Welch's t against a stored run, a paired t for
    in-job A/B (``paired``: sample i of both sides from one repeat cycle), or a bootstrap over
    requests when ``requests`` gives per-request values (reference, current). The
    exact-match fraction is compared as a fact.
    """
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
    if not info.per_repeat:
        # The exact-match fraction of greedy outputs: one number, the fact itself.
        worse = limit.worse_amount(b, c)
        verdict, note = Verdict.PASSED, ""
        if worse > limit.threshold:
            verdict = Verdict.REGRESSED
        elif -worse > limit.threshold:
            verdict, note = Verdict.IMPROVED, "better beyond the limit: consider updating the baseline"
        return MetricRow(limit.metric, limit.stat, info.unit, b, c, c - b, change_rel, limit,
                         None, "deterministic", n_b, n_c, None, verdict, note)
    result, why = _sequential(limit, base, cur, b, plan or gate_plan(alpha), paired, requests,
                              seed, resamples)
    if result is None:
        return MetricRow(limit.metric, limit.stat, info.unit, b, c, c - b, change_rel, limit,
                         None, "none", n_b, n_c, None, Verdict.INCOMPARABLE, why)
    verdict = _FROM_SEQUENTIAL[result.verdict]
    notes = [result.note] if result.note else []
    if verdict is Verdict.INCONCLUSIVE and result.more_repeats:
        notes.insert(0, f"needs {result.more_repeats} more repeats (look {result.look}/"
                        f"{result.looks}); more repeats would decide")
    elif verdict is Verdict.IMPROVED:
        notes.insert(0, "better beyond the limit: consider updating the baseline")
    method = f"sequential {result.method}, look {max(result.look, 1)}/{result.looks}"
    return MetricRow(limit.metric, limit.stat, info.unit, b, c, c - b, change_rel, limit,
                     result.p_value, method, n_b, n_c, tuple(result.interval), verdict,
                     "; ".join(notes), p_sequential=result.p_sequential,
                     more_repeats=result.more_repeats, estimate=result.estimate)


def compare_case(baseline_record: Mapping[str, Any] | None, current_record: Mapping[str, Any],
                 limits: Sequence[FailLimit], alpha: float = DEFAULT_ALPHA, *,
                 baseline_info: Mapping[str, Any] | None = None,
                 current_info: Mapping[str, Any] | None = None,
                 plan: SequentialPlan | None = None,
                 seed: int = 0, resamples: int = 5000) -> CaseComparison:
    """Compare a case's record (``PairResult.as_dict()``) with its baseline record.

    ``baseline_info`` / ``current_info`` add run-level facts (``machine_key``) to what the
    records themselves say (meter, engine, CUDA graphs, scenario); see :func:`run_info`.
    ``plan``: the sequential plan (default :func:`gate_plan` at ``alpha``).
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
    plan = plan or gate_plan(alpha)
    rows = []
    for limit in limits:
        requests = None
        if limit.metric == "accept_length":
            ref_req, cur_req = request_accept_lengths(baseline_record), request_accept_lengths(current_record)
            requests = (ref_req, cur_req) if ref_req and cur_req else None
        rows.append(compare_metric(limit, metric_samples(baseline_record, limit.metric),
                                   metric_samples(current_record, limit.metric), alpha, plan=plan,
                                   requests=requests, seed=seed, resamples=resamples))
    return CaseComparison(case_id, _worst(rows), tuple(rows), (), alpha)


def _worst(rows: Sequence[MetricRow]) -> Verdict:
    return next((v for v in _SEVERITY if any(r.verdict is v for r in rows)), Verdict.PASSED)


def reference_label(record: Mapping[str, Any]) -> str:
    """The reference drafter of an in-job A/B record, in words."""
    drafter = record.get("reference_drafter")
    if not isinstance(drafter, Mapping):
        return "reference"
    return str(drafter.get("id") or drafter.get("name") or drafter.get("method") or "reference")


def _paired_values(record: Mapping[str, Any], metric: str) -> tuple[list[float], list[float]]:
    """(reference, candidate) per-repeat values of one metric, from the same repeat cycles."""
    ref = arm_repeat_values(record, metric, "reference")
    cand = arm_repeat_values(record, metric, "speculative")
    pairs = [(r, c) for r, c in zip(ref, cand) if r is not None and c is not None]
    return [r for r, _ in pairs], [c for _, c in pairs]


def compare_in_job(record: Mapping[str, Any], limits: Sequence[FailLimit],
                   alpha: float = DEFAULT_ALPHA, *, plan: SequentialPlan | None = None,
                   seed: int = 0, resamples: int = 5000) -> CaseComparison:
    """In-job A/B: the candidate (speculative arm) against the reference drafter's arm
    measured in the same repeat cycles of the same session (``record["reference"]``).

    Every per-repeat metric uses the paired sequential rule on sample i of both arms (energy
    on ``log(candidate_r / reference_r)``; the shared baseline cancels), with the same limits
    as a stored comparison. No stored baseline is needed. ``equivalence`` compares the
    candidate's exact-match fraction with ``record["reference_equivalence"]`` when present,
    else with 1.0 (what a lossless reference gives on a deterministic engine).
    """
    case_id = str(record.get("nodeid") or record.get("case_id") or "?")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    label = reference_label(record)
    if not isinstance(record.get("reference"), Mapping):
        return CaseComparison(case_id, Verdict.NO_BASELINE, (), ("no reference arm in the record",),
                              alpha, reference=label)
    sources = (record["reference"].get("source"), (record.get("speculative") or {}).get("source"))
    if sources[0] != sources[1]:
        return CaseComparison(case_id, Verdict.INCOMPARABLE, (), (
            f"the reference arm's energy source {sources[0]!r} differs from the candidate's "
            f"{sources[1]!r}",), alpha, reference=label)
    plan = plan or gate_plan(alpha)
    rows = []
    for limit in limits:
        if limit.metric == "equivalence":
            eq = record.get("reference_equivalence") or {}
            ref_value = eq.get("exact_fraction") if isinstance(eq, Mapping) else None
            row = compare_metric(limit, [1.0 if ref_value is None else float(ref_value)],
                                 metric_samples(record, "equivalence"), alpha, plan=plan)
            if ref_value is None:
                row = dataclasses.replace(row, note="; ".join(filter(None, (
                    row.note, "reference equivalence not in the record: compared with 1.0"))))
            rows.append(row)
            continue
        requests = None
        if limit.metric == "accept_length":
            ref_req, cur_req = request_accept_lengths(record, "reference"), request_accept_lengths(record)
            requests = (ref_req, cur_req) if ref_req and cur_req else None
        ref, cand = _paired_values(record, limit.metric)
        rows.append(compare_metric(limit, ref, cand, alpha, plan=plan, paired=True,
                                   requests=requests, seed=seed, resamples=resamples))
    return CaseComparison(case_id, _worst(rows), tuple(rows), (), alpha, reference=label)


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


def repeats_needed(comparison: CaseComparison) -> int:
    """How many repeats of every arm the next look of the plan needs (0: decided, or at the
    cap): the largest ``more_repeats`` of the INCONCLUSIVE per-repeat rows. Only asked when
    nothing else decides the case (a REGRESSED or INCOMPARABLE row does)."""
    if comparison.verdict is not Verdict.INCONCLUSIVE:
        return 0
    return max((r.more_repeats for r in comparison.rows_with(Verdict.INCONCLUSIVE)
                if GATE_METRICS[r.metric].per_repeat), default=0)


def needs_more_repeats(comparison: CaseComparison) -> bool:
    """True when more repeats could settle the case (see :func:`repeats_needed`)."""
    return repeats_needed(comparison) > 0


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


__all__ = ["CaseComparison", "DEFAULT_ALPHA", "DEFAULT_CAP", "INCONCLUSIVE_POLICIES", "MetricRow",
           "Resolution", "Verdict", "arm_repeat_values", "comparable", "compare_case",
           "compare_documents", "compare_in_job", "compare_metric", "document_run_info", "gate_plan",
           "metric_samples", "needs_more_repeats", "reference_label", "repeats_needed",
           "request_accept_lengths", "resolve_inconclusive", "run_info"]
