"""What may serve as a baseline: a stored case whose own fail-closed checks tripped when it was
measured (``concurrency-below-batch``, inconsistent counters, ...) is refused, by name, in pytest's
gate and in ``specenergy compare`` alike; its figures describe a broken measurement, and a change
judged against them reads as whatever the breakage made it (audit 3, T32: +23% energy read
"IMPROVED -35%")."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from typing import Sequence

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.compare import document_run_info
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.verdict import Verdict


def failed_checks(record: CaseRecord) -> list[str]:
    """The names of ``record``'s fail-closed checks that tripped (empty: its figures stand)."""
    return [c.name for c in record.checks if c.severity == "fail"]


#: How the reason of a refused comparison begins (``specenergy compare`` fails it whatever
#: ``--incomparable`` says).
REFUSED = "refused: "


def refusal(record: CaseRecord, side: str = "baseline") -> str | None:
    """Why ``record`` cannot be judged or judge (``side``: ``baseline`` or ``current``), or None."""
    names = failed_checks(record)
    if not names:
        return None
    return (
        f"the {side} record's own fail-closed checks failed when it was measured "
        f"({', '.join(names)}): its figures describe a broken measurement"
    )


def is_refused(comparison: CaseComparison) -> bool:
    """Whether ``comparison`` is a refusal (:func:`refused_comparison`), not a mere mismatch."""
    return any(reason.startswith(REFUSED) for reason in comparison.reasons)


def refusal_message(key: str, path: str | Path | None, why: str) -> str:
    """What a case whose stored baseline is refused shows: the case, the file, why, and the fix."""
    where = f" in {path}" if path else ""
    return (
        f"specenergy: the baseline of {key}{where} is refused: {why}; a measurement whose checks "
        "failed never serves as a baseline. Save a run whose checks held (e.g. rerun the nightly "
        "with --specenergy-save=main) or compare with an older run (--specenergy-compare=NNNN)"
    )


def refused_comparison(key: str, why: str, alpha: float) -> CaseComparison:
    """The comparison of a case whose baseline (or whose own measurement) is refused:
    INCOMPARABLE, with the reason; the gate fails it whatever ``--specenergy-incomparable`` says."""
    return CaseComparison(key, Verdict.INCOMPARABLE, (), (REFUSED + why,), alpha)


def compare_runs(
    baseline: RunDocument,
    current: RunDocument,
    limits: Sequence[FailLimit],
    alpha: float,
    **kwargs: Any,
) -> list[CaseComparison]:
    """Every result of ``current`` against ``baseline``'s of the same key, as pytest's gate judges
    it: a record of either run whose checks failed is refused (INCOMPARABLE, naming the checks),
    one the baseline lacks is NO_BASELINE."""
    stored = {r.key: r for r in baseline.results}
    b_info, c_info = document_run_info(baseline), document_run_info(current)
    comparisons = []
    for record in current.results:
        base = stored.get(record.key)
        why = (refusal(base) if base is not None else None) or refusal(record, "current")
        if why:
            comparisons.append(refused_comparison(record.key, why, alpha))
            continue
        comparisons.append(
            compare_case(
                base, record, limits, alpha, baseline_info=b_info, current_info=c_info, **kwargs
            )
        )
    return comparisons
