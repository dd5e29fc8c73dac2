"""Step detection over the stored run history (what ``specenergy history`` prints and the report's
history section draws): a drafter or engine change shows as a sustained level shift in a case's
nightly metric, while a lone spike (one noisy night) is not a step."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from pytest_specenergy.document import RunDocument

#: Smallest relative change that counts as a step unless the caller says otherwise.
DEFAULT_STEP = 0.05


@dataclass(frozen=True)
class Step:
    """A sustained change in level at ``index`` (the first run at the new level)."""

    index: int
    before: float
    after: float
    change: float  # relative, or absolute when detected with relative=False


def detect_steps(
    values: Sequence[float | None],
    threshold: float = DEFAULT_STEP,
    window: int = 3,
    min_sustain: int = 2,
    relative: bool = True,
) -> list[Step]:
    """Level shifts in a series of per-run values (None = the case did not run), sustained by
    ``min_sustain`` runs so that a lone spike is not a step (the rule: docs/gate.md#step-detection-over-the-history)."""
    present = [(i, float(v)) for i, v in enumerate(values) if v is not None]
    vals = [v for _, v in present]
    candidates: list[Step] = []
    for j in range(1, len(vals)):
        before, after = vals[max(0, j - window) : j], vals[j : j + window]
        if len(after) < min_sustain:
            break
        old, new = statistics.median(before), statistics.median(after)
        if relative and old == 0:
            continue
        change = new / old - 1.0 if relative else new - old
        if abs(change) < threshold:
            continue
        mid = (old + new) / 2
        up = new > old
        if all((v > mid) == up for v in after) and (vals[j - 1] > mid) != up:
            candidates.append(Step(present[j][0], old, new, change))
    steps: list[Step] = []
    for step in candidates:
        if not steps or step.index - steps[-1].index >= window:
            steps.append(step)
        elif abs(step.change) > abs(steps[-1].change):
            steps[-1] = step
    return steps


def history_series(documents: Sequence[RunDocument], metric: str) -> dict[str, list[float | None]]:
    """Per case id, ``metric`` in each document (oldest first); None where the case is absent."""
    per_doc = [{r.case_id: getattr(r, metric) for r in d.results} for d in documents]
    case_ids = sorted({c for values in per_doc for c in values})
    return {c: [values.get(c) for values in per_doc] for c in case_ids}


@dataclass(frozen=True)
class HistoryStep:
    """A step in one case's metric: the run it starts at, the levels before and after."""

    case_id: str
    metric: str
    run: str
    before: float
    after: float
    change: float


def detect_history_steps(
    documents: Sequence[RunDocument], metrics: Sequence[str], threshold: float = DEFAULT_STEP
) -> list[HistoryStep]:
    """Every step of every case and metric across ``documents`` (oldest first)."""
    labels = [d.label or str(i) for i, d in enumerate(documents)]
    found = []
    for metric in metrics:
        for case_id, values in history_series(documents, metric).items():
            for step in detect_steps(values, threshold=threshold):
                found.append(
                    HistoryStep(
                        case_id,
                        metric,
                        f"{step.index:04d} ({labels[step.index]})",
                        step.before,
                        step.after,
                        step.change,
                    )
                )
    return found
