"""Energy meters: ``nvml`` (measured) and ``modeled:<gpu>[:<shape>]`` (roofline model of a work
trace)."""

from __future__ import annotations

from typing import Callable
from typing import Iterable

from pytest_specenergy.meters.base import EnergyWindow
from pytest_specenergy.meters.base import Meter
from pytest_specenergy.meters.base import MeterError


def meter_kind_for(requested: str, engine: str, device: str) -> str:
    """Resolve ``auto``: the board counter for engines on a GPU, else the H200 model."""
    if requested != "auto":
        return requested
    return "nvml" if engine == "sglang" or device.startswith("cuda") else "modeled:h200"


def check_meter_kind(text: str) -> str:
    """``text`` when it names a meter :func:`make_meter` builds: ``auto``, ``nvml``,
    ``modeled:<gpu>`` or ``modeled:<gpu>:<shape>`` (the target priced as that shape, or ``self``
    at the trace's own size, as :class:`.modeled.ModeledMeter` takes it); ValueError says what
    is expected. Imports neither torch nor numpy: the option parser calls it at start-up."""
    from pytest_specenergy.meters.roofline import PRESETS
    from pytest_specenergy.meters.shapes import SHAPES

    prefix, _, rest = text.partition(":")
    gpu, has_shape, shape = rest.partition(":")
    if text in ("auto", "nvml") or (
        prefix == "modeled"
        and gpu in PRESETS
        and (not has_shape or shape.lower() in SHAPES or shape.lower() == "self")
    ):
        return text
    raise ValueError(
        f"expected auto, nvml, modeled:<gpu> or modeled:<gpu>:<shape> with a GPU preset of "
        f"{', '.join(sorted(PRESETS))} and a shape of self, {', '.join(sorted(SHAPES))}, "
        f"got {text!r}"
    )


def make_meter(kind: str, own_pids: Callable[[], Iterable[int]] | None = None) -> Meter:
    """Build the meter for ``kind``; raises :class:`MeterError` when it cannot work here.
    ``own_pids``: the pids of every engine the plugin runs (resident siblings of the measured one
    count as its own processes, not as contamination)."""
    if kind.startswith("modeled:"):
        from pytest_specenergy.meters.modeled import ModeledMeter

        return ModeledMeter(kind.split(":", 1)[1])
    if kind == "nvml":
        from pytest_specenergy.meters.nvml import NvmlMeter

        return NvmlMeter.open(own_pids=own_pids)
    raise MeterError(
        f"unknown meter {kind!r}; expected nvml or modeled:<gpu>[:<shape>] (h100, h200)"
    )


__all__ = [
    "EnergyWindow",
    "Meter",
    "MeterError",
    "check_meter_kind",
    "make_meter",
    "meter_kind_for",
]
