"""The meter protocol: how energy over one measurement window is obtained; every window's ``source``
label (``measured (nvml)``, ``modeled (h200)``) follows its figure into tables, JSON and reports."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Mapping
from typing import Protocol

from pytest_specenergy.engines.config import EngineConfig


class MeterError(RuntimeError):
    """A measurement could not be made (no NVML, window too short, counter reset...)."""


@dataclass(frozen=True)
class EnergyWindow:
    """Energy and time over one window. ``request_seconds``: each request's active time in it, when
    the meter knows it (the modeled meter; a board counter leaves it to ``e2e_latency``).
    ``request_decode_seconds``: its decode, verify and draft part, time between tokens without
    another window's prefill (whose batching differs at large batch)."""

    joules: float
    seconds: float
    source: str
    request_seconds: Mapping[str, float] | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    request_decode_seconds: Mapping[str, float] | None = None
    #: The window's target prefill forwards alone, where the meter prices the engine's steps (the
    #: modeled meter; None with a board meter): what a prefill-only twin on the non-speculative
    #: twin reads (a draft model's own prefill is the speculative arm's work, not in it). A meter
    #: adjusting a window's readings adjusts this alike.
    prefill_only: EnergyWindow | None = None
    #: Per request, the seconds from the end of its prefill (its first token) to the end of its
    #: last step, every step in between counted (other requests' prefills too): the time a user
    #: waits for its tokens after the first. None: the meter does not know.
    request_visible_seconds: Mapping[str, float] | None = None


class EngineHandle(Protocol):
    """The view of a running engine that a meter needs."""

    config: EngineConfig
    #: Environment the server process was started with (``CUDA_VISIBLE_DEVICES`` lives here).
    env: Mapping[str, str]

    def work_trace(self, start: int) -> tuple[int, list[dict[str, Any]]]:
        """Steps recorded since cursor ``start`` and the next cursor (reference server only)."""


class Meter(Protocol):
    """Reads energy for windows of engine work."""

    #: ``nvml`` or ``modeled:<gpu>``.
    kind: str
    #: ``measured (nvml)`` or ``modeled (<gpu>)``: shown next to every figure.
    label: str
    #: Shortest window the meter can resolve; shorter windows are repeated until this long.
    min_window_s: float

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the meter (GPU name, UUID, driver, preset constants...)."""

    def start(self, engine: EngineHandle) -> Any:
        """Open a window on ``engine``; returns a token for :meth:`stop`."""

    def stop(self, token: Any) -> EnergyWindow:
        """Close the window opened by :meth:`start`."""

    def close(self) -> None:
        """Release resources (sampler threads, NVML)."""
