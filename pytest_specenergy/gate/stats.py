"""The statistic a limit names (``median``, ``mean``, ``min``, ``max``) of a metric's samples, with
numpy only (scipy is not a dependency). The tests that decide verdicts are the sequential rule's
(:mod:`.sequential`, :mod:`.tdist`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Summary:
    """The statistics a limit may name, of one sample's defined values."""

    n: int
    min: float
    max: float
    mean: float
    median: float

    def stat(self, name: str) -> float:
        """One of ``median``, ``mean``, ``min``, ``max`` by name."""
        if name not in ("median", "mean", "min", "max"):
            raise ValueError(f"unknown statistic {name!r}; expected median, mean, min or max")
        return float(getattr(self, name))


def summarize(values: Sequence[float | None]) -> Summary:
    """Summary statistics of the defined (non-None) values; raises ValueError when empty."""
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        raise ValueError("cannot summarize an empty sample (no defined values)")
    if not np.all(np.isfinite(data)):
        raise ValueError(f"sample contains a non-finite value: {data.tolist()}")
    return Summary(
        n=int(data.size),
        min=float(data.min()),
        max=float(data.max()),
        mean=float(np.mean(data)),
        median=float(np.median(data)),
    )
