"""The report's figures as inline SVG strings, matplotlib being the optional ``report`` extra (lazy
matplotlib, bare ``Figure`` objects and deterministic output: ``docs/report.md``)."""

from __future__ import annotations

import importlib.util
import io
import re
import textwrap
from typing import Any
from typing import Callable
from typing import Sequence

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.history import detect_steps
from pytest_specenergy.gate.history import history_series
from pytest_specenergy.gate.latency import config_points
from pytest_specenergy.gate.latency import latency_choices
from pytest_specenergy.report.rows import sources

#: Colour of the non-speculative baseline; drafters take PALETTE in sorted-id order.
BASELINE_COLOR = "#222222"
PALETTE: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
TRIPPED_NOTE = "hollow = a validity check tripped"
HISTORY_METRICS: tuple[tuple[str, str, bool], ...] = (
    # (metric, axis label, relative step threshold?) - savings cross zero, so absolute points.
    ("energy_per_token", "J/token", True),
    ("energy_saving", "energy saving", False),
    ("accept_length", "accept length", True),
    ("tbt_ms", "TBT (ms)", True),
)
_RC = {
    "svg.hashsalt": "pytest-specenergy",
    "svg.fonttype": "none",
    "text.usetex": False,
    "font.size": 9,
    "axes.titlesize": 10,
    "legend.fontsize": 8,
}


def plots_available() -> bool:
    """True when matplotlib can be imported (without importing it here)."""
    return importlib.util.find_spec("matplotlib") is not None


def mpl_text(text: object) -> str:
    """A run string made safe for matplotlib: ``$`` would start mathtext (and an unbalanced one
    raises), and a leading ``_`` hides a legend entry."""
    s = str(text).replace("$", r"\$")
    return " " + s if s.startswith("_") else s


def _source_label(labels: Sequence[str]) -> str:
    return "[" + ", ".join(labels) + "]" if labels else "[no data]"


def drafter_colors(rows: Sequence[CaseRecord]) -> dict[str, str]:
    """A stable colour per drafter id, shared by every figure of a report."""
    ids = sorted({r.drafter_id for r in rows})
    return {d: PALETTE[i % len(PALETTE)] for i, d in enumerate(ids)}


def render_svg(draw: Callable[[Any], None], size: tuple[float, float], prefix: str) -> str:
    """Run ``draw(figure)`` on a fresh figure and return deterministic inline SVG: no XML prolog,
    metadata or comments, every id prefixed with ``prefix``."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=size, layout="constrained")
        draw(fig)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    # Comments repeat each text item; they are escaped, but nothing in them is needed.
    svg = re.sub(r"<!--.*?-->\s*", "", svg, flags=re.S)
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(
        r'(href="#|url\(#)([^")]+)',
        lambda m: m.group(1) + (f"{prefix}-{m.group(2)}" if m.group(2) in ids else m.group(2)),
        svg,
    )
    return svg.strip()


#: Characters of title text that fit in an inch (10-11 pt text averages about 6 pt a character): a
#: title longer than its figure or panel is wrapped, since constrained layout never shrinks it.
_TITLE_CHARS_PER_INCH = 10.0


def _wrap(text: str, inches: float) -> str:
    return textwrap.fill(
        text, width=max(12, int(inches * _TITLE_CHARS_PER_INCH)), break_long_words=False
    )


def _suptitle(fig: Any, title: str, label: str, rows: Sequence[CaseRecord] = ()) -> None:
    """The figure's title and source label, wrapped to the figure's width (a one-panel figure is
    narrow); the label moves to a line of its own whole rather than being split. Below, a note when
    any of ``rows`` tripped a check."""
    inches = fig.get_figwidth()
    whole = f"{title} {label}"
    fits = len(whole) <= max(12, int(inches * _TITLE_CHARS_PER_INCH))
    fig.suptitle(whole if fits else f"{_wrap(title, inches)}\n{label}")
    if any(r.checks for r in rows):
        fig.supxlabel(TRIPPED_NOTE, fontsize=8, color="#a33")  # short: fits the narrowest figure


def _panel_title(ax: Any, text: str, panels_across: int) -> None:
    """A panel's title, wrapped to the panel's width (about three quarters of its share)."""
    ax.set_title(_wrap(text, 0.75 * ax.figure.get_figwidth() / max(1, panels_across)))


def _grid(fig: Any, count: int, cols: int = 3) -> list[Any]:
    cols = max(1, min(cols, count))
    rows = -(-count // cols)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[count:]:
        ax.set_visible(False)
    return axes[:count]


def _size(count: int, cols: int = 3, w: float = 4.2, h: float = 3.1) -> tuple[float, float]:
    cols = max(1, min(cols, count))
    return (w * cols, h * -(-count // cols) + 0.4)


def _workloads(rows: Sequence[CaseRecord]) -> dict[tuple[str, str], list[CaseRecord]]:
    groups: dict[tuple[str, str], list[CaseRecord]] = {}
    for r in rows:
        groups.setdefault((r.model, r.corpus_name), []).append(r)
    return groups


def _point(ax: Any, x: float, y: float, color: str, hollow: bool, marker: str = "o") -> None:
    ax.plot(
        [x],
        [y],
        marker=marker,
        linestyle="none",
        markersize=6,
        color=color,
        markerfacecolor="none" if hollow else color,
        markeredgewidth=1.5,
    )


def _per_batch_figure(
    rows: Sequence[CaseRecord],
    metric: str,
    ylabel: str,
    title: str,
    baseline_metric: str | None,
    prefix: str,
    zero_line: bool,
) -> str:
    groups = _workloads(rows)
    colors = drafter_colors(rows)
    label = _source_label(sources(rows))

    def draw(fig: Any) -> None:
        for ax, ((model, corpus), group) in zip(_grid(fig, len(groups)), groups.items()):
            batches = sorted({r.batch for r in group if r.batch is not None})
            if baseline_metric:
                base = {}
                for r in group:
                    if r.batch is not None and getattr(r.baseline, baseline_metric) is not None:
                        base.setdefault(r.batch, getattr(r.baseline, baseline_metric))
                xs = sorted(base)
                ax.plot(
                    xs,
                    [base[b] for b in xs],
                    color=BASELINE_COLOR,
                    linestyle="--",
                    linewidth=2,
                    marker="s",
                    markersize=5,
                    label="baseline (no speculation)",
                )
            if zero_line:
                ax.axhline(
                    0.0, color=BASELINE_COLOR, linestyle="--", linewidth=1.2, label="break-even"
                )
            for drafter in sorted({r.drafter_id for r in group}):
                pts = sorted(
                    (r.batch, getattr(r, metric), bool(r.checks))
                    for r in group
                    if r.drafter_id == drafter
                    and r.batch is not None
                    and getattr(r, metric) is not None
                )
                if not pts:
                    continue
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    color=colors[drafter],
                    linewidth=2,
                    label=mpl_text(drafter),
                )
                for b, v, tripped in pts:
                    _point(ax, b, v, colors[drafter], tripped)
            if batches:
                ax.set_xscale("log", base=2)
                ax.set_xticks(batches, [str(b) for b in batches])
                ax.minorticks_off()
                ax.set_xlabel("batch")
            if zero_line:
                ax.yaxis.set_major_formatter(_percent_formatter())
            ax.set_ylabel(ylabel)
            _panel_title(ax, mpl_text(f"{model} / {corpus}"), min(3, len(groups)))
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best")
        _suptitle(fig, title, label, rows)

    return render_svg(draw, _size(len(groups)), prefix)


def _percent_formatter() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(xmax=1.0, decimals=0)


def energy_vs_batch_svg(rows: Sequence[CaseRecord], prefix: str = "ept") -> str:
    """(a) Energy per token vs batch: one line per drafter plus the baseline, per workload."""
    return _per_batch_figure(
        rows,
        "energy_per_token",
        "J/token",
        "Energy per token vs batch",
        "energy_per_token",
        prefix,
        zero_line=False,
    )


def saving_vs_batch_svg(rows: Sequence[CaseRecord], prefix: str = "saving") -> str:
    """(b) Energy saving vs batch per drafter, with the break-even line at 0."""
    return _per_batch_figure(
        rows,
        "energy_saving",
        "energy saving vs baseline",
        "Energy saving vs batch",
        None,
        prefix,
        zero_line=True,
    )


def accept_length_svg(rows: Sequence[CaseRecord], prefix: str = "accept") -> str:
    """(c) Accept length by corpus, one bar per drafter (median over batches), per model."""
    colors = drafter_colors(rows)
    models = sorted({r.model for r in rows})
    label = _source_label(sources(rows))

    def draw(fig: Any) -> None:
        import statistics

        for ax, model in zip(_grid(fig, len(models), cols=2), models):
            group = [r for r in rows if r.model == model]
            corpora = sorted({r.corpus_name for r in group})
            drafters = sorted({r.drafter_id for r in group})
            width = 0.8 / max(1, len(drafters))
            for k, drafter in enumerate(drafters):
                for c, corpus in enumerate(corpora):
                    cell = [
                        r
                        for r in group
                        if r.drafter_id == drafter
                        and r.corpus_name == corpus
                        and r.accept_length is not None
                    ]
                    if not cell:
                        continue
                    value = statistics.median(r.accept_length for r in cell)
                    hollow = any(r.checks for r in cell)
                    ax.bar(
                        c + (k - (len(drafters) - 1) / 2) * width,
                        value,
                        width * 0.9,
                        color="none" if hollow else colors[drafter],
                        edgecolor=colors[drafter],
                        linewidth=1.5,
                        hatch="//" if hollow else None,
                        label=mpl_text(drafter),
                    )
            ax.set_xticks(range(len(corpora)), [mpl_text(c) for c in corpora])
            ax.set_ylabel("accept length (tokens/step)")
            _panel_title(ax, mpl_text(model), min(2, len(models)))
            ax.grid(True, axis="y", alpha=0.3)
            # One bar per corpus carries the drafter's label; the legend names each once.
            handles, labels = ax.get_legend_handles_labels()
            unique = dict(zip(labels, handles))
            ax.legend(unique.values(), unique.keys(), loc="best")
        _suptitle(fig, "Accept length by corpus (median over batches)", label, rows)

    return render_svg(draw, _size(len(models), cols=2, w=5.5), prefix)


def latency_svg(
    rows: Sequence[CaseRecord], targets_ms: Sequence[float] = (25.0, 10.0), prefix: str = "latency"
) -> str:
    """(d) Time between tokens vs energy per token per workload, with latency-target lines and, per
    target, the lowest-energy configuration that meets it ringed and named."""
    colors = drafter_colors(rows)
    points = config_points(rows)
    groups = _workloads(rows)
    choices = latency_choices(rows, targets_ms)
    label = _source_label(sorted({p.source for p in points}))
    target_styles = ("-.", ":", "--")

    def draw(fig: Any) -> None:
        for ax, (model, corpus) in zip(_grid(fig, len(groups)), groups):
            mine = [p for p in points if (p.model, p.corpus) == (model, corpus)]
            for p in mine:
                color = BASELINE_COLOR if p.drafter_id is None else colors[p.drafter_id]
                _point(
                    ax,
                    p.tbt_ms,
                    p.energy_per_token,
                    color,
                    p.tripped,
                    marker="s" if p.drafter_id is None else "o",
                )
            for name in ["baseline"] + sorted({p.drafter_id for p in mine if p.drafter_id}):
                color = BASELINE_COLOR if name == "baseline" else colors[name]
                ax.plot(
                    [],
                    [],
                    marker="s" if name == "baseline" else "o",
                    linestyle="none",
                    color=color,
                    label=mpl_text(name),
                )
            for t, target in enumerate(targets_ms):
                style = target_styles[t % len(target_styles)]
                ax.axvline(
                    target,
                    color="#555555",
                    linestyle=style,
                    linewidth=1.2,
                    label=f"target {target:g} ms",
                )
            # One ring per chosen configuration, naming every target it is the choice for.
            chosen: dict[Any, list[float]] = {}
            for choice in choices:
                if (choice.model, choice.corpus) == (model, corpus) and choice.choice:
                    chosen.setdefault(choice.choice, []).append(choice.target_ms)
            for p, met in chosen.items():
                ax.plot(
                    [p.tbt_ms],
                    [p.energy_per_token],
                    marker="o",
                    markersize=15,
                    markerfacecolor="none",
                    markeredgecolor="#d62728",
                    markeredgewidth=2,
                    linestyle="none",
                )
                targets = ", ".join(f"\u2264{t:g}" for t in met)
                ax.annotate(
                    mpl_text(f"{targets} ms: {p.label}"),
                    (p.tbt_ms, p.energy_per_token),
                    xytext=(8, 8),
                    textcoords="offset points",
                    fontsize=8,
                    color="#d62728",
                )
            ax.set_xlabel("time between tokens (ms)")
            ax.set_ylabel("J/token")
            _panel_title(ax, mpl_text(f"{model} / {corpus}"), min(3, len(groups)))
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best")
        _suptitle(fig, "Time between tokens vs energy per token", label, rows)

    return render_svg(draw, _size(len(groups)), prefix)


def history_svg(
    documents: Sequence[RunDocument],
    threshold: float = 0.05,
    prefix: str = "history",
    max_cases: int = 10,
) -> str:
    """(e) Key metrics across stored runs (oldest first), detected steps marked."""
    all_rows = [r for d in documents for r in d.results]
    label = _source_label(sources(all_rows))
    ticks = [d.datetime[:10] or f"run {i}" for i, d in enumerate(documents)]

    def draw(fig: Any) -> None:
        for ax, (metric, ylabel, relative) in zip(
            _grid(fig, len(HISTORY_METRICS), cols=2), HISTORY_METRICS
        ):
            series = history_series(documents, metric)
            for k, (case_id, values) in enumerate(sorted(series.items())[:max_cases]):
                color = PALETTE[k % len(PALETTE)]
                xs = [i for i, v in enumerate(values) if v is not None]
                ax.plot(
                    xs,
                    [values[i] for i in xs],
                    color=color,
                    linewidth=2,
                    marker="o",
                    markersize=4,
                    label=mpl_text(case_id),
                )
                for step in detect_steps(values, threshold, relative=relative):
                    ax.axvline(step.index - 0.5, color=color, linestyle=":", linewidth=1.2)
                    ax.plot(
                        [step.index],
                        [values[step.index]],
                        marker="v",
                        markersize=9,
                        color="#d62728",
                        linestyle="none",
                    )
            ax.set_xticks(
                range(len(documents)), [mpl_text(t) for t in ticks], rotation=30, fontsize=7
            )
            ax.set_ylabel(ylabel)
            ax.set_title(metric)
            ax.grid(True, alpha=0.3)
            if metric == "energy_saving":
                ax.yaxis.set_major_formatter(_percent_formatter())
        handles, labels = fig.axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper")
        more = len({r.case_id for d in documents for r in d.results})
        extra = f"; first {max_cases} of {more} cases" if more > max_cases else ""
        _suptitle(
            fig, f"History across {len(documents)} runs (\u25bc = detected step{extra})", label
        )

    return render_svg(draw, (12.0, 6.5), prefix)
