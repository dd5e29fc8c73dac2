"""Report rows: a flat table of one run's cases, shared by the terminal table, the HTML and
Markdown reports and the plots.

Everything here is pure: it reads the JSON-ready run document of
:func:`pytest_specenergy.document.build_document` (or one loaded back from disk, possibly
written by an older plugin, hence the defensive ``.get`` everywhere) and returns frozen records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Iterable
from typing import Mapping

import pytest_specenergy.measure.metrics as metrics
from pytest_specenergy.measure.checks import Check


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
    checks: tuple[Check, ...] = ()
    verify_intensity: float | None = None
    balance_point: float | None = None
    draft_share: float | None = None
    #: How the draft share was found: ``removal`` (verify-only replay) or ``priced`` (modeled).
    draft_share_method: str | None = None

    @property
    def compute_bound(self) -> bool | None:
        """Whether the verify step lies past the GPU's balance point."""
        return metrics.compute_bound(self.verify_intensity, self.balance_point)

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
    checks = tuple(Check(str(c.get("name", "?")), str(c.get("severity", "warn")),
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
        verify_intensity=_num(result.get("verify_intensity")),
        balance_point=_num(result.get("balance_point")),
        draft_share=_num(result.get("draft_share")),
        draft_share_method=result.get("draft_share_method"),
    )


def rows_from_document(document: Mapping[str, Any]) -> list[ReportRow]:
    """Every result of a run document as a row, in document order."""
    return [row_from_result(r) for r in document.get("results") or () if isinstance(r, Mapping)]


def sources(rows: Iterable[ReportRow]) -> list[str]:
    """The distinct source labels of ``rows`` (both arms), sorted: what every figure must name."""
    return sorted({s for r in rows for s in (r.source, r.baseline_source)})
