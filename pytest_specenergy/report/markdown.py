"""A Markdown summary of a run for a CI step summary (``$GITHUB_STEP_SUMMARY``) or a PR comment
(what it shows, and why run strings are escaped: ``docs/report.md``)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.verdict import WORST_FIRST
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.metrics import show
from pytest_specenergy.report.rows import notices
from pytest_specenergy.report.rows import sources

#: The metrics a Markdown comparison shows, with their column titles.
MARKDOWN_METRICS: tuple[tuple[str, str], ...] = (
    ("energy_ratio", "energy ratio (spec/baseline)"),
    ("energy_per_token", "J/token"),
    ("energy_saving", "energy saving"),
    ("accept_length", "accept length"),
    ("tbt_ms", "TBT (ms)"),
)
_STATUS_TEXT = {Verdict.REGRESSED: "**REGRESSED**"}
# Characters that Markdown (GitHub flavour) would treat as markup inside a table cell.
_MARKUP = re.compile(r"([\\`*_\[\]|~])")


def md_escape(value: object) -> str:
    """Escape a run string for a GFM table cell: HTML entities for ``& < >``, a backslash before
    markup characters and ``|``, and newlines flattened (a cell is one line)."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"[\r\n]+", " ", text)
    return _MARKUP.sub(r"\\\1", text)


#: At most this many case rows: a PR comment or job summary is read, not searched (the HTML report
#: has every case).
MAX_ROWS = 15


def _source(row: CaseRecord, single: bool) -> str:
    if single:
        return ""
    label = (
        md_escape(row.source)
        if row.source == row.baseline.source
        else f"{md_escape(row.baseline.source)} / {md_escape(row.source)}"
    )
    return f" {label} |"


def _header(run: RunDocument, extra: str = "") -> str:
    rows = run.results
    failed = sum(1 for r in rows if r.failed)
    warned = sum(1 for r in rows if r.checks and not r.failed)
    labels = ", ".join(md_escape(s) for s in sources(rows)) or "no data"
    return (
        f"**specenergy**: {len(rows)} cases{extra} \u00b7 {failed} with failed checks, "
        f"{warned} with warnings \u00b7 energy figures: {labels}"
    )


def _more(shown: int, total: int, what: str) -> list[str]:
    return (
        ["", f"\u2026 and {total - shown} more {what} (the HTML report lists every case)."]
        if total > shown
        else []
    )


def _comparison(run: RunDocument, comparisons: Sequence[CaseComparison]) -> str:
    counts = Counter(c.verdict for c in comparisons)
    verdicts = " \u00b7 ".join(
        (
            f"**{counts[v]} {v.label}**"
            if v is Verdict.REGRESSED and counts[v]
            else f"{counts[v]} {v.label}"
        )
        for v in WORST_FIRST
    )
    present = list(dict.fromkeys(r.metric for c in comparisons for r in c.rows))
    metrics = [m for m, _ in MARKDOWN_METRICS if m in present] or present
    titles = dict(MARKDOWN_METRICS)
    run_rows = run.results
    by_case = {**{r.case_id: r for r in run_rows}, **{r.key: r for r in run_rows}}
    single = len(sources(run_rows)) <= 1
    # Unchanged cases are counted in the header, not listed: the table is what needs a look.
    listed = sorted(
        (c for c in comparisons if c.verdict is not Verdict.PASSED),
        key=lambda c: (c.verdict.rank, c.case_id),
    )
    lines = [_header(run, f" \u00b7 {verdicts}"), ""]
    if listed:
        lines += [
            "| verdict | case | "
            + " | ".join(f"{titles.get(m, m)} (baseline \u2192 current, change)" for m in metrics)
            + " |"
            + ("" if single else " source |"),
            "|---|---|" + "---|" * len(metrics) + ("" if single else "---|"),
        ]
    for c in listed[:MAX_ROWS]:
        by_metric = {r.metric: r for r in c.rows}
        cells = []
        for metric in metrics:
            row = by_metric.get(metric)
            if row is None:
                cells.append("n/a")
                continue
            mark = " **worse**" if row.verdict is Verdict.REGRESSED else ""
            cells.append(
                f"{show(metric, row.baseline)} \u2192 {show(metric, row.current)} "
                f"({row.change_text()}){mark}"
            )
        status = _STATUS_TEXT.get(c.verdict, md_escape(c.verdict.word))
        shown = by_case.get(c.case_id)
        source = _source(shown, single) if shown is not None else ("" if single else " - |")
        blocked = " (blocked order)" if shown is not None and not shown.interleaved else ""
        lines.append(
            f"| {status} | {md_escape(c.case_id)}{blocked} | " + " | ".join(cells) + " |" + source
        )
    lines += _more(min(len(listed), MAX_ROWS), len(listed), "changed cases")
    limits = sorted({r.limit.expr for c in comparisons for r in c.rows})
    lines += [
        "",
        f"The gate's verdicts (limits {md_escape(', '.join(limits) or 'none')}): a metric "
        "regresses only when its change's confidence interval lies beyond its limit (the "
        "sequential rule; energy on the within-session ratio).",
    ]
    if any(not r.interleaved for r in run_rows):
        lines += [
            "",
            "Cases marked *blocked order* ran one engine at a time on one GPU (every baseline "
            "repeat, then every speculative one): they are judged with a block drift allowance "
            "per blocked run (the verdict's note states it), so a change must clear the limit by "
            "that much more.",
        ]
    return "\n".join(lines) + "\n"


def _current(run: RunDocument) -> str:
    rows = run.results
    single = len(sources(rows)) <= 1
    lines = [
        _header(run),
        "",
        "| case | baseline J/token | spec J/token | energy saving | accept length | "
        "TBT (ms) baseline \u2192 spec | checks |" + ("" if single else " source |"),
        "|---|---|---|---|---|---|---|" + ("" if single else "---|"),
    ]
    # Cases with a tripped check first: they are what needs a look.
    for r in sorted(rows, key=lambda r: (not r.failed, not r.checks))[:MAX_ROWS]:
        checks = ", ".join(md_escape(f"{c.severity}: {c.name}") for c in r.checks) or "ok"
        cells = [
            md_escape(r.case_id),
            show("energy_per_token", r.baseline.energy_per_token),
            show("energy_per_token", r.energy_per_token),
            show("energy_saving", r.energy_saving),
            show("accept_length", r.accept_length),
            f"{show('tbt_ms', r.baseline.tbt_ms)} \u2192 {show('tbt_ms', r.tbt_ms)}",
            checks,
        ]
        lines.append("| " + " | ".join(cells) + " |" + _source(r, single))
    lines += _more(min(len(rows), MAX_ROWS), len(rows), "cases")
    return "\n".join(lines) + "\n"


def render_markdown(run: RunDocument, comparisons: Sequence[CaseComparison] | None = None) -> str:
    """Markdown for a CI summary or PR comment: the gate's comparison table when ``comparisons`` are
    given (regressions first), else the current table; an interrupted run and the baseline cases
    it did not measure are said first."""
    body = _current(run) if comparisons is None else _comparison(run, comparisons)
    said = [f"> **{md_escape(line)}**" for line in notices(run)]
    return "\n\n".join(said + [body]) if said else body
