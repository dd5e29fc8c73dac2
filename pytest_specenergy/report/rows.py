"""Report rows: a flat table of one run's cases, shared by the terminal table, the HTML and
Markdown reports and the plots.

Everything here is pure: it reads a typed run document (:mod:`pytest_specenergy.document`,
validated once when it was loaded) and returns frozen rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Iterable

import pytest_specenergy.measure.metrics as metrics
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import Check
from pytest_specenergy.document import RunDocument


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
    #: The record the row shows (for what a flat row cannot carry: per-repeat samples).
    record: CaseRecord | None = field(default=None, compare=False, repr=False)

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

    @property
    def blocked(self) -> bool:
        """The arms ran in blocked order (one engine at a time on one GPU): the gate judged the
        case with a block drift allowance, and the tables say so."""
        return self.record is not None and (self.record.order or {}).get("interleaved") is False

    def value(self, metric: str) -> float | None:
        """A metric of the row by name (the speculative arm's for per-arm metrics)."""
        return getattr(self, metric)


def row_from_result(record: CaseRecord) -> ReportRow:
    """One :class:`ReportRow` from a case record."""
    return ReportRow(
        case_id=record.case_id, model=record.model, drafter_id=record.drafter_id,
        drafter_name=record.drafter_name, batch=record.batch,
        corpus=record.corpus_name, source=record.source,
        baseline_source=record.baseline.source, baseline_energy_per_token=record.baseline.energy_per_token,
        energy_per_token=record.energy_per_token, energy_saving=record.energy_saving,
        accept_length=record.accept_length, acceptance_rate=record.acceptance_rate,
        verified_per_step=record.verified_per_step, baseline_tbt_ms=record.baseline.tbt_ms,
        tbt_ms=record.tbt_ms, speedup=record.speedup, exact_fraction=record.exact_fraction,
        logprob_gap=record.logprob_gap, checks=record.checks, verify_intensity=record.verify_intensity,
        balance_point=record.balance_point, draft_share=record.draft_share,
        draft_share_method=record.draft_share_method, record=record)


def rows_from_document(document: RunDocument) -> list[ReportRow]:
    """Every result of a run document as a row, in document order."""
    return [row_from_result(r) for r in document.results]


def sources(rows: Iterable[ReportRow]) -> list[str]:
    """The distinct source labels of ``rows`` (both arms), sorted: what every figure must name."""
    return sorted({s for r in rows for s in (r.source, r.baseline_source)})
