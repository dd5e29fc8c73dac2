"""No figure clips a title: every title and panel title lies inside its figure, the
one-panel figures (a quickstart's one model and corpus) and a long source label included."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_specenergy.document import RunDocument
from pytest_specenergy.report import plots

pytest.importorskip("matplotlib")

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "report"
LONG_SOURCE = "modeled (h200, priced as Qwen3-8B)"


def _documents(workloads: int) -> list[RunDocument]:
    doc = RunDocument.from_dict(json.loads((FIXTURES / "run.json").read_text()))
    keep = sorted({r.corpus_name for r in doc.results})[:workloads]
    records = [
        dataclasses.replace(
            r, source=LONG_SOURCE, baseline=dataclasses.replace(r.baseline, source=LONG_SOURCE)
        )
        for r in doc.results
        if r.corpus_name in keep
    ]
    return [
        dataclasses.replace(doc, results=records, datetime=f"2026-03-0{i + 1}T12:00:00+00:00")
        for i in range(2)
    ]


@pytest.fixture
def titles_checked(monkeypatch) -> list[str]:
    """Every figure saved is laid out first and each title's extent checked against it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    checked: list[str] = []
    save = Figure.savefig

    def savefig(fig: Any, *args: Any, **kwargs: Any) -> Any:
        FigureCanvasAgg(fig)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        texts = [fig._suptitle] + [ax.title for ax in fig.axes if ax.get_visible()]
        for text in texts:
            if text is None or not text.get_text():
                continue
            box = text.get_window_extent(renderer)
            assert box.x0 >= 0 and box.x1 <= fig.bbox.width + 0.5, (
                f"clipped title: {text.get_text()!r}"
            )
            checked.append(text.get_text())
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return checked


@pytest.mark.parametrize("workloads", [1, 2])
def test_no_figure_clips_a_title(titles_checked, workloads):
    docs = _documents(workloads)
    rows = docs[-1].results
    plots.energy_vs_batch_svg(rows)
    plots.saving_vs_batch_svg(rows)
    plots.accept_length_svg(rows)
    plots.latency_svg(rows)
    plots.history_svg(docs)
    suptitles = [t for t in titles_checked if "Energy per token" in t or "History" in t]
    assert suptitles and all("Qwen3-8B" in t for t in suptitles)  # the source still named, whole
