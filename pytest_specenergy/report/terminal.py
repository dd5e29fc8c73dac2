"""The terminal summary: one row per test that measured a pair, every energy figure labelled
with its source, and the gate's verdict line when a baseline was compared."""

from __future__ import annotations

from collections import Counter
from typing import Any
from typing import Iterable
from typing import Mapping

from tabulate import tabulate

from pytest_specenergy.gate.compare import Verdict
from pytest_specenergy.report.rows import ReportRow
from pytest_specenergy.report.rows import row_from_result

HEADERS = ("test", "source", "base J/tok", "spec J/tok", "saving", "accept len", "accept rate",
           "verified/step", "verify FLOP/B", "draft share", "base tbt ms", "spec tbt ms", "speedup", "exact",
           "logprob gap", "flags")


def _num(value: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else format(value, spec) + suffix


def _intensity(row: ReportRow) -> str:
    """``142/163`` (verify step's FLOP/byte over the GPU's balance point), ``!`` past it."""
    if row.verify_intensity is None:
        return "n/a"
    balance = f"/{row.balance_point:.0f}" if row.balance_point is not None else ""
    return f"{'!' if row.compute_bound else ''}{row.verify_intensity:.0f}{balance}"


def table_row(row: ReportRow, label: str | None = None) -> list[str]:
    """One table row (``!`` marks a fail-closed check)."""
    flags = ", ".join(("!" if c.severity == "fail" else "") + c.name for c in row.checks)
    return [label or row.case_id, row.source, _num(row.baseline_energy_per_token, ".4g"),
            _num(row.energy_per_token, ".4g"), _num(row.energy_saving, "+.1%"),
            _num(row.accept_length, ".2f"), _num(row.acceptance_rate, ".2f"),
            _num(row.verified_per_step, "d"), _intensity(row), _num(row.draft_share, ".0%"),
            _num(row.baseline_tbt_ms, ".3f"),
            _num(row.tbt_ms, ".3f"), _num(row.speedup, ".2f", "x"), _num(row.exact_fraction, ".0%"),
            _num(row.logprob_gap, ".3f"), flags or "-"]


def render_table(records: Iterable[Mapping[str, Any]]) -> str:
    """The summary table; a verdict column appears when the gate compared anything."""
    records = list(records)
    gated = any(r.get("verdict") for r in records)
    rows = []
    for record in records:
        # The test's own name: one case may be measured once and used by several tests.
        nodeid = str(record.get("nodeid") or "")
        row = table_row(row_from_result(record), nodeid.split("::")[-1] or None)
        if gated:
            verdict = record.get("verdict")
            row.append(f"{Verdict(verdict).mark} {verdict}" if verdict else "-")
        rows.append(row)
    headers = list(HEADERS) + (["verdict"] if gated else [])
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def verdict_line(records: Iterable[Mapping[str, Any]]) -> str | None:
    """``N regressed · M improved · K unchanged · I inconclusive ...`` or None."""
    counts = Counter(r.get("verdict") for r in records if r.get("verdict"))
    if not counts:
        return None
    order = [(Verdict.REGRESSED, "regressed"), (Verdict.IMPROVED, "improved"),
             (Verdict.PASSED, "unchanged"), (Verdict.INCONCLUSIVE, "inconclusive"),
             (Verdict.INCOMPARABLE, "incomparable"), (Verdict.NO_BASELINE, "without baseline")]
    return " · ".join(f"{counts.get(v.value, 0)} {label}" for v, label in order)


def summary_lines(records: list[Mapping[str, Any]], xdist_skipped: int, engine_starts: int,
                  unused_goldens: Iterable[Any], saved: Iterable[Any],
                  json_path: Any) -> list[tuple[str, str]]:
    """The terminal summary as ``(separator, text)`` pairs: a separator title (``"specenergy"``
    or ``"warning"``) opens a section, an empty one is a plain line."""
    lines: list[tuple[str, str]] = []
    if xdist_skipped:
        lines.append(("warning", "specenergy warning"))
        lines.append(("", f"{xdist_skipped} spec_pair tests were skipped: energy is not measured "
                          f"under pytest-xdist, because workers would share GPUs. Use "
                          f"--specenergy-xdist=per-gpu (one GPU per worker) or run without -n."))
    if not records:
        return lines
    lines.append(("specenergy", "specenergy"))
    lines.append(("", render_table(records)))
    sources = sorted({r["source"] for r in records})
    pairs = len({(r["case"]["model"], r["case_id"], r["machine_key"]) for r in records})
    starts = f", {engine_starts} engine starts" if engine_starts else ""
    lines.append(("", f"{len(records)} results of {pairs} distinct pairs{starts}; "
                      f"energy figures: {', '.join(sources)}"))
    verdicts = verdict_line(records)
    if verdicts:
        lines.append(("", verdicts))
    unused = [str(p) for p in unused_goldens]
    if unused:
        lines.append(("", f"{len(unused)} golden baseline(s) no test used: " + ", ".join(unused)))
    lines += [("", f"specenergy run saved: {path}") for path in saved]
    if json_path:
        lines.append(("", f"specenergy JSON: {json_path}"))
    return lines
