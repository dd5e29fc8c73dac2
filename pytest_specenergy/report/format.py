"""The single place a number becomes report text: ``n/a`` when it could not be computed,
the registry's display format otherwise, and changes as the gate measured them."""

from __future__ import annotations

from pytest_specenergy.measure.metrics import METRICS


def fmt(metric: str, value: float | int | None) -> str:
    """A metric value as report text; ``n/a`` when it could not be computed."""
    if value is None:
        return "n/a"
    info = METRICS.get(metric)
    display = info.display if info else "{:.4g}"
    return display.format(int(value)) if display == "{:d}" else display.format(value)


def worse_arrow(metric: str) -> str:
    """An arrow for the direction in which ``metric`` gets worse (empty when neither)."""
    info = METRICS.get(metric)
    return {"up": "\u2191", "down": "\u2193"}.get(info.worse if info else "-", "")
