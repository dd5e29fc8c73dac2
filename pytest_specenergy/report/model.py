"""A flat table of report rows extracted from run documents, shared by the HTML and Markdown
reports and the plots.

Everything here is pure: it reads the JSON-ready run document of
:func:`pytest_specenergy.document.build_document` (or one loaded back from disk, possibly
written by an older plugin, hence the defensive ``.get`` everywhere) and returns frozen records.
No formatting policy lives in the renderers beyond layout: :func:`fmt` and :func:`fmt_change`
are the single place a number becomes text.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any
from typing import Iterable
from typing import Mapping
from typing import Sequence

from pytest_specenergy.measure.metrics import METRICS

#: Metrics compared against a baseline run, in report order.
COMPARED_METRICS: tuple[str, ...] = ("energy_per_token", "energy_saving", "accept_length",
                                     "acceptance_rate", "tbt_ms")
#: Fractions that sit at or cross zero: a relative change means nothing, so their threshold
#: and change are in absolute points (0.05 = 5 percentage points), as in ``failexpr``.
POINTS_METRICS: frozenset[str] = frozenset({"energy_saving", "acceptance_rate"})
DEFAULT_THRESHOLD = 0.05
# Case statuses, worst first: the sort order of the comparison table.
STATUS_ORDER: tuple[str, ...] = ("regressed", "incomparable", "inconclusive", "missing", "new",
                                 "improved", "unchanged", "n/a")


def worse_direction(metric: str) -> str:
    """``"up"`` when a rise is worse (energy, time), ``"down"`` when a fall is, else ``"-"``."""
    better = "higher" if metric == "exact_fraction" else getattr(METRICS.get(metric), "better", "-")
    return {"lower": "up", "higher": "down"}.get(better, "-")


@dataclass(frozen=True)
class CheckFlag:
    """One tripped validity check of a row."""

    name: str
    severity: str  # "fail" | "warn"
    message: str


@dataclass(frozen=True)
class ReportRow:
    """One case of one run: both arms' figures, the derived metrics and the tripped checks."""

    case_id: str
    model: str
    drafter_id: str
    drafter_name: str
    batch: int | None
    corpus: str
    source: str
    baseline_source: str
    baseline_energy_per_token: float | None
    energy_per_token: float | None
    energy_saving: float | None
    accept_length: float | None
    acceptance_rate: float | None
    verified_per_step: int | None
    baseline_tbt_ms: float | None
    tbt_ms: float | None
    speedup: float | None
    exact_fraction: float | None
    logprob_gap: float | None
    checks: tuple[CheckFlag, ...] = ()

    @property
    def workload(self) -> tuple[str, str]:
        """(model, corpus): rows that share a baseline curve and may be compared."""
        return (self.model, self.corpus)

    @property
    def tripped(self) -> bool:
        """Any check tripped (the plots draw such rows hollow)."""
        return bool(self.checks)

    @property
    def failed(self) -> bool:
        """A fail-closed check tripped: the row's numbers must not be trusted."""
        return any(c.severity == "fail" for c in self.checks)

    def value(self, metric: str) -> float | None:
        """A metric of the row by name (the speculative arm's for per-arm metrics)."""
        return getattr(self, metric)


def _num(value: Any) -> float | None:
    # Stored documents may hold ints, None or (from hand-edited JSON) strings.
    try:
        return None if isinstance(value, bool) or value is None else float(value)
    except (TypeError, ValueError):
        return None


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        mapping = mapping.get(key) if isinstance(mapping, Mapping) else None
    return mapping


def row_from_result(result: Mapping[str, Any]) -> ReportRow:
    """One :class:`ReportRow` from a ``PairResult.as_dict()`` record."""
    case = result.get("case") or {}
    drafter = case.get("drafter") or {}
    batch = _num(case.get("batch"))
    vps = _num(result.get("verified_per_step"))
    checks = tuple(CheckFlag(str(c.get("name", "?")), str(c.get("severity", "warn")),
                             str(c.get("message", "")))
                   for c in result.get("checks") or () if isinstance(c, Mapping))
    source = str(result.get("source") or _get(result, "speculative", "source") or "unknown")
    return ReportRow(
        case_id=str(result.get("case_id") or case.get("id") or "?"),
        model=str(case.get("model", "?")),
        drafter_id=str(drafter.get("id") or drafter.get("name") or "?"),
        drafter_name=str(drafter.get("name", "?")),
        batch=None if batch is None else int(batch),
        corpus=str(_get(case, "corpus", "name") or "?"),
        source=source,
        baseline_source=str(_get(result, "baseline", "source") or source),
        baseline_energy_per_token=_num(_get(result, "baseline", "energy_per_token")),
        energy_per_token=_num(result.get("energy_per_token")),
        energy_saving=_num(result.get("energy_saving")),
        accept_length=_num(result.get("accept_length")),
        acceptance_rate=_num(result.get("acceptance_rate")),
        verified_per_step=None if vps is None else int(vps),
        baseline_tbt_ms=_num(_get(result, "baseline", "tbt_ms")),
        tbt_ms=_num(result.get("tbt_ms")),
        speedup=_num(result.get("speedup")),
        exact_fraction=_num(_get(result, "equivalence", "exact_fraction")),
        logprob_gap=_num(_get(result, "coherence", "mean_gap")),
        checks=checks,
    )


def rows_from_document(document: Mapping[str, Any]) -> list[ReportRow]:
    """Every result of a run document as a row, in document order."""
    return [row_from_result(r) for r in document.get("results") or () if isinstance(r, Mapping)]


def sources(rows: Iterable[ReportRow]) -> list[str]:
    """The distinct source labels of ``rows`` (both arms), sorted: what every figure must name."""
    return sorted({s for r in rows for s in (r.source, r.baseline_source)})


# -- baseline comparison ----------------------------------------------------------------------
@dataclass(frozen=True)
class MetricChange:
    """One metric of one case, baseline run against current run."""

    metric: str
    baseline: float | None
    current: float | None
    change: float | None  # relative, or absolute points for POINTS_METRICS
    worse: str  # "up" | "down"
    status: str  # "regressed" | "improved" | "unchanged" | "n/a" | an explicit gate verdict
    explicit: bool = False


@dataclass(frozen=True)
class CaseDelta:
    """A case of the current run against the same case id in the baseline run."""

    case_id: str
    source: str
    baseline_source: str
    status: str
    changes: tuple[MetricChange, ...]

    @property
    def regressed(self) -> bool:
        """At least one metric regressed (by threshold or by the gate's verdict)."""
        return self.status == "regressed"

    def change(self, metric: str) -> MetricChange | None:
        """The change of ``metric``, if it was compared."""
        return next((c for c in self.changes if c.metric == metric), None)


def metric_change(metric: str, baseline: float | None, current: float | None,
                  threshold: float = DEFAULT_THRESHOLD, verdict: str | None = None) -> MetricChange:
    """Compare one value; ``verdict`` (the gate's own, stored on the record) overrides the
    threshold, because the gate also tested significance, which a bare threshold cannot."""
    worse = worse_direction(metric)
    change: float | None = None
    if baseline is not None and current is not None and (metric in POINTS_METRICS or baseline):
        change = current - baseline if metric in POINTS_METRICS else current / baseline - 1.0
    if verdict:
        return MetricChange(metric, baseline, current, change, worse,
                            {"passed": "unchanged"}.get(verdict, verdict), explicit=True)
    if change is None:
        status = "n/a"
    elif abs(change) < threshold or worse == "-":
        status = "unchanged"
    else:
        status = "regressed" if (change > 0) == (worse == "up") else "improved"
    return MetricChange(metric, baseline, current, change, worse, status)


def explicit_verdicts(result: Mapping[str, Any]) -> dict[str, str]:
    """Per-metric verdicts a record carries under ``"verdicts"``.

    Accepted shapes: ``{metric: "regressed"}``, ``{metric: {"verdict": ...}}``, a list of gate
    ``MetricRow.as_dict()`` records, or a gate ``CaseComparison.as_dict()`` (its rows, and its
    case verdict under the key ``"*"``).
    """
    raw = result.get("verdicts")
    found: dict[str, str] = {}
    if isinstance(raw, Mapping) and isinstance(raw.get("rows"), list):
        if isinstance(raw.get("verdict"), str):
            found["*"] = raw["verdict"]
        raw = raw["rows"]
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, Mapping) and isinstance(item.get("verdict"), str):
                found[str(item.get("metric"))] = item["verdict"]
    elif isinstance(raw, Mapping):
        for metric, value in raw.items():
            if isinstance(value, Mapping):
                value = value.get("verdict")
            if isinstance(value, str):
                found[str(metric)] = value
    return found


def compare_documents(current: Mapping[str, Any], baseline: Mapping[str, Any],
                      threshold: float = DEFAULT_THRESHOLD,
                      metrics: Sequence[str] = COMPARED_METRICS) -> list[CaseDelta]:
    """Per case: baseline vs current vs change of each metric, regressions first.

    Cases only in the current run are ``new``, cases only in the baseline ``missing``.
    """
    base_rows = {r.case_id: r for r in rows_from_document(baseline)}
    records = {str(r.get("case_id") or _get(r, "case", "id")): r
               for r in current.get("results") or () if isinstance(r, Mapping)}
    deltas = []
    for row in rows_from_document(current):
        old = base_rows.get(row.case_id)
        verdicts = explicit_verdicts(records.get(row.case_id, {}))
        changes = tuple(metric_change(m, old.value(m) if old else None, row.value(m), threshold,
                                      verdicts.get(m)) for m in metrics)
        # The case takes its worst metric status (or the gate's case verdict, if worse).
        ranked = [s for s in [c.status for c in changes] + [verdicts.get("*", "n/a")]
                  if s in STATUS_ORDER]
        status = "new" if old is None else min(ranked, key=STATUS_ORDER.index, default="n/a")
        deltas.append(CaseDelta(row.case_id, row.source, old.source if old else "",
                                status, changes))
    deltas += [CaseDelta(case_id, "", old.source, "missing",
                         tuple(metric_change(m, old.value(m), None, threshold) for m in metrics))
               for case_id, old in base_rows.items() if case_id not in records]
    return sorted(deltas, key=lambda d: (STATUS_ORDER.index(d.status), d.case_id))


# -- latency targets ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigPoint:
    """A serving configuration: one arm at one batch (the baseline is a drafter-less config)."""

    label: str
    model: str
    corpus: str
    drafter_id: str | None  # None for the non-speculative baseline
    batch: int | None
    tbt_ms: float
    energy_per_token: float
    source: str
    tripped: bool
    failed: bool


def config_points(rows: Iterable[ReportRow]) -> list[ConfigPoint]:
    """Every speculative arm plus each distinct baseline arm (one per model, corpus, batch)."""
    points: list[ConfigPoint] = []
    seen: set[tuple[str, str, int | None]] = set()
    for r in rows:
        key, base_tbt, base_ept = ((r.model, r.corpus, r.batch), r.baseline_tbt_ms,
                                   r.baseline_energy_per_token)
        if key not in seen and base_tbt is not None and base_ept is not None:
            seen.add(key)
            points.append(ConfigPoint(f"baseline b{r.batch}", r.model, r.corpus, None, r.batch,
                                      base_tbt, base_ept, r.baseline_source, False, False))
        if r.tbt_ms is not None and r.energy_per_token is not None:
            points.append(ConfigPoint(f"{r.drafter_id} b{r.batch}", r.model, r.corpus,
                                      r.drafter_id, r.batch, r.tbt_ms, r.energy_per_token,
                                      r.source, r.tripped, r.failed))
    return points


def best_under_target(points: Iterable[ConfigPoint], target_ms: float) -> ConfigPoint | None:
    """The lowest-energy configuration whose time between tokens meets ``target_ms``.

    Configurations with a failed check are never chosen: their numbers cannot be trusted.
    Ties go to the lower time between tokens, then the label, so the choice is stable.
    """
    eligible = [p for p in points if p.tbt_ms <= target_ms and not p.failed]
    return min(eligible, key=lambda p: (p.energy_per_token, p.tbt_ms, p.label), default=None)


@dataclass(frozen=True)
class TargetChoice:
    """For one workload and latency target, the configuration to serve (None if none meets it)."""

    model: str
    corpus: str
    target_ms: float
    choice: ConfigPoint | None


def latency_choices(rows: Iterable[ReportRow], targets_ms: Sequence[float]) -> list[TargetChoice]:
    """Per workload (model, corpus) and target, the lowest-energy configuration meeting it;
    workloads are kept apart because energy per token of different text is not comparable."""
    by_workload: dict[tuple[str, str], list[ConfigPoint]] = {}
    for p in config_points(rows):
        by_workload.setdefault((p.model, p.corpus), []).append(p)
    return [TargetChoice(model, corpus, t, best_under_target(points, t))
            for (model, corpus), points in by_workload.items() for t in targets_ms]


# -- history and steps --------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """A sustained change in level at ``index`` (the first run at the new level)."""

    index: int
    before: float
    after: float
    change: float  # relative, or absolute when detected with relative=False


def detect_steps(values: Sequence[float | None], threshold: float = DEFAULT_THRESHOLD,
                 window: int = 3, min_sustain: int = 2, relative: bool = True) -> list[Step]:
    """Find level shifts in a series of per-run values (None = the case did not run).

    A step at ``i`` needs: the median of the (up to ``window``) runs from ``i`` on differs from
    the median of the (up to ``window``) runs before ``i`` by at least ``threshold`` (relative
    to the earlier median, or absolute with ``relative=False``); at least ``min_sustain`` runs
    after it, all on the new side of the midpoint (a lone spike is not a step); and the run just
    before ``i`` still on the old side, which pins the step to its first run. Candidates closer
    than ``window`` keep the largest change.
    """
    present = [(i, float(v)) for i, v in enumerate(values) if v is not None]
    vals = [v for _, v in present]
    candidates: list[Step] = []
    for j in range(1, len(vals)):
        before, after = vals[max(0, j - window):j], vals[j:j + window]
        if len(after) < min_sustain:
            break
        old, new = statistics.median(before), statistics.median(after)
        if relative and old == 0:
            continue
        change = new / old - 1.0 if relative else new - old
        if abs(change) < threshold:
            continue
        mid = (old + new) / 2
        up = new > old
        if all((v > mid) == up for v in after) and (vals[j - 1] > mid) != up:
            candidates.append(Step(present[j][0], old, new, change))
    steps: list[Step] = []
    for step in candidates:
        if not steps or step.index - steps[-1].index >= window:
            steps.append(step)
        elif abs(step.change) > abs(steps[-1].change):
            steps[-1] = step
    return steps


def history_series(documents: Sequence[Mapping[str, Any]],
                   metric: str) -> dict[str, list[float | None]]:
    """Per case id, ``metric`` in each document (oldest first); None where the case is absent."""
    per_doc = [{r.case_id: r.value(metric) for r in rows_from_document(d)} for d in documents]
    case_ids = sorted({c for values in per_doc for c in values})
    return {c: [values.get(c) for values in per_doc] for c in case_ids}


# -- formatting -------------------------------------------------------------------------------
_FORMATS = {"energy_saving": "{:+.1%}", "accept_length": "{:.2f}", "acceptance_rate": "{:.1%}",
            "tbt_ms": "{:.2f}", "baseline_tbt_ms": "{:.2f}", "speedup": "{:.2f}x",
            "exact_fraction": "{:.0%}", "logprob_gap": "{:.3f}"}  # others: 4 significant


def fmt(metric: str, value: float | int | None) -> str:
    """A metric value as report text; ``n/a`` when it could not be computed."""
    if value is None:
        return "n/a"
    return str(int(value)) if metric == "verified_per_step" else \
        _FORMATS.get(metric, "{:.4g}").format(value)


def fmt_change(change: MetricChange) -> str:
    """The change as text: relative percent, or percentage points for fraction metrics."""
    if change.change is None:
        return "n/a"
    if change.metric in POINTS_METRICS:
        return f"{change.change * 100:+.1f} pts"
    return f"{change.change:+.1%}"
