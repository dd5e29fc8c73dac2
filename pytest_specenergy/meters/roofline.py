"""The roofline: GPU presets, step overhead, and the time and energy of moving bytes and doing FLOPs
(the model, its power cap and its calibration against measured serving figures:
``docs/report.md``)."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_specenergy.meters import calibration as _fit
from pytest_specenergy.meters.calibration import Calibration

#: The paper's measured balance points (s.2), FLOP per byte: each preset's peak is its bandwidth
#: times this, so a step turns compute-bound where the paper says.
BALANCE_POINTS = {"h100": 316.0, "h200": 163.0}


@dataclass(frozen=True)
class GpuPreset:
    """Roofline and energy constants of one GPU (how each was fitted: :mod:`.calibration` and
    ``docs/report.md``); ``step_overhead_s`` serves only a trace priced at its own
    size, priced shapes use ``fixed_step_s`` through :func:`step_overhead_s`."""

    name: str
    bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    static_w: float
    joules_per_byte: float
    joules_per_flop: float
    step_overhead_s: float
    power_limit_w: float = 700.0
    #: Time of a forward beyond moving its bytes and doing its math, with CUDA graphs (a replay,
    #: the scheduler's step, sampling): fitted; 20 us (one graph replay) was the guess before.
    fixed_step_s: float = 20e-6
    #: The measured data the constants were fitted to; None: not calibrated.
    calibration: Calibration | None = None
    #: True: a step takes the longer of its memory and its compute time (the textbook roofline,
    #: the presets before calibration); False: the two add, as the fit to measured figures says.
    overlapped: bool = False

    @property
    def balance_point(self) -> float:
        """FLOP per byte where a step turns compute-bound."""
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s

    @property
    def calibration_id(self) -> str:
        """The calibration's versioned name, ``uncalibrated`` without one."""
        return self.calibration.id if self.calibration else "uncalibrated"


def _h200_bandwidth() -> float:
    # Same die as the fitted H100, so the same peak FLOP/s; the paper's H200 balance point then
    # gives its bandwidth (ML.ENERGY publishes no H200 figures: calibration.ML_ENERGY_H200).
    return _fit.H100_BANDWIDTH_BYTES_PER_S * BALANCE_POINTS["h100"] / BALANCE_POINTS["h200"]


PRESETS: dict[str, GpuPreset] = {
    # H100 SXM, fitted to ML.ENERGY's measured Qwen3-8B and Llama-3.1-8B (calibration.py). The
    # J/byte (90 pJ here, 80 on the H200) are the uncalibrated presets': on memory-bound steps they
    # trade one for one with static W, which the fit chose.
    "h100": GpuPreset(
        "h100",
        _fit.H100_BANDWIDTH_BYTES_PER_S,
        _fit.H100_BANDWIDTH_BYTES_PER_S * BALANCE_POINTS["h100"],
        _fit.H100_STATIC_W,
        9.0e-11,
        _fit.H100_JOULES_PER_FLOP,
        12e-6,
        fixed_step_s=_fit.H100_FIXED_STEP_S,
        calibration=_fit.ML_ENERGY_H100,
    ),
    # H200: the H100's fit carried over to the same die with HBM3e.
    "h200": GpuPreset(
        "h200",
        _h200_bandwidth(),
        _h200_bandwidth() * BALANCE_POINTS["h200"],
        _fit.H100_STATIC_W,
        8.0e-11,
        _fit.H100_JOULES_PER_FLOP,
        12e-6,
        fixed_step_s=_fit.H100_FIXED_STEP_S,
        calibration=_fit.ML_ENERGY_H200,
    ),
}

# --- step overhead: the preset's fixed step cost, plus a launch per kernel without CUDA graphs (why
# these numbers: ``docs/report.md``) -
KERNEL_LAUNCH_S = 5e-6
# Kernels of an eager forward: per dense layer, extra per routed-MoE MLP, extra per Gated DeltaNet
# layer, outside.
KERNELS_DENSE_LAYER = 10
KERNELS_MOE_EXTRA = 5
KERNELS_LINEAR_EXTRA = 2
KERNELS_PER_FORWARD = 4


def step_overhead_s(
    layers: int,
    moe: bool = False,
    linear_layers: int = 0,
    cuda_graph: bool = True,
    fixed_s: float = 20e-6,
) -> float:
    """Fixed time of one forward on top of its bytes and FLOPs: ``fixed_s`` (a preset's
    ``fixed_step_s``), and without CUDA graphs a launch per kernel on top (e.g. Qwen3-8B +1.8 ms,
    Qwen3-30B-A3B +3.6 ms per forward)."""
    if cuda_graph:
        return fixed_s
    per_layer = KERNELS_DENSE_LAYER + (KERNELS_MOE_EXTRA if moe else 0)
    kernels = layers * per_layer + linear_layers * KERNELS_LINEAR_EXTRA + KERNELS_PER_FORWARD
    return fixed_s + KERNEL_LAUNCH_S * kernels


@dataclass(frozen=True)
class StepCost:
    """Modeled time and energy of one step."""

    seconds: float
    joules: float
    bytes: int
    flops: int
    compute_bound: bool


def roofline(moved: float, flops: float, overhead_s: float, gpu: GpuPreset) -> StepCost:
    """Time and energy of a step that moves ``moved`` bytes and does ``flops`` FLOPs: memory time
    plus compute time (or the longer of them, ``gpu.overlapped``) plus ``overhead_s``, stretched
    to the board's power limit (why they add: ``docs/report.md``)."""
    memory_s = moved / gpu.bandwidth_bytes_per_s
    compute_s = flops / gpu.peak_flops_per_s
    seconds = (max(memory_s, compute_s) if gpu.overlapped else memory_s + compute_s) + overhead_s
    dynamic = gpu.joules_per_byte * moved + gpu.joules_per_flop * flops
    if (
        gpu.power_limit_w > gpu.static_w
        and gpu.static_w * seconds + dynamic > gpu.power_limit_w * seconds
    ):
        seconds = dynamic / (gpu.power_limit_w - gpu.static_w)  # power-capped: clocks drop
    joules = gpu.static_w * seconds + dynamic
    return StepCost(seconds, joules, int(moved), int(flops), compute_s > memory_s)


def gpu_preset(gpu: str | GpuPreset) -> GpuPreset:
    """The preset named ``gpu`` (``h100``, ``h200``), or ``gpu`` itself; ValueError names the valid
    ones."""
    if isinstance(gpu, GpuPreset):
        return gpu
    preset = PRESETS.get(str(gpu).lower())
    if preset is None:
        raise ValueError(f"no GPU preset {gpu!r}; expected one of {', '.join(sorted(PRESETS))}")
    return preset
