"""A single self-contained HTML report of a run: inline CSS, inline SVG figures, no scripts (the
page's layout and why every run string goes through :func:`_e`:
``docs/report.md``)."""

from __future__ import annotations

import html
import json
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Sequence

import pytest_specenergy.report.plots as _plots
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.history import DEFAULT_STEP
from pytest_specenergy.gate.history import detect_steps
from pytest_specenergy.gate.history import history_series
from pytest_specenergy.gate.latency import latency_choices
from pytest_specenergy.gate.verdict import WORST_FIRST
from pytest_specenergy.gate.verdict import Verdict
from pytest_specenergy.metrics import METRICS
from pytest_specenergy.metrics import fmt
from pytest_specenergy.metrics import show
from pytest_specenergy.report.rows import intensity
from pytest_specenergy.report.rows import notices
from pytest_specenergy.report.rows import sources

DEFAULT_TITLE = "pytest-specenergy report"
TABLES_ONLY_NOTE = (
    "Figures are not shown: matplotlib is not installed "
    "(pip install 'pytest-specenergy[report]'); tables only."
)
PLOTS_OFF_NOTE = "Figures are turned off for this report; tables only."
_WORSE_ARROW = {"up": "\u2191", "down": "\u2193"}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1b1b1b;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#555;margin-bottom:16px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #d6d6d6;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f4f6;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.fail td{background:#fdecec}tr.warn td{background:#fff7e0}
tr.regressed td{background:#fff4f4}td.regressed,tr.regressed td.regressed{background:#f8c9c9}
td.improved{background:#d9f0d9}td:first-child{white-space:nowrap}
.badge{display:inline-block;border-radius:3px;padding:0 5px;margin:1px;font-size:12px;white-space:nowrap}
.b-fail{background:#b3261e;color:#fff}.b-warn{background:#f0ad00;color:#000}
.b-src{background:#e6eefc;color:#123}.b-ok{background:#1e7d34;color:#fff}
.b-regressed{background:#b3261e;color:#fff}.b-improved{background:#1e7d34;color:#fff}
.b-other{background:#ddd;color:#000}
.note{background:#fff7e0;border:1px solid #f0d080;padding:6px 10px;margin:8px 0}
.notice{background:#fde8e8;border:1px solid #e08080;padding:6px 10px;margin:8px 0;font-weight:bold}
.scroll{overflow-x:auto;max-width:100%}.scroll table{margin:0}
.verdict{font-size:16px;margin:8px 0 4px}.verdict .badge{font-size:14px;padding:1px 8px}
details{margin:8px 0}summary{cursor:pointer;color:#333}
figure{margin:12px 0 20px}figcaption{color:#555;font-size:13px}
svg{max-width:100%;height:auto}
code{font-size:12px}
"""


def _e(value: object) -> str:
    """Escape any run string for HTML text and double-quoted attributes."""
    return html.escape(str(value), quote=True)


def _badge(text: object, kind: str, title: object = "") -> str:
    tip = f' title="{_e(title)}"' if title else ""
    return f'<span class="badge b-{_e(kind)}"{tip}>{_e(text)}</span>'


def _table(headers: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]]) -> str:
    """``rows`` are (row class, already-escaped cells); numeric cells are marked by the caller."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(f'<tr class="{_e(cls)}">' + "".join(cells) + "</tr>" for cls, cells in rows)
    # A wide table scrolls inside its box instead of overflowing the page.
    return (
        "<div "
        f'class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def _td(value: object) -> str:
    return f"<td>{_e(value)}</td>"


def _num(metric: str, value: float | int | None) -> str:
    return f'<td class="num">{_e(show(metric, value))}</td>'


def _verdict(
    rows: Sequence[CaseRecord], comparisons: Sequence[CaseComparison] | None, baseline_label: str
) -> str:
    """The page's first lines: how many cases regressed, stayed inconclusive, were unchanged (every
    gate verdict, worst first), and how many tripped a check."""
    fails = sum(1 for r in rows if r.failed)
    checks = (
        f"{fails} case(s) with a failed validity check" if fails else "no failed validity check"
    ) + f", {sum(1 for r in rows if r.checks and not r.failed)} with a warning only"
    if comparisons is None:
        return (
            f'<p class="verdict">{len(rows)} cases, not compared with a baseline; {_e(checks)}.</p>'
        )
    counts = {v: sum(1 for c in comparisons if c.verdict is v) for v in WORST_FIRST}
    shown = (Verdict.REGRESSED, Verdict.INCONCLUSIVE, Verdict.PASSED)
    badges = " ".join(
        _badge(f"{n} {v.label}", _status_kind(v) if n else "other")
        for v, n in counts.items()
        if n or v in shown
    )
    return (
        f'<p class="verdict">{badges}</p><p>{len(comparisons)} cases against '
        f"{_e(baseline_label or 'the baseline run')}; {_e(checks)}.</p>"
    )


def _summary(
    run: RunDocument, rows: Sequence[CaseRecord], comparisons: Sequence[CaseComparison] | None
) -> str:
    facts = [
        ("cases", str(len(rows))),
        ("models", ", ".join(sorted({r.model for r in rows}))),
        ("drafters", ", ".join(sorted({r.drafter_id for r in rows}))),
        (
            "batches",
            ", ".join(str(b) for b in sorted({r.batch for r in rows if r.batch is not None})),
        ),
        ("corpora", ", ".join(sorted({r.corpus_name for r in rows}))),
        ("cases with a failed check", str(sum(1 for r in rows if r.failed))),
        ("cases with a warning only", str(sum(1 for r in rows if r.checks and not r.failed))),
        ("engine starts", str(run.engine_starts)),
        ("plugin version", run.plugin_version),
        ("run at", run.datetime or "n/a"),
        (
            "commit",
            f"{str(run.commit.sha)[:12]}{' (dirty)' if run.commit.dirty else ''}"
            if run.commit
            else "n/a",
        ),
    ]
    if comparisons is not None:
        regressed = sum(1 for c in comparisons if c.verdict is Verdict.REGRESSED)
        facts.append(("regressions vs baseline", f"{regressed} of {len(comparisons)} cases"))
    return (
        _table(["", ""], (("", [f"<th>{_e(k)}</th>", _td(v)]) for k, v in facts))
        + "<p>Sources: "
        + " ".join(_badge(s, "src") for s in sources(rows))
        + "</p>"
    )


def _raw(run: RunDocument) -> str:
    """The machine and meter descriptions, folded: raw JSON that few readers need."""
    parts = (
        ("Machine", ["key", "value"], run.machine_info.as_dict()),
        ("Meters", ["meter", "description"], {k: m.as_dict() for k, m in run.meters.items()}),
    )
    out = [
        f"<details><summary>{title}</summary>"
        + _table(headers, (("", [_td(k), _td(_plain(v))]) for k, v in described.items()))
        + "</details>"
        for title, headers, described in parts
        if described
    ]
    return "".join(out) or "<p>No machine or meter description in this run.</p>"


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _figures(
    rows: Sequence[CaseRecord], history: Sequence[RunDocument], targets: Sequence[float]
) -> str:
    figs: list[tuple[str, Callable[[], str]]] = [
        (
            "Energy per token vs batch: one line per drafter, the dashed line is the "
            "non-speculative baseline.",
            lambda: _plots.energy_vs_batch_svg(rows),
        ),
        (
            "Energy saving vs batch: above the break-even line speculation saves energy, below "
            "it costs energy.",
            lambda: _plots.saving_vs_batch_svg(rows),
        ),
        ("Accept length by corpus per drafter.", lambda: _plots.accept_length_svg(rows)),
        (
            "Time between tokens vs energy per token; vertical lines are latency targets, the "
            "ringed point is the lowest-energy configuration meeting each.",
            lambda: _plots.latency_svg(rows, targets),
        ),
    ]
    if len(history) >= 2:
        figs.append(
            (
                "History of key metrics across stored runs; triangles mark detected steps.",
                lambda: _plots.history_svg(history),
            )
        )
    if not rows:
        return '<p class="note">No results in this run: nothing to draw.</p>'
    out = []
    for caption, make in figs:
        try:
            out.append(f"<figure>{make()}<figcaption>{_e(caption)}</figcaption></figure>")
        except Exception as exc:  # a figure must never cost the user the tables
            out.append(
                f'<p class="note">Figure not drawn ({_e(caption)}): {_e(type(exc).__name__)}: '
                f"{_e(exc)}</p>"
            )
    return "".join(out)


def _latency_table(rows: Sequence[CaseRecord], targets: Sequence[float]) -> str:
    body = []
    for c in latency_choices(rows, targets):
        p = c.choice
        cells = [_td(c.model), _td(c.corpus), _td(f"{c.target_ms:g} ms")]
        if p is None:
            cells += [_td("no configuration meets it"), _td(""), _td(""), _td("")]
        else:
            cells += [
                _td(p.label),
                _num("energy_per_token", p.energy_per_token),
                _num("tbt_ms", p.tbt_ms),
                "<td>" + _badge(p.source, "src") + "</td>",
            ]
        body.append(("", cells))
    return _table(
        [
            "model",
            "corpus",
            "TBT target",
            "lowest-energy configuration",
            "J/token",
            "TBT (ms)",
            "source",
        ],
        body,
    )


_CASE_HEADERS = [
    "case",
    "model",
    "drafter",
    "batch",
    "corpus",
    "source",
    "baseline J/token",
    "spec J/token",
    "energy saving",
    "accept length",
    "acceptance rate",
    "verified/step",
    "verify FLOP/byte (balance point)",
    "draft share",
    "baseline TBT (ms)",
    "spec TBT (ms)",
    "speedup",
    "exact match",
    "logprob gap",
    "checks",
]


def _case_table(rows: Sequence[CaseRecord]) -> str:
    body = []
    for r in rows:
        cells = [
            _td(r.case_id),
            _td(r.model),
            f'<td title="{_e(r.drafter_name)}">{_e(r.drafter_id)}</td>',
            _num("batch", r.batch),
            _td(r.corpus_name),
            "<td>" + _badge(r.source, "src") + "</td>",
            _num("energy_per_token", r.baseline.energy_per_token),
            _num("energy_per_token", r.energy_per_token),
            _num("energy_saving", r.energy_saving),
            _num("accept_length", r.accept_length),
            _num("acceptance_rate", r.acceptance_rate),
            _num("verified_per_step", r.verified_per_step),
            '<td class="num">' + _e(intensity(r)) + "</td>",
            f'<td class="num" title="{_e(r.draft_share_method or "not measured")}">'
            + _e(fmt(r.draft_share, ".0%"))
            + "</td>",
            _num("tbt_ms", r.baseline.tbt_ms),
            _num("tbt_ms", r.tbt_ms),
            _num("speedup", r.speedup),
            _num("exact_fraction", r.exact_fraction),
            _num("logprob_gap", r.logprob_gap),
            "<td>"
            + (
                "".join(_badge(c.name, c.severity, c.message) for c in r.checks)
                or _badge("ok", "ok")
            )
            + "</td>",
        ]
        body.append(("fail" if r.failed else "warn" if r.checks else "", cells))
    return _table(_CASE_HEADERS, body)


def _status_kind(verdict: Verdict) -> str:
    return verdict.value if verdict in (Verdict.REGRESSED, Verdict.IMPROVED) else "other"


def _comparison_table(comparisons: Sequence[CaseComparison]) -> str:
    """One row per case with the gate's own verdict; each metric cell is ``baseline -> current``
    over the change, shaded by that metric's verdict, with the p-value and method in its tooltip."""
    metrics = list(dict.fromkeys(r.metric for c in comparisons for r in c.rows))
    body = []
    for c in sorted(comparisons, key=lambda c: (c.verdict.rank, c.case_id)):
        cells = [
            _td(c.case_id),
            f"<td>{_badge(c.verdict.word, _status_kind(c.verdict))}</td>",
            _td("; ".join(c.reasons) or "-"),
        ]
        by_metric = {r.metric: r for r in c.rows}
        for metric in metrics:
            row = by_metric.get(metric)
            if row is None:
                cells.append(_td("n/a"))
                continue
            cells.append(
                f'<td class="num {_e(row.verdict.value)}" title="{_e(row.describe())}">'
                f"{_e(show(metric, row.baseline))} &rarr; {_e(show(metric, row.current))}"
                f"<br><b>{_e(row.change_text())}</b></td>"
            )
        body.append(
            (c.verdict.value if c.verdict in (Verdict.REGRESSED, Verdict.IMPROVED) else "", cells)
        )
    headers = ["case", "verdict", "why not compared"] + [
        f"{m} ({_WORSE_ARROW.get(METRICS[m].worse if m in METRICS else '-', '')} worse)"
        for m in metrics
    ]
    return _table(headers, body)


def _history_steps(history: Sequence[RunDocument], threshold: float) -> str:
    body = []
    for metric, _label, relative in _plots.HISTORY_METRICS:
        for case_id, values in history_series(history, metric).items():
            for s in detect_steps(values, threshold, relative=relative):
                when = history[s.index].datetime or f"run {s.index}"
                change = f"{s.change:+.1%}" if relative else f"{s.change * 100:+.1f} pts"
                body.append(
                    (
                        "",
                        [
                            _td(case_id),
                            _td(metric),
                            _td(when),
                            _num(metric, s.before),
                            _num(metric, s.after),
                            f'<td class="num">{_e(change)}</td>',
                        ],
                    )
                )
    if not body:
        # Not a contradiction of a REGRESSED verdict above: the gate compares this run with its
        # baseline; a history step is a level that held over several stored runs.
        return (
            f"<p>No lasting step of {threshold:.0%} or more across {len(history)} stored runs "
            "(a step is a change that holds over several runs; the verdicts above compare this "
            "run with its baseline).</p>"
        )
    return _table(
        ["case", "metric", "first run at new level", "before (median)", "after (median)", "change"],
        body,
    )


def _checks_detail(rows: Sequence[CaseRecord]) -> str:
    body = [
        (
            "fail" if c.severity == "fail" else "warn",
            [
                _td(r.case_id),
                "<td>" + _badge(c.severity, c.severity) + "</td>",
                _td(c.name),
                _td(c.message),
                "<td>" + _badge(r.source, "src") + "</td>",
            ],
        )
        for r in rows
        for c in r.checks
    ]
    if not body:
        return "<p>No validity check tripped.</p>"
    return _table(["case", "severity", "check", "message", "source"], body)


def render_html(
    run: RunDocument,
    comparisons: Sequence[CaseComparison] | None = None,
    history: Sequence[RunDocument] = (),
    latency_targets_ms: Sequence[float] = (25.0, 10.0),
    title: str = DEFAULT_TITLE,
    plots: bool | None = None,
    baseline_label: str = "",
    step: float = DEFAULT_STEP,
) -> str:
    """One self-contained HTML page for ``run``. ``comparisons``: the gate's (the report never
    compares on its own); ``history``: stored runs, oldest first (``run`` is appended unless already
    last); ``plots``: None draws figures when matplotlib is installed, False never; ``step``:
    smallest history step shown."""
    rows = run.results
    hist = list(history)
    if hist and hist[-1] != run:
        hist.append(run)
    draw = _plots.plots_available() if plots is None else plots and _plots.plots_available()
    # The verdict first (counts, then the comparison table), then the cases, then figures and the
    # rest; raw machine and meter descriptions last, folded.
    parts = [
        f"<h1>{_e(title)}</h1>",
        f'<div class="sub">{len(rows)} cases &middot; '
        + " ".join(_badge(s, "src") for s in sources(rows))
        + "</div>",
        *(f'<p class="notice">{_e(line)}</p>' for line in notices(run)),
        _verdict(rows, comparisons, baseline_label),
    ]
    if comparisons is not None:
        limits = sorted({r.limit.expr for c in comparisons for r in c.rows})
        parts += [
            "<h2>Baseline comparison</h2><p>The gate's verdicts against "
            f"{_e(baseline_label or 'the baseline run')}: limits "
            f"{_e(', '.join(limits) or 'none')}; a metric regresses only when its change's "
            "confidence interval lies beyond its limit (the sequential rule; energy on the "
            "within-session ratio). Regressions first.</p>",
            _comparison_table(comparisons),
        ]
    parts += [
        "<h2>Cases</h2>",
        _case_table(rows),
        "<h2>Checks</h2>",
        _checks_detail(rows),
        "<h2>Figures</h2>",
    ]
    if draw:
        parts.append(_figures(rows, hist, latency_targets_ms))
    else:
        note = PLOTS_OFF_NOTE if plots is False else TABLES_ONLY_NOTE
        parts.append(f'<p class="note">{_e(note)}</p>')
    parts += ["<h2>Latency targets</h2>", _latency_table(rows, latency_targets_ms)]
    if len(hist) >= 2:
        parts += ["<h2>History</h2>", _history_steps(hist, step)]
    parts += [
        "<h2>Run details</h2>",
        _summary(run, rows, comparisons),
        "<h2>Machine and meters</h2>",
        _raw(run),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )
