"""The roofline: GPU presets, step overhead, and the time and energy of moving bytes and doing FLOPs
(the model, its power cap and its calibration: ``docs/design/meters-report-cli.md``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuPreset:
    """Roofline and energy constants of one GPU (how each was chosen:
    ``docs/design/meters-report-cli.md``); ``step_overhead_s`` serves only a trace priced at its own
    size, priced shapes use :func:`step_overhead_s`."""

    name: str
    bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    static_w: float
    joules_per_byte: float
    joules_per_flop: float
    step_overhead_s: float
    power_limit_w: float = 700.0

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

# --- step overhead: a graph replay, or a launch per kernel (why these numbers:
# ``docs/design/meters-report-cli.md``) -
GRAPH_STEP_S = 20e-6
KERNEL_LAUNCH_S = 5e-6
EAGER_STEP_S = 20e-6
# Kernels of an eager forward: per dense layer, extra per routed-MoE MLP, extra per Gated DeltaNet
# layer, outside.
KERNELS_DENSE_LAYER = 10
KERNELS_MOE_EXTRA = 5
KERNELS_LINEAR_EXTRA = 2
KERNELS_PER_FORWARD = 4


def step_overhead_s(
    layers: int, moe: bool = False, linear_layers: int = 0, cuda_graph: bool = True
) -> float:
    """Fixed time of one forward on top of its roofline time: one graph replay, or without CUDA
    graphs a launch per kernel (e.g. Qwen3-8B ~1.8 ms, Qwen3-30B-A3B ~3.6 ms per forward)."""
    if cuda_graph:
        return GRAPH_STEP_S
    per_layer = KERNELS_DENSE_LAYER + (KERNELS_MOE_EXTRA if moe else 0)
    kernels = layers * per_layer + linear_layers * KERNELS_LINEAR_EXTRA + KERNELS_PER_FORWARD
    return EAGER_STEP_S + KERNEL_LAUNCH_S * kernels


@dataclass(frozen=True)
class StepCost:
    """Modeled time and energy of one step."""

    seconds: float
    joules: float
    bytes: int
    flops: int
    compute_bound: bool


def roofline(moved: float, flops: float, overhead_s: float, gpu: GpuPreset) -> StepCost:
    """Time and energy of a step that moves ``moved`` bytes and does ``flops`` FLOPs."""
    memory_s = moved / gpu.bandwidth_bytes_per_s
    compute_s = flops / gpu.peak_flops_per_s
    seconds = max(memory_s, compute_s) + overhead_s
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
