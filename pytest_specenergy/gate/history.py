"""Step detection over the stored run history (what ``specenergy history`` prints).

A nightly job saves one run per night; a drafter or engine change shows as a sustained
level shift in a case's metric. The detector itself (``report.model.detect_steps``) ignores
lone spikes, so one noisy night is not a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Mapping
from typing import Sequence

from pytest_specenergy.report.model import detect_steps
from pytest_specenergy.report.model import history_series


@dataclass(frozen=True)
class HistoryStep:
    """A step in one case's metric: the run it starts at, the levels before and after."""

    case_id: str
    metric: str
    run: str
    before: float
    after: float
    change: float


def detect_history_steps(documents: Sequence[Mapping[str, Any]], metrics: Sequence[str],
                         threshold: float = 0.05) -> list[HistoryStep]:
    """Every step of every case and metric across ``documents`` (oldest first)."""
    labels = [str(d.get("name") or d.get("datetime") or i) for i, d in enumerate(documents)]
    found = []
    for metric in metrics:
        for case_id, values in history_series(documents, metric).items():
            for step in detect_steps(values, threshold=threshold):
                found.append(HistoryStep(case_id, metric, f"{step.index:04d} ({labels[step.index]})",
                                         step.before, step.after, step.change))
    return found
