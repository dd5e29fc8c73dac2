"""The terminal summary: a header line naming the energy figures' source, one row per test that
measured a pair (verdict and saving first, in 120 columns; all with ``-v``), the gate's and the
suite's verdicts, what was written."""

from __future__ import annotations

from typing import Any
from typing import Iterable

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.suite import SuiteVerdict
from pytest_specenergy.gate.suite import verdict_counts
from pytest_specenergy.gate.verdict import Section
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.metrics import fmt
from pytest_specenergy.report.rows import intensity
from pytest_specenergy.report.summary import SummaryReport

#: Every column, in order (``-v``): the verdict (when the gate compared anything) and the saving
#: first, the energy source only when the rows' sources differ.
HEADERS = (
    "verdict",
    "saving",
    "test",
    "source",
    "base J/tok",
    "spec J/tok",
    "accept len",
    "accept rate",
    "verified/step",
    "verify FLOP/B",
    "draft share",
    "base tbt ms",
    "spec tbt ms",
    "speedup",
    "exact",
    "logprob gap",
    "flags",
)
#: The default columns: what a person reads at a glance, in a table that fits ``WIDTH``.
COMPACT = (
    "verdict",
    "saving",
    "test",
    "source",
    "base J/tok",
    "spec J/tok",
    "accept len",
    "speedup",
    "exact",
    "flags",
)
#: The default table's width: an ordinary terminal's, as pytest-benchmark fits its default table.
WIDTH = 120
#: Columns that give way (cut with ``…``) when a row is too wide, in this order, and their least
#: width. Flags are never cut: a row whose flags do not fit names them in a footnote.
_SHRINKABLE = {"test": 16}
_GAP = "  "
#: What the table's marks mean, printed under it: the verdicts' (when the gate compared anything)
#: and the flags' (when a row has any).
VERDICT_LEGEND = (
    "verdict: + regressed, - improved, ~ inconclusive, x incomparable, ? no baseline, "
    "unchanged: inside the limit"
)
FLAGS_LEGEND = "flags: ! a fail-closed check tripped (the figures are not trusted); the others warn"


def table_row(row: CaseRecord, label: str | None = None) -> dict[str, str]:
    """One row's cells by column name (``!`` marks a fail-closed check)."""
    flags = ", ".join(("!" if c.severity == "fail" else "") + c.name for c in row.checks)
    return {
        "verdict": _verdict(row.verdict),
        "saving": fmt(row.energy_saving, "+.1%"),
        "test": (label or row.case_id) + ("" if row.interleaved else " (blocked order)"),
        "source": row.source,
        "base J/tok": fmt(row.baseline.energy_per_token, ".4g"),
        "spec J/tok": fmt(row.energy_per_token, ".4g"),
        "accept len": fmt(row.accept_length, ".2f"),
        "accept rate": fmt(row.acceptance_rate, ".2f"),
        "verified/step": fmt(row.verified_per_step, "d"),
        "verify FLOP/B": intensity(row),
        "draft share": fmt(row.draft_share, ".0%"),
        "base tbt ms": fmt(row.baseline.tbt_ms, ".3f"),
        "spec tbt ms": fmt(row.tbt_ms, ".3f"),
        "speedup": fmt(row.speedup, ".2f", "x"),
        "exact": fmt(row.exact_fraction, ".0%"),
        "logprob gap": fmt(row.logprob_gap, ".3f"),
        "flags": flags or "-",
    }


def _verdict(value: str | None) -> str:
    if not value:
        return "-"
    verdict = Verdict(value)
    return f"{verdict.mark} {verdict.word}"


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: a test id loses the end of its function name first
    (its case id in brackets tells the rows apart), other text its middle."""
    if len(text) <= width:
        return text
    name, bracket, param = text.partition("[")
    keep = width - len(param) - 2
    if bracket and keep >= 0:
        return name[:keep] + "\u2026[" + param
    head = (width - 1) // 3
    return text[:head] + "\u2026" + text[len(text) - (width - 1 - head) :]


def _fit(
    columns: list[str], rows: list[dict[str, str]], width: int
) -> tuple[list[list[str]], list[str]]:
    """The rows' cells in at most ``width`` columns, and the footnotes. Flags are never cut: while
    the table is too wide to show every test's case id whole, the longest flags move to a footnote
    (the cell shows ``[n]``, footnote n names them); then the test column is cut, keeping the case
    ids (down to :data:`_SHRINKABLE`'s least width when even that is too wide)."""
    notes: list[str] = []

    def widths() -> dict[str, int]:
        return {c: max([len(c)] + [len(r[c]) for r in rows]) for c in columns}

    def over() -> int:
        return sum(widths().values()) + len(_GAP) * (len(columns) - 1) - width

    if "test" in columns:  # what the test column can give up with every case id kept whole
        need = max(len(r["test"]) - r["test"].find("[") + 1 for r in rows if "[" in r["test"])
        slack = max(0, widths()["test"] - max(need, len("test")))
    else:
        slack = 0
    while "flags" in columns and over() > slack:
        longest = max(rows, key=lambda r: len(r["flags"]))
        if len(longest["flags"]) <= len("flags"):
            break
        notes.append(f"[{len(notes) + 1}] {longest['test']}: {longest['flags']}")
        longest["flags"] = f"[{len(notes)}]"
    fitted, excess = widths(), over()
    for column, least in _SHRINKABLE.items():
        if excess > 0 and column in fitted and fitted[column] > least:
            cut = min(fitted[column] - least, excess)
            fitted[column] -= cut
            excess -= cut
    return [[_cut(r[c], fitted[c]) for c in columns] for r in rows], notes


def _sources(records: Iterable[CaseRecord]) -> list[str]:
    # one order for the legend and the table's source column, whose numbers refer to it
    return sorted({r.source for r in records})


def source_legend(records: Iterable[CaseRecord]) -> str:
    """``modeled (h200, priced as Qwen3-8B)``, or ``1 = modeled (h200), 2 = nvml (H200)`` when the
    rows' sources differ (the default table's source column holds those numbers)."""
    sources = _sources(records)
    if len(sources) == 1:
        return sources[0]
    return ", ".join(f"{i} = {source}" for i, source in enumerate(sources, 1))


def render_table(records: Iterable[CaseRecord], verbose: bool = False, width: int = WIDTH) -> str:
    """The summary table in tabulate's ``simple`` layout: the :data:`COMPACT` columns in at most
    ``width`` columns (``verbose``: every column), a verdict column when the gate compared anything,
    and by default a source column only when the rows' sources differ, holding each one's number in
    the header line (:func:`source_legend`); flags that do not fit are footnoted, never cut."""
    records = list(records)
    gated = any(r.verdict for r in records)
    numbers = {source: str(i) for i, source in enumerate(_sources(records), 1)}
    columns = [
        c
        for c in (HEADERS if verbose else COMPACT)
        if (c != "verdict" or gated) and (c != "source" or len(numbers) > 1 or verbose)
    ]
    # The test's own name: one case may be measured once and used by several tests.
    rows = [table_row(r, (r.nodeid or "").split("::")[-1] or None) for r in records]
    if not verbose:
        for row in rows:
            row["source"] = numbers[row["source"]]
    notes: list[str] = []
    if verbose:
        cells = [[r[c] for c in columns] for r in rows]
    else:
        cells, notes = _fit(columns, rows, width)
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = [columns, ["-" * w for w in widths], *cells]
    return "\n".join(
        [_GAP.join(text.ljust(w) for text, w in zip(line, widths)).rstrip() for line in lines]
        + notes
    )


def summary_report(
    document: RunDocument,
    suite: SuiteVerdict,
    written: Any,
    xdist_skipped: int,
    verbose: bool = False,
) -> SummaryReport:
    """The terminal summary of ``document``, the suite's verdicts and what was written (the
    session's :class:`~pytest_specenergy.outputs.Written`); ``verbose`` (``-v``) shows every column."""
    records = document.results
    pairs = len({(r.model, r.case_id, r.machine_key) for r in records})
    starts = f", {document.engine_starts} engine starts" if document.engine_starts else ""
    pools = sorted({r.pool or "the corpus's first 96" for r in records}, key=str)
    lines = [
        f"energy figures: {source_legend(records)}; {len(records)} results of {pairs} distinct "
        f"pairs{starts}; prompt pool per case: {', '.join(map(str, pools))}",
        render_table(records, verbose),
    ]
    lines += (
        []
        if verbose
        else [f"(-v shows every column: {', '.join(c for c in HEADERS if c not in COMPACT)})"]
    )
    lines += [VERDICT_LEGEND] if any(r.verdict for r in records) else []
    lines += [FLAGS_LEGEND] if any(r.checks for r in records) else []
    counts = verdict_counts(records)
    lines += [counts] if counts else []
    lines += [f"specenergy golden baseline written: {p}" for p in written.goldens]
    lines += [f"specenergy run saved: {p}" for p in written.saved]
    broken = [r.key for r in records if r.failed]
    if written.saved and broken:
        lines.append(
            f"{len(broken)} saved case(s) failed their own checks and never serve as a baseline: "
            + ", ".join(broken)
        )
    lines += [f"specenergy JSON: {written.json}"] if written.json else []
    if document.interrupted:
        lines.append(
            "the session was interrupted: the saved run is marked so and never serves as a baseline"
        )
    failed = (
        (Section("specenergy outputs not written", (*written.failures, "exit status 1"), True),)
        if written.failures
        else ()
    )
    return SummaryReport(
        SummaryReport.of_nothing(xdist_skipped).sections
        + (Section("specenergy", tuple(lines)),)
        + suite.sections
        + failed
    )
