"""The terminal summary: one row per test that measured a pair, every energy figure labelled
with its source, the gate's verdict counts, the suite's verdicts and what was written."""

from __future__ import annotations

from typing import Any
from typing import Iterable

from tabulate import tabulate

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.suite import SuiteVerdict
from pytest_specenergy.gate.suite import verdict_counts
from pytest_specenergy.gate.verdict import Section
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.measure.metrics import fmt
from pytest_specenergy.report.rows import ReportRow
from pytest_specenergy.report.rows import row_from_result
from pytest_specenergy.report.summary import SummaryReport

HEADERS = ("test", "source", "base J/tok", "spec J/tok", "saving", "accept len", "accept rate",
           "verified/step", "verify FLOP/B", "draft share", "base tbt ms", "spec tbt ms", "speedup", "exact",
           "logprob gap", "flags")


def _intensity(row: ReportRow) -> str:
    """``142/163`` (verify step's FLOP/byte over the GPU's balance point), ``!`` past it."""
    if row.verify_intensity is None:
        return "n/a"
    balance = f"/{row.balance_point:.0f}" if row.balance_point is not None else ""
    return f"{'!' if row.compute_bound else ''}{row.verify_intensity:.0f}{balance}"


def table_row(row: ReportRow, label: str | None = None) -> list[str]:
    """One table row (``!`` marks a fail-closed check)."""
    flags = ", ".join(("!" if c.severity == "fail" else "") + c.name for c in row.checks)
    return [label or row.case_id, row.source, fmt(row.baseline_energy_per_token, ".4g"),
            fmt(row.energy_per_token, ".4g"), fmt(row.energy_saving, "+.1%"),
            fmt(row.accept_length, ".2f"), fmt(row.acceptance_rate, ".2f"),
            fmt(row.verified_per_step, "d"), _intensity(row), fmt(row.draft_share, ".0%"),
            fmt(row.baseline_tbt_ms, ".3f"),
            fmt(row.tbt_ms, ".3f"), fmt(row.speedup, ".2f", "x"), fmt(row.exact_fraction, ".0%"),
            fmt(row.logprob_gap, ".3f"), flags or "-"]


def render_table(records: Iterable[CaseRecord]) -> str:
    """The summary table; a verdict column appears when the gate compared anything."""
    records = list(records)
    gated = any(r.verdict for r in records)
    rows = []
    for record in records:
        # The test's own name: one case may be measured once and used by several tests.
        row = table_row(row_from_result(record), (record.nodeid or "").split("::")[-1] or None)
        if gated:
            row.append(f"{Verdict(record.verdict).mark} {record.verdict}" if record.verdict else "-")
        rows.append(row)
    headers = list(HEADERS) + (["verdict"] if gated else [])
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def summary_report(document: RunDocument, suite: SuiteVerdict, written: Any, xdist_skipped: int) -> SummaryReport:
    """The terminal summary of ``document``, the suite's verdicts and what was written (the
    session's :class:`~pytest_specenergy.outputs.Written`)."""
    records = document.results
    sources = sorted({r.source for r in records})
    pairs = len({(r.model, r.case_id, r.machine_key) for r in records})
    starts = f", {document.engine_starts} engine starts" if document.engine_starts else ""
    lines = [render_table(records), f"{len(records)} results of {pairs} distinct pairs{starts}; "
                                    f"energy figures: {', '.join(sources)}"]
    counts = verdict_counts(records)
    lines += [counts] if counts else []
    if written.unused_goldens:
        lines.append(f"{len(written.unused_goldens)} golden baseline(s) no test used: "
                     + ", ".join(map(str, written.unused_goldens)))
    lines += [f"specenergy golden baseline written: {p}" for p in written.goldens]
    lines += [f"specenergy run saved: {p}" for p in written.saved]
    lines += [f"specenergy JSON: {written.json}"] if written.json else []
    if document.interrupted:
        lines.append("the session was interrupted: the saved run is marked so and never serves as a baseline")
    failed = (Section("specenergy outputs not written", (*written.failures, "exit status 1"), True),) \
        if written.failures else ()
    return SummaryReport(SummaryReport.of_nothing(xdist_skipped).sections + (Section("specenergy", tuple(lines)),)
                         + suite.sections + failed)
