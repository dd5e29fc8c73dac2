"""Suite-level verdicts: what the gate decides once every case of a session is in (FDR, latency
targets, verdict counts), as one :class:`SuiteVerdict`; the session only applies its exit bit and
prints its lines. More: docs/gate.md#suite-verdicts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any
from typing import Sequence

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import CoverageFacts
from pytest_specenergy.document import FdrSummary
from pytest_specenergy.document import LatencySummary
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.coverage import coverage_section
from pytest_specenergy.gate.fdr import PENDING
from pytest_specenergy.gate.fdr import immediate_decision
from pytest_specenergy.gate.fdr import suite_fdr
from pytest_specenergy.gate.latency import LATENCY_LIMIT
from pytest_specenergy.gate.latency import compare_latency
from pytest_specenergy.gate.latency import latency_choices
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.sequential import SequentialPlan
from pytest_specenergy.gate.verdict import WORST_FIRST
from pytest_specenergy.gate.verdict import Section
from pytest_specenergy.gate.verdict import Verdict


@dataclass(frozen=True)
class SuiteVerdict:
    """The suite's sections to print, whether the session fails, and the document's ``fdr``,
    ``latency_targets`` and ``coverage``."""

    sections: tuple[Section, ...] = ()
    failed: bool = False
    fdr: FdrSummary | None = None
    latency_targets: LatencySummary | None = None
    coverage: tuple[CoverageFacts, ...] = ()


def fdr_pending(
    key: str, comparison: CaseComparison, q: float, n_tests: int
) -> tuple[tuple[str, ...], list[str]]:
    """``--specenergy-fdr`` while a test runs: its comparisons whose p-value lies in (Q/N, Q] pass
    for now, with a warning each, and are decided at session end (REGRESSED rows are BH's "fail
    now")."""
    pending, warnings = [], []
    for row in comparison.rows:
        if (
            row.p_sequential is not None
            and immediate_decision(row.p_sequential, q, n_tests) == PENDING
        ):
            pending.append(f"{key}::{row.metric}")
            warnings.append(
                f"specenergy: pending FDR: {key}::{row.metric} "
                f"p_sequential={row.p_sequential:.3g} lies in (Q/N, Q] = ({q / n_tests:.3g}, "
                f"{q:g}]; Benjamini-Hochberg decides it at session end"
            )
    return tuple(pending), warnings


def _fdr(records: Sequence[CaseRecord], q: float, n_collected: int) -> tuple[Section, FdrSummary]:
    """BH over the suite's gated comparisons; a pending one it rejects fails the session (its test
    passed)."""
    pvalues = {f"{r.key}::{m}": p for r in records for m, p in r.sequential_pvalues.items()}
    pending = {key for r in records for key in (r.fdr_pending or ())}
    result = suite_fdr(pvalues, q, pending=tuple(pending))
    lines = result.summary().splitlines()
    if result.pending_rejected:
        lines.append(
            f"{len(result.pending_rejected)} comparison(s) that passed pending FDR regressed at "
            "session end: exit status 1"
        )
    block = FdrSummary(
        q=result.q,
        method=result.method,
        n_collected=n_collected,
        n_tests=result.n_tests,
        rejected=tuple(result.rejected),
        pending_rejected=tuple(result.pending_rejected),
        adjusted=dict(result.adjusted),
    )
    return Section(
        "specenergy false-discovery rate", tuple(lines), bool(result.pending_rejected)
    ), block


def _latency(
    records: Sequence[CaseRecord],
    targets: Sequence[float],
    references: dict[str, Any],
    plan: SequentialPlan,
) -> tuple[Section, LatencySummary]:
    """Per latency target the lowest-energy configuration meeting it, judged against its machine
    key's reference run."""
    choices = latency_choices(records, targets)
    lines = [choice.line() for choice in choices]
    failures: list[str] = []
    comparisons: list[CaseComparison] = []
    limit = parse_fail_expr(LATENCY_LIMIT)
    for key, (reference, where, fatal) in sorted(references.items()):
        if reference is None:
            (failures if fatal else lines).append(f"latency targets not compared on {key}: {where}")
            continue
        mine = [r for r in records if r.machine_key == key]
        for comparison in compare_latency(reference.results, mine, targets, limit, plan):
            comparisons.append(comparison)
            if comparison.verdict in (Verdict.REGRESSED, Verdict.INCOMPARABLE):
                failures.append(comparison.failure_message(where))
            elif comparison.verdict is Verdict.INCONCLUSIVE:
                lines.append(comparison.failure_message(where))
    block = LatencySummary.from_dict(
        {
            "targets_ms": list(targets),
            "limit": LATENCY_LIMIT,
            "choices": [c.as_dict() for c in choices],
            "comparisons": [c.as_dict() for c in comparisons],
            "failures": failures,
        },
        "latency_targets",
    )
    return Section("specenergy latency targets", tuple(lines + failures), bool(failures)), block


def verdict_counts(records: Sequence[CaseRecord]) -> str | None:
    """``N regressed · M incomparable · ... · K unchanged``, or None when nothing was compared."""
    counts = Counter(r.verdict for r in records if r.verdict)
    if not counts:
        return None
    return " · ".join(f"{counts.get(v.value, 0)} {v.label}" for v in WORST_FIRST)


def judge_suite(
    records: Sequence[CaseRecord],
    *,
    plan: SequentialPlan,
    fdr_q: float | None = None,
    fdr_collected: int = 0,
    latency_targets: Sequence[float] = (),
    references: dict[str, tuple[RunDocument | None, str, bool]] | None = None,
    coverage: Sequence[CoverageFacts] = (),
) -> SuiteVerdict:
    """Every suite-level verdict of a session (``references``: as
    :meth:`.Gatekeeper.latency_references` gives them; ``coverage``: as
    :meth:`.Gatekeeper.coverage` gives it)."""
    sections: list[Section] = []
    covered = coverage_section(coverage)
    if covered is not None:
        sections.append(covered)
    fdr = latency = None
    if latency_targets:
        section, latency = _latency(records, latency_targets, references or {}, plan)
        sections.append(section)
    if fdr_q:
        section, fdr = _fdr(records, fdr_q, fdr_collected)
        sections.append(section)
    return SuiteVerdict(
        tuple(sections), any(s.failed for s in sections), fdr, latency, tuple(coverage)
    )
