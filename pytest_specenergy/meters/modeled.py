"""The modeled meter: a roofline model of a GPU applied to the reference server's work trace.

Each forward pass the server records (phase, rows, query tokens, context lengths, weight and
KV bytes, FLOPs - all at bf16, whatever the CPU dtype) becomes::

    time   = max(bytes / bandwidth, flops / peak) + step overhead
    energy = static power x time + energy/byte x bytes + energy/FLOP x flops

Nothing about speculation is special-cased. The paper's first-order effects emerge from the
trace: a memory-bound verify step costs about what a one-token decode step costs, so savings
follow accepted tokens; batching shares the weight bytes; and many verified tokens at a large
batch push a step past the balance point (peak / bandwidth), where the arithmetic shows.
Every figure is labelled ``modeled (<gpu>)``: it is a model, not a measurement.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from typing import Any
from typing import Iterable

from pytest_specenergy.meters.base import EnergyWindow
from pytest_specenergy.meters.base import EngineHandle
from pytest_specenergy.meters.base import MeterError


@dataclass(frozen=True)
class GpuPreset:
    """Roofline and energy constants of one GPU.

    Bandwidth is an achievable copy rate, and peak is chosen so that ``peak / bandwidth``
    equals the balance point the paper measured (316 FLOP/byte on H100, 163 on H200).
    Static power covers idle and leakage; the per-byte and per-FLOP energies are set so that a
    fully memory-bound step draws about 0.7 of board power and a compute-bound one about 1.0.
    """

    name: str
    bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    static_w: float
    joules_per_byte: float
    joules_per_flop: float
    step_overhead_s: float

    @property
    def balance_point(self) -> float:
        """FLOP per byte where a step turns compute-bound."""
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s


PRESETS: dict[str, GpuPreset] = {
    # H100 SXM: ~2.6 TB/s achievable of 3.35 TB/s; balance point 316 FLOP/byte (paper s.2).
    "h100": GpuPreset("h100", 2.6e12, 2.6e12 * 316, 120.0, 9.0e-11, 6.0e-13, 12e-6),
    # H200: 4.3 TB/s device copy measured on an H200 of this workplace; balance point 163.
    "h200": GpuPreset("h200", 4.3e12, 4.3e12 * 163, 130.0, 8.0e-11, 8.0e-13, 12e-6),
}


@dataclass(frozen=True)
class StepCost:
    """Modeled time and energy of one recorded step."""

    seconds: float
    joules: float
    bytes: int
    flops: int
    compute_bound: bool


def step_cost(step: dict[str, Any], gpu: GpuPreset) -> StepCost:
    """Roofline time and energy of one work-trace step."""
    try:
        moved = int(step["weight_bytes"]) + int(step["kv_bytes"])
        flops = int(step["flops"])
    except (KeyError, TypeError, ValueError) as exc:
        raise MeterError(f"work-trace step lacks weight_bytes/kv_bytes/flops: {step!r}") from exc
    memory_s = moved / gpu.bandwidth_bytes_per_s
    compute_s = flops / gpu.peak_flops_per_s
    seconds = max(memory_s, compute_s) + gpu.step_overhead_s
    joules = gpu.static_w * seconds + gpu.joules_per_byte * moved + gpu.joules_per_flop * flops
    return StepCost(seconds, joules, moved, flops, compute_s > memory_s)


def window_from_steps(steps: Iterable[dict[str, Any]], gpu: GpuPreset) -> EnergyWindow:
    """Sum modeled step costs; attribute each step's time to the requests in it."""
    joules = seconds = 0.0
    moved = flops = count = compute_bound = 0
    per_request: dict[str, float] = {}
    by_phase: dict[str, dict[str, float]] = {}
    for step in steps:
        cost = step_cost(step, gpu)
        count += 1
        joules += cost.joules
        seconds += cost.seconds
        moved += cost.bytes
        flops += cost.flops
        compute_bound += cost.compute_bound
        phase = by_phase.setdefault(f"{step.get('model', 'target')}:{step.get('phase', '?')}",
                                    {"steps": 0, "joules": 0.0, "seconds": 0.0})
        phase["steps"] += 1
        phase["joules"] += cost.joules
        phase["seconds"] += cost.seconds
        for rid in step.get("rids", ()):
            per_request[str(rid)] = per_request.get(str(rid), 0.0) + cost.seconds
    details = {
        "steps": count,
        "bytes": moved,
        "flops": flops,
        "arithmetic_intensity": flops / moved if moved else 0.0,
        "compute_bound_steps": compute_bound,
        "by_phase": by_phase,
    }
    return EnergyWindow(joules, seconds, f"modeled ({gpu.name})", per_request, details)


class ModeledMeter:
    """``modeled:<gpu>``: energy from the reference server's work trace."""

    # The trace is exact, so any window is long enough.
    min_window_s = 0.0

    def __init__(self, gpu: str = "h200") -> None:
        if gpu not in PRESETS:
            raise MeterError(f"no GPU preset {gpu!r} for the modeled meter; expected one of "
                             f"{', '.join(sorted(PRESETS))}")
        self.gpu = PRESETS[gpu]
        self.kind = f"modeled:{gpu}"
        self.label = f"modeled ({gpu})"
        self._cursors: dict[int, int] = {}

    def describe(self) -> dict[str, Any]:
        """The preset constants and the balance point."""
        return {"kind": self.kind, "label": self.label, "preset": asdict(self.gpu),
                "balance_point_flop_per_byte": round(self.gpu.balance_point, 1)}

    def _advance(self, engine: EngineHandle) -> tuple[int, list[dict[str, Any]]]:
        start = self._cursors.get(id(engine), 0)
        cursor, steps = engine.work_trace(start)
        self._cursors[id(engine)] = cursor
        return cursor, steps

    def start(self, engine: EngineHandle) -> Any:
        """Skip past everything recorded so far (warm-up, earlier windows)."""
        if not hasattr(engine, "work_trace"):
            raise MeterError(f"the modeled meter needs an engine with a work trace (the reference "
                             f"server), not {engine.config.engine}; use --specenergy-meter=nvml")
        self._advance(engine)
        return engine

    def stop(self, token: Any) -> EnergyWindow:
        """Model the steps recorded since :meth:`start`."""
        _, steps = self._advance(token)
        return window_from_steps(steps, self.gpu)

    def close(self) -> None:
        """Nothing to release."""
