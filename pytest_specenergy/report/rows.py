"""What the terminal table, the HTML and Markdown reports and the plots say alike about a run's case
records (:mod:`pytest_specenergy.document`, validated once when loaded)."""

from __future__ import annotations

from typing import Iterable

from pytest_specenergy import metrics
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument

#: What every report of an interrupted run says first (audit 3, T34: its HTML and Markdown never
#: said so, and a nightly's ``if: always()`` report step published it as a normal report).
INTERRUPTED = (
    "This run was interrupted (Ctrl-C, SIGTERM, -x, a crashed worker, or merged from such a "
    "shard): its results are incomplete, and it never serves as a baseline."
)


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


def notices(run: RunDocument) -> list[str]:
    """What a report says before anything else, as plain text: that the run was interrupted, and
    the baseline cases it did not measure (the gate's coverage)."""
    found = [INTERRUPTED] if run.interrupted else []
    for coverage in run.coverage:
        if coverage.unmeasured:
            found.append(
                f"{len(coverage.unmeasured)} baseline case(s) of {coverage.baseline} were not "
                f"measured by this run{' (the session failed for it)' if coverage.failed else ''}: "
                + ", ".join(coverage.unmeasured)
            )
    return found
