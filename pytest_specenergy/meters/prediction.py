"""Pricing the work of a shape on a GPU, and predicting speculation's saving before anything runs:
:func:`price` is the modeled meter's roofline, so a prediction is what the meter would report for
the same work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pytest_specenergy.meters.roofline import GpuPreset
from pytest_specenergy.meters.roofline import StepCost
from pytest_specenergy.meters.roofline import gpu_preset
from pytest_specenergy.meters.roofline import roofline
from pytest_specenergy.meters.roofline import step_overhead_s
from pytest_specenergy.meters.shapes import ForwardCost
from pytest_specenergy.meters.shapes import ModelShape
from pytest_specenergy.meters.shapes import forward_cost
from pytest_specenergy.meters.shapes import verify_cost


def overhead_s(shape: ModelShape, gpu: GpuPreset, cuda_graph: bool = True) -> float:
    """The fixed per-forward overhead of ``shape`` on ``gpu`` (see
    :func:`.roofline.step_overhead_s`)."""
    return step_overhead_s(
        shape.layers, shape.is_moe, shape.linear_layers, cuda_graph, gpu.fixed_step_s
    )


def price(
    cost: ForwardCost, shape: ModelShape, gpu: GpuPreset, cuda_graph: bool = True
) -> StepCost:
    """Roofline time and energy of one forward (the meter's model)."""
    return roofline(cost.bytes, cost.flops, overhead_s(shape, gpu, cuda_graph), gpu)


DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Prediction:
    """What the roofline model predicts for one batch, before anything runs. Energies are per
    committed token; ``saving`` is ``1 - spec / baseline`` (None without an accept length), 0 at
    ``break_even_accept_length``."""

    batch: int
    verify_intensity: float
    balance_point: float
    compute_bound: bool
    decode_joules_per_token: float
    spec_joules_per_token: float | None
    saving: float | None
    break_even_accept_length: float
    decode_step_s: float
    spec_step_s: float
    speedup: float | None

    def to_json(self) -> dict[str, object]:
        """JSON-ready fields."""
        return dict(self.__dict__)


def predict(
    shape: ModelShape,
    verified: int,
    context: int,
    gpu: str | GpuPreset,
    accept_length: float | None = None,
    batches: Sequence[int] = DEFAULT_BATCHES,
    *,
    draft_shape: ModelShape | None = None,
    draft_passes: int = 1,
    draft_tokens: int | None = None,
    draft_cost: float = 0.0,
    cuda_graph: bool = True,
) -> list[Prediction]:
    """Intensity, compute-bound flag and energy saving of speculation vs plain decode, per batch
    (the two arms: ``docs/report.md``). The draft is ``draft_passes`` forwards of
    ``draft_shape`` with ``draft_tokens`` query tokens per row, and/or ``draft_cost`` x a decode
    step's energy and time."""
    preset = gpu_preset(gpu)
    if verified < 1:
        raise ValueError("verified must be at least 1")
    if accept_length is not None and not 1.0 <= accept_length <= verified:
        raise ValueError(f"accept length {accept_length} must lie in [1, verified={verified}]")
    out = []
    for batch in batches:
        decode = price(forward_cost(shape, batch, 1, context), shape, preset, cuda_graph)
        verify_work = verify_cost(shape, batch, verified, context)
        verify = price(verify_work, shape, preset, cuda_graph)
        spec_j = verify.joules + draft_cost * decode.joules
        spec_s = verify.seconds + draft_cost * decode.seconds
        if draft_shape is not None and draft_passes > 0:
            per_row = verified if draft_tokens is None else draft_tokens
            draft = price(
                forward_cost(draft_shape, batch, per_row, context), draft_shape, preset, cuda_graph
            )
            spec_j += draft_passes * draft.joules
            spec_s += draft_passes * draft.seconds
        decode_jpt = decode.joules / batch
        spec_jpt = spec_j / (batch * accept_length) if accept_length else None
        out.append(
            Prediction(
                batch=batch,
                verify_intensity=verify_work.intensity,
                balance_point=preset.balance_point,
                compute_bound=verify_work.intensity > preset.balance_point,
                decode_joules_per_token=decode_jpt,
                spec_joules_per_token=spec_jpt,
                saving=1.0 - spec_jpt / decode_jpt if spec_jpt is not None else None,
                break_even_accept_length=spec_j / decode.joules,
                decode_step_s=decode.seconds,
                spec_step_s=spec_s,
                speedup=accept_length * decode.seconds / spec_s if accept_length else None,
            )
        )
    return out
