"""A Markdown summary of a run for a CI step summary (``$GITHUB_STEP_SUMMARY``) or a PR comment.

One header line with the counts, then one table: with a baseline, per case the baseline,
current value and change of the key metrics, regressions first; without one, the current
figures. Every row names its source (``modeled (h200)`` / ``measured (nvml)``), because a
modeled number must never be read as a measured one. Strings from the run are escaped so a
case id or model name cannot break the table or inject markup/HTML into the comment.
"""

from __future__ import annotations

import re
from typing import Sequence

from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.report.format import fmt
from pytest_specenergy.report.rows import rows_from_document
from pytest_specenergy.report.rows import sources

#: The metrics a Markdown comparison shows, with their column titles.
MARKDOWN_METRICS: tuple[tuple[str, str], ...] = (
    ("energy_ratio", "energy ratio (spec/baseline)"), ("energy_per_token", "J/token"),
    ("energy_saving", "energy saving"),
    ("accept_length", "accept length"), ("tbt_ms", "TBT (ms)"))
_STATUS_TEXT = {Verdict.REGRESSED: "**REGRESSED**", Verdict.PASSED: "ok"}
# Characters that Markdown (GitHub flavour) would treat as markup inside a table cell.
_MARKUP = re.compile(r"([\\`*_\[\]|~])")


def md_escape(value: object) -> str:
    """Escape a run string for a GFM table cell: HTML entities for ``& < >``, a backslash
    before markup characters and ``|``, and newlines flattened (a cell is one line)."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"[\r\n]+", " ", text)
    return _MARKUP.sub(r"\\\1", text)


def _source(run: RunDocument) -> dict[str, str]:
    """Per case id (and nodeid), the source label of its row in ``run``."""
    labels = {}
    for row in rows_from_document(run):
        label = md_escape(row.source) if row.source == row.baseline_source else \
            f"{md_escape(row.baseline_source)} / {md_escape(row.source)}"
        labels[row.case_id] = label
        labels[row.record.key] = label  # type: ignore[union-attr]
    return labels


def _header(run: RunDocument, extra: str = "") -> str:
    rows = rows_from_document(run)
    failed = sum(1 for r in rows if r.failed)
    warned = sum(1 for r in rows if r.tripped and not r.failed)
    labels = ", ".join(md_escape(s) for s in sources(rows)) or "no data"
    return (f"**specenergy**: {len(rows)} cases, {failed} with failed checks, "
            f"{warned} with warnings{extra} \u00b7 sources: {labels}")


def _comparison(run: RunDocument, comparisons: Sequence[CaseComparison]) -> str:
    regressed = sum(1 for c in comparisons if c.verdict is Verdict.REGRESSED)
    metrics = [m for m, _ in MARKDOWN_METRICS
               if any(r.metric == m for c in comparisons for r in c.rows)] or \
        list(dict.fromkeys(r.metric for c in comparisons for r in c.rows))
    titles = dict(MARKDOWN_METRICS)
    labels = _source(run)
    lines = [_header(run, f" \u00b7 **{regressed} regressed** of {len(comparisons)} vs baseline"), "",
             "| verdict | case | " + " | ".join(f"{titles.get(m, m)} (baseline \u2192 current, change)"
                                                   for m in metrics) + " | source |",
             "|---|---|" + "---|" * len(metrics) + "---|"]
    for c in sorted(comparisons, key=lambda c: (c.verdict.rank, c.case_id)):
        by_metric = {r.metric: r for r in c.rows}
        cells = []
        for metric in metrics:
            row = by_metric.get(metric)
            if row is None:
                cells.append("n/a")
                continue
            mark = " **worse**" if row.verdict is Verdict.REGRESSED else ""
            cells.append(f"{fmt(metric, row.baseline)} \u2192 {fmt(metric, row.current)} "
                         f"({row.change_text()}){mark}")
        status = _STATUS_TEXT.get(c.verdict, md_escape(c.verdict.value))
        lines.append(f"| {status} | {md_escape(c.case_id)} | " + " | ".join(cells)
                     + f" | {labels.get(c.case_id, '-')} |")
    limits = sorted({r.limit.expr for c in comparisons for r in c.rows})
    lines += ["", f"The gate's verdicts (limits {md_escape(', '.join(limits) or 'none')}): a metric "
              "regresses only when its change's confidence interval lies beyond its limit "
              "(the sequential rule; energy on the within-session ratio)."]
    return "\n".join(lines) + "\n"


def _current(run: RunDocument) -> str:
    lines = [_header(run), "",
             "| case | baseline J/token | spec J/token | energy saving | accept length | "
             "TBT (ms) baseline \u2192 spec | checks | source |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows_from_document(run):
        checks = ", ".join(md_escape(f"{c.severity}: {c.name}") for c in r.checks) or "ok"
        source = md_escape(r.source) if r.source == r.baseline_source else \
            f"{md_escape(r.baseline_source)} / {md_escape(r.source)}"
        lines.append(f"| {md_escape(r.case_id)}"
                     f" | {fmt('energy_per_token', r.baseline_energy_per_token)}"
                     f" | {fmt('energy_per_token', r.energy_per_token)}"
                     f" | {fmt('energy_saving', r.energy_saving)}"
                     f" | {fmt('accept_length', r.accept_length)}"
                     f" | {fmt('tbt_ms', r.baseline_tbt_ms)} \u2192 {fmt('tbt_ms', r.tbt_ms)}"
                     f" | {checks} | {source} |")
    return "\n".join(lines) + "\n"


def render_markdown(run: RunDocument,
                    comparisons: Sequence[CaseComparison] | None = None) -> str:
    """Markdown for a CI summary or PR comment: the gate's comparison table when
    ``comparisons`` are given (regressions first), else the current table."""
    if comparisons is None:
        return _current(run)
    return _comparison(run, comparisons)
