"""What the terminal table, the HTML and Markdown reports and the plots say alike about a run's case
records (:mod:`pytest_specenergy.document`, validated once when loaded)."""

from __future__ import annotations

from typing import Iterable

from pytest_specenergy import metrics
from pytest_specenergy.document import CaseRecord


def intensity(record: CaseRecord) -> str:
    """``142/163`` (verify step's FLOP/byte over the GPU's balance point), ``!`` past it."""
    if record.verify_intensity is None:
        return "n/a"
    balance = f"/{record.balance_point:.0f}" if record.balance_point is not None else ""
    past = metrics.compute_bound(record.verify_intensity, record.balance_point)
    return f"{'!' if past else ''}{record.verify_intensity:.0f}{balance}"


def sources(records: Iterable[CaseRecord]) -> list[str]:
    """The distinct source labels of ``records`` (both arms), sorted: what every figure must name."""
    return sorted({s for r in records for s in (r.source, r.baseline.source)})
