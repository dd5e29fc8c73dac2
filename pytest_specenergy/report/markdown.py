"""A Markdown summary of a run for a CI step summary (``$GITHUB_STEP_SUMMARY``) or a PR comment.

One header line with the counts, then one table: with a baseline, per case the baseline,
current value and change of the key metrics, regressions first; without one, the current
figures. Every row names its source (``modeled (h200)`` / ``measured (nvml)``), because a
modeled number must never be read as a measured one. Strings from the run are escaped so a
case id or model name cannot break the table or inject markup/HTML into the comment.
"""

from __future__ import annotations

import re
from typing import Any
from typing import Mapping

from pytest_specenergy.report.model import DEFAULT_THRESHOLD
from pytest_specenergy.report.model import CaseDelta
from pytest_specenergy.report.model import compare_documents
from pytest_specenergy.report.model import fmt
from pytest_specenergy.report.model import fmt_change
from pytest_specenergy.report.model import rows_from_document
from pytest_specenergy.report.model import sources

#: The metrics a Markdown comparison shows, with their column titles.
MARKDOWN_METRICS: tuple[tuple[str, str], ...] = (
    ("energy_per_token", "J/token"), ("energy_saving", "energy saving"),
    ("accept_length", "accept length"), ("tbt_ms", "TBT (ms)"))
_STATUS_TEXT = {"regressed": "**REGRESSED**", "improved": "improved", "unchanged": "ok",
                "new": "new", "missing": "missing", "n/a": "n/a"}
# Characters that Markdown (GitHub flavour) would treat as markup inside a table cell.
_MARKUP = re.compile(r"([\\`*_\[\]|~])")


def md_escape(value: object) -> str:
    """Escape a run string for a GFM table cell: HTML entities for ``& < >``, a backslash
    before markup characters and ``|``, and newlines flattened (a cell is one line)."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = re.sub(r"[\r\n]+", " ", text)
    return _MARKUP.sub(r"\\\1", text)


def _source(delta: CaseDelta) -> str:
    if delta.baseline_source and delta.source and delta.baseline_source != delta.source:
        return f"{md_escape(delta.baseline_source)} \u2192 {md_escape(delta.source)}"
    return md_escape(delta.source or delta.baseline_source)


def _header(run: Mapping[str, Any], extra: str = "") -> str:
    rows = rows_from_document(run)
    failed = sum(1 for r in rows if r.failed)
    warned = sum(1 for r in rows if r.tripped and not r.failed)
    labels = ", ".join(md_escape(s) for s in sources(rows)) or "no data"
    return (f"**specenergy**: {len(rows)} cases, {failed} with failed checks, "
            f"{warned} with warnings{extra} \u00b7 sources: {labels}")


def _comparison(run: Mapping[str, Any], baseline: Mapping[str, Any], threshold: float) -> str:
    deltas = compare_documents(run, baseline, threshold, [m for m, _ in MARKDOWN_METRICS])
    regressed = sum(1 for d in deltas if d.regressed)
    lines = [_header(run, f" \u00b7 **{regressed} regressed** of {len(deltas)} vs baseline"), "",
             "| status | case | " + " | ".join(f"{t} (baseline \u2192 current, change)"
                                                  for _, t in MARKDOWN_METRICS) + " | source |",
             "|---|---|" + "---|" * len(MARKDOWN_METRICS) + "---|"]
    for d in deltas:
        cells = []
        for metric, _ in MARKDOWN_METRICS:
            c = d.change(metric)
            if c is None:
                cells.append("n/a")
                continue
            mark = " **worse**" if c.status == "regressed" else ""
            cells.append(f"{fmt(metric, c.baseline)} \u2192 {fmt(metric, c.current)} "
                         f"({fmt_change(c)}){mark}")
        status = _STATUS_TEXT.get(d.status, md_escape(d.status))
        lines.append(f"| {status} | {md_escape(d.case_id)} | " + " | ".join(cells)
                     + f" | {_source(d)} |")
    lines += ["", f"Threshold {threshold:.0%} (percentage points for energy saving) unless the "
              "gate stored a verdict; energy and TBT are worse up, saving and accept length "
              "worse down."]
    return "\n".join(lines) + "\n"


def _current(run: Mapping[str, Any]) -> str:
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


def render_markdown(run: Mapping[str, Any], baseline: Mapping[str, Any] | None = None,
                    threshold: float = DEFAULT_THRESHOLD) -> str:
    """Markdown for a CI summary or PR comment: the comparison table when ``baseline`` is a
    run document (regressions first), else the current table."""
    if baseline is None:
        return _current(run)
    return _comparison(run, baseline, threshold)
