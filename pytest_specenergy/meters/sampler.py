"""A power-sampling thread: the cross-check for the board energy counter (why instantaneous power
and why a thread: ``docs/report.md``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any
from typing import Callable
from typing import Sequence

MIN_HZ = 10.0
SOURCE_INSTANT = "instant (NVML_FI_DEV_POWER_INSTANT)"
SOURCE_AVERAGE = "average (nvmlDeviceGetPowerUsage)"


def integrate_trapezoid(times: Sequence[float], watts: Sequence[float]) -> float:
    """Joules under the piecewise-linear power curve through the samples."""
    if len(times) != len(watts):
        raise ValueError(f"{len(times)} times but {len(watts)} power values")
    return sum(
        (times[i + 1] - times[i]) * (watts[i + 1] + watts[i]) / 2.0 for i in range(len(times) - 1)
    )


@dataclass(frozen=True)
class SamplerResult:
    """What the sampler saw over one window."""

    samples: int
    seconds: float
    hz_requested: float
    hz_achieved: float | None
    joules_per_gpu: tuple[float, ...]
    source: str
    errors: int

    @property
    def joules(self) -> float:
        """Energy summed over the sampled GPUs."""
        return sum(self.joules_per_gpu)


class PowerSampler:
    """Samples the power of ``gpus`` (:class:`.devices.Gpu`) at ``hz`` on a daemon thread between
    start and stop."""

    def __init__(
        self, gpus: Sequence[Any], hz: float = 20.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if hz < MIN_HZ:
            raise ValueError(f"power sampling at {hz} Hz is too coarse; use >= {MIN_HZ:g} Hz")
        self.hz = hz
        self._clock = clock
        readers = [gpu.power_reader() for gpu in gpus]
        self._readers: list[Callable[[], float]] = [reader for reader, _ in readers]
        sources = {SOURCE_INSTANT if kind == "instant" else SOURCE_AVERAGE for _, kind in readers}
        self.source = " + ".join(sorted(sources)) or SOURCE_AVERAGE
        self._times: list[float] = []
        self._watts: list[tuple[float, ...]] = []
        self._errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        try:
            watts = tuple(read() for read in self._readers)
        except Exception:  # noqa: BLE001 - one failed read drops one sample, not the window
            with self._lock:
                self._errors += 1
            return
        now = self._clock()
        with self._lock:
            self._times.append(now)
            self._watts.append(watts)

    def _run(self) -> None:
        interval = 1.0 / self.hz
        while not self._stop.wait(interval):
            self._sample()

    def start(self) -> None:
        """Take the first sample now (the window's left edge) and start the thread."""
        self._sample()
        self._thread = threading.Thread(
            target=self._run, name="specenergy-power-sampler", daemon=True
        )
        self._thread.start()

    def stop(self) -> SamplerResult:
        """Stop the thread, take the last sample now (the right edge), and integrate."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._sample()
        with self._lock:
            order = sorted(range(len(self._times)), key=self._times.__getitem__)
            times = [self._times[i] for i in order]
            watts = [self._watts[i] for i in order]
            errors = self._errors
        seconds = times[-1] - times[0] if len(times) > 1 else 0.0
        per_gpu = tuple(
            integrate_trapezoid(times, [w[g] for w in watts]) for g in range(len(self._readers))
        )
        return SamplerResult(
            samples=len(times),
            seconds=seconds,
            hz_requested=self.hz,
            hz_achieved=(len(times) - 1) / seconds if seconds > 0 else None,
            joules_per_gpu=per_gpu,
            source=self.source,
            errors=errors,
        )
