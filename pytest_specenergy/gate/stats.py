"""Descriptive statistics of a metric's samples, with numpy only (scipy is not a dependency):
:func:`summarize` gives n, min, max, mean, median, stddev, quartiles, IQR and relative spread.
The tests that decide verdicts are the sequential rule's (:mod:`.sequential`, :mod:`.tdist`)."""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from typing import Any
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of one sample; spread fields are None below two values."""

    n: int
    min: float
    max: float
    mean: float
    median: float
    stddev: float | None
    q1: float
    q3: float
    iqr: float
    relative_spread: float | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return asdict(self)

    def stat(self, name: str) -> float:
        """One of ``median``, ``mean``, ``min``, ``max`` by name."""
        if name not in ("median", "mean", "min", "max"):
            raise ValueError(f"unknown statistic {name!r}; expected median, mean, min or max")
        return float(getattr(self, name))


def _clean(values: Sequence[float | None], what: str) -> np.ndarray:
    array = np.asarray([v for v in values if v is not None], dtype=float)
    if array.size and not np.all(np.isfinite(array)):
        raise ValueError(f"{what} contains a non-finite value: {array.tolist()}")
    return array


def summarize(values: Sequence[float | None]) -> Summary:
    """Summary statistics of the defined (non-None) values; raises ValueError when empty."""
    data = _clean(values, "sample")
    if data.size == 0:
        raise ValueError("cannot summarize an empty sample (no defined values)")
    mean = float(np.mean(data))
    stddev = float(np.std(data, ddof=1)) if data.size >= 2 else None
    q1, median, q3 = (float(q) for q in np.quantile(data, [0.25, 0.5, 0.75]))
    spread = stddev / abs(mean) if stddev is not None and mean != 0 else None
    return Summary(n=int(data.size), min=float(data.min()), max=float(data.max()), mean=mean,
                   median=median, stddev=stddev, q1=q1, q3=q3, iqr=q3 - q1,
                   relative_spread=spread)
