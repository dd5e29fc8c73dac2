"""The modeled meter: a roofline model of a GPU applied to the reference server's work trace (how a
trace is priced, and why nothing about speculation is special-cased:
``docs/report.md``)."""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any
from typing import Iterable
from typing import Mapping

import pytest_specenergy.meters.roofline as _roofline
from pytest_specenergy.meters.base import EnergyWindow
from pytest_specenergy.meters.base import EngineHandle
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.prediction import overhead_s
from pytest_specenergy.meters.roofline import PRESETS
from pytest_specenergy.meters.roofline import GpuPreset
from pytest_specenergy.meters.roofline import StepCost
from pytest_specenergy.meters.roofline import roofline
from pytest_specenergy.meters.shapes import ModelShape
from pytest_specenergy.meters.shapes import effective_tokens
from pytest_specenergy.meters.shapes import expected_experts
from pytest_specenergy.meters.shapes import forward_cost
from pytest_specenergy.meters.shapes import get_shape

__all__ = [
    "PRESETS",
    "GpuPreset",
    "ModeledMeter",
    "Pricing",
    "StepCost",
    "pricing_for",
    "step_cost",
    "window_from_steps",
]

SELF = "self"
ROLES = ("target", "draft")


@dataclass(frozen=True)
class TracedMoe:
    """Routing facts of the model that actually ran (the tiny one): experts, top-k, layers."""

    experts: int
    per_token: int
    layers: int


@dataclass(frozen=True)
class Pricing:
    """How one engine's trace is priced: a shape per role (None = the trace's own numbers)."""

    gpu: GpuPreset
    shapes: Mapping[str, ModelShape | None] = field(default_factory=dict)
    cuda_graph: bool = True
    traced_moe: Mapping[str, TracedMoe] = field(default_factory=dict)
    self_name: str = "tiny model"

    def shape(self, role: str) -> ModelShape | None:
        """The shape a step of ``role`` (``target`` / ``draft``) is priced at."""
        return self.shapes.get(role)

    @property
    def label(self) -> str:
        """``modeled (h200, priced as Qwen3-8B)``; the target's shape names the figures."""
        target = self.shape("target")
        parts = [self.gpu.name, f"priced as {target.name if target else self.self_name}"]
        if not self.cuda_graph:
            parts.append("no CUDA graphs")
        return f"modeled ({', '.join(parts)})"

    def describe(self) -> dict[str, Any]:
        """JSON-ready: the shape key of each role (``self`` = the trace's own size), graphs, and the
        preset's calibration (its versioned name)."""
        return {
            "priced_as": {role: (s.name if s else SELF) for role, s in self.shapes.items()} or SELF,
            "cuda_graph": self.cuda_graph,
            "label": self.label,
            "calibration": self.gpu.calibration_id,
        }


def _cuda_graph(info: Mapping[str, Any], engine: Any) -> bool:
    """CUDA graphs are on unless the engine says otherwise (SGLang's default)."""
    if isinstance(info.get("cuda_graph"), bool):
        return bool(info["cuda_graph"])
    config = getattr(engine, "config", None)
    options = dict(getattr(config, "options", ()) or ())
    for source in (info, options):
        if source.get("disable_cuda_graph") or source.get("disable_decode_cuda_graph"):
            return False
        if isinstance(source.get("cuda_graph"), bool):
            return bool(source["cuda_graph"])
    return True


def _traced_moe(shape_json: Any) -> TracedMoe | None:
    if not isinstance(shape_json, Mapping):
        return None
    sizes = [
        int(shape_json.get(key) or 0)
        for key in ("num_experts", "num_experts_per_tok", "num_layers")
    ]
    return TracedMoe(*sizes) if all(sizes) else None


def _resolve(name: Any) -> ModelShape | None:
    if name is None or str(name).lower() == SELF:
        return None
    try:
        return get_shape(str(name))
    except ValueError as exc:
        raise MeterError(
            f"the engine asks to be priced as {name!r}, which the modeled meter does not "
            f"know: {exc}"
        ) from None


def pricing_for(
    gpu: GpuPreset, info: Mapping[str, Any] | None, engine: Any = None, override: str | None = None
) -> Pricing:
    """The pricing of an engine from its ``/server_info`` (``priced_as``, CUDA-graph setting);
    ``override`` replaces the server's declaration: ``self`` prices every step at the trace's own
    size, a shape name the target there."""
    info = info if isinstance(info, Mapping) else {}
    declared = info.get("priced_as")
    if isinstance(declared, str):
        declared = {"target": declared}
    declared = dict(declared) if isinstance(declared, Mapping) else {}
    if override is not None:
        declared = {} if override.lower() == SELF else {**declared, "target": override}
    shapes = {role: _resolve(declared.get(role)) for role in ROLES if role in declared}
    traced = {
        role: moe
        for role, key in (("target", "model_shape"), ("draft", "draft_model_shape"))
        if (moe := _traced_moe(info.get(key))) is not None
    }
    model = str(info.get("model_path") or "")
    self_name = "tiny model" if not model or model.startswith("tiny:") else "served model"
    return Pricing(gpu, shapes, _cuda_graph(info, engine), traced, self_name)


def _field(step: Mapping[str, Any], key: str) -> Any:
    try:
        return step[key]
    except (KeyError, TypeError) as exc:
        raise MeterError(f"work-trace step lacks {key}: {step!r}") from exc


def _scaled_experts(
    step: Mapping[str, Any], shape: ModelShape, traced: TracedMoe | None, tokens: int
) -> list[float] | None:
    """Experts the real shape would touch for this step, per real layer, from the tiny router's
    overlap (the method: ``docs/report.md``)."""
    touched = step.get("experts_touched")
    if not shape.is_moe or not touched or traced is None:
        return None  # forward_cost uses the uniform expectation for all tokens
    values = [float(t) for t in touched]
    out = []
    for layer in range(shape.layers):
        tiny = values[min(layer * len(values) // shape.layers, len(values) - 1)]
        n_eff = effective_tokens(tiny, traced.experts, traced.per_token, tokens)
        out.append(expected_experts(shape.experts, shape.experts_per_token, n_eff))
    return out


def step_cost(
    step: Mapping[str, Any],
    gpu: GpuPreset,
    shape: ModelShape | None = None,
    cuda_graph: bool = True,
    traced: TracedMoe | None = None,
) -> StepCost:
    """Roofline time and energy of one work-trace step, at ``shape`` or (None) at the trace's own
    size."""
    if shape is None:
        try:
            moved = int(step["weight_bytes"]) + int(step["kv_bytes"])
            flops = int(step["flops"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MeterError(
                f"work-trace step lacks weight_bytes/kv_bytes/flops: {step!r}"
            ) from exc
        return roofline(moved, flops, gpu.step_overhead_s, gpu)
    query = [int(q) for q in _field(step, "query_tokens")]
    context = [int(c) for c in _field(step, "context_lens")]
    phase = str(step.get("phase", "decode"))
    logits = None  # decode, verify, draft passes: every fed position needs logits
    if phase == "prefill":
        logits = len(query) if step.get("model", "target") == "target" else 0
    cost = forward_cost(
        shape,
        len(query),
        query,
        context,
        _scaled_experts(step, shape, traced, sum(query)),
        logit_rows=logits,
        per_position_states=phase == "verify",
    )
    return roofline(cost.bytes, cost.flops, overhead_s(shape, gpu, cuda_graph), gpu)


def _intensity(flops: float, moved: float) -> float | None:
    return flops / moved if moved else None


def window_from_steps(
    steps: Iterable[Mapping[str, Any]], gpu: GpuPreset, pricing: Pricing | None = None
) -> EnergyWindow:
    """Sum modeled step costs; attribute each step's time to the requests in it."""
    pricing = pricing or Pricing(gpu)
    joules = seconds = 0.0
    moved = flops = count = compute_bound = 0
    per_request: dict[str, float] = {}
    decoding_s: dict[str, float] = {}  # per request, its decode, verify and draft steps only
    # Per request, the window's clock at the end of its target prefill and of its last step.
    first_token_at: dict[str, float] = {}
    last_step_at: dict[str, float] = {}
    by_phase: dict[str, dict[str, float]] = {}
    joules_by_phase = {"prefill": 0.0, "decode": 0.0, "verify": 0.0, "draft": 0.0}
    joules_by_model = {"target": 0.0, "draft": 0.0}
    work = {"verify": [0, 0], "decode": [0, 0]}  # target steps: [flops, bytes]
    for step in steps:
        count += 1  # steps is any iterable: counted as it is read
        model = str(step.get("model", "target"))
        phase = str(step.get("phase", "?"))
        cost = step_cost(
            step, gpu, pricing.shape(model), pricing.cuda_graph, pricing.traced_moe.get(model)
        )
        joules += cost.joules
        seconds += cost.seconds
        moved += cost.bytes
        flops += cost.flops
        compute_bound += cost.compute_bound
        entry = by_phase.setdefault(f"{model}:{phase}", {"steps": 0, "joules": 0.0, "seconds": 0.0})
        entry["steps"] += 1
        entry["joules"] += cost.joules
        entry["seconds"] += cost.seconds
        joules_by_phase[phase] = joules_by_phase.get(phase, 0.0) + cost.joules
        joules_by_model[model] = joules_by_model.get(model, 0.0) + cost.joules
        if model == "target" and phase in work:
            work[phase][0] += cost.flops
            work[phase][1] += cost.bytes
        for rid in step.get("rids", ()):
            per_request[str(rid)] = per_request.get(str(rid), 0.0) + cost.seconds
            if phase != "prefill":
                decoding_s[str(rid)] = decoding_s.get(str(rid), 0.0) + cost.seconds
            if phase == "prefill" and model == "target":
                first_token_at.setdefault(str(rid), seconds)
            last_step_at[str(rid)] = seconds
    # The verify step's intensity; a plain engine's "verify step" is its decode step (1 token).
    phase = "verify" if work["verify"][1] else ("decode" if work["decode"][1] else None)
    verify_intensity = _intensity(*work[phase]) if phase else None
    decoding = joules_by_phase["decode"] + joules_by_phase["verify"] + joules_by_phase["draft"]
    details = {
        "steps": count,
        "bytes": moved,
        "flops": flops,
        "arithmetic_intensity": flops / moved if moved else 0.0,
        "compute_bound_steps": compute_bound,
        "by_phase": by_phase,
        **pricing.describe(),
        "verify_intensity": verify_intensity,
        "intensity_phase": phase,
        "decode_intensity": _intensity(*work["decode"]),
        "balance_point": gpu.balance_point,
        "compute_bound": verify_intensity > gpu.balance_point
        if verify_intensity is not None
        else None,
        "joules_by_phase": joules_by_phase,
        "joules_by_model": joules_by_model,
        "draft_share": joules_by_phase["draft"] / decoding if decoding else None,
    }
    visible = {rid: last_step_at[rid] - at for rid, at in first_token_at.items()}
    return EnergyWindow(
        joules,
        seconds,
        pricing.label,
        per_request,
        details,
        decoding_s,
        request_visible_seconds=visible,
    )


#: Why identical repeats of a modeled arm differ at batch > 1 (the run document's meter ``noise``;
#: the figures: benchmarks/results/modeled_batch_noise.txt).
BATCH_NOISE = (
    "the same steps price the same: at batch 1 every repeat runs the same steps, and the figures "
    "are exact. At batch > 1 a window closes the first time a request finishes with the pool "
    "empty, and where the others are cut then depends on the step each refill joined (one HTTP "
    "round trip each): the window holds a different share of each answer (the sample's "
    "coverage), and with it tokens drafted at different accept lengths (n-gram drafts are "
    "accepted more late in an answer), so J/token moves between repeats though every step is "
    "batched alike (rows per step stay at the batch); the gate judges those repeats with their "
    "spread, never as exact"
)


class ModeledMeter:
    """``modeled:<gpu>``: energy from the reference server's work trace; ``modeled:<gpu>:<shape>``
    (or ``priced_as=``) overrides what the server declares, as :func:`pricing_for`'s ``override``
    does."""

    # The trace is exact, so any window is long enough.
    min_window_s = 0.0

    def __init__(self, gpu: str = "h200", priced_as: str | None = None) -> None:
        gpu_name, _, suffix = gpu.partition(":")
        if gpu_name not in PRESETS:
            raise MeterError(
                f"no GPU preset {gpu_name!r} for the modeled meter; expected one of "
                f"{', '.join(sorted(PRESETS))}"
            )
        self.gpu = PRESETS[gpu_name]
        self.override = priced_as or suffix or None
        if self.override:
            _resolve(self.override)  # fail now, not at the first window
        self.kind = f"modeled:{gpu}"
        #: The label of the engine measured last (``modeled (h200, priced as Qwen3-8B)``).
        self.label = f"modeled ({gpu_name})"
        self._cursors: dict[int, int] = {}
        self._pricing: dict[int, Pricing] = {}
        self.labels: list[str] = []

    def describe(self) -> dict[str, Any]:
        """The preset constants, the balance point, the step overhead, the calibration the constants
        come from (its data and version) and how engines were priced."""
        return {
            "kind": self.kind,
            "label": self.label,
            "preset": asdict(self.gpu),
            "balance_point_flop_per_byte": round(self.gpu.balance_point, 1),
            "step_overhead": {
                "fixed_step_s": self.gpu.fixed_step_s,
                "eager_kernel_launch_s": _roofline.KERNEL_LAUNCH_S,
                "self_priced_s": self.gpu.step_overhead_s,
            },
            "calibration": self.gpu.calibration.to_json() if self.gpu.calibration else None,
            "priced_as_override": self.override,
            "labels": list(self.labels),
            "noise": BATCH_NOISE,
        }

    def pricing(self, engine: Any) -> Pricing:
        """How ``engine``'s steps are priced (read once from its ``/server_info``)."""
        key = id(engine)
        if key not in self._pricing:
            info = getattr(engine, "server_info", None)
            if callable(info):
                info = None  # a client, not a record: fetching is the engine's job, not the meter's
            self._pricing[key] = pricing_for(self.gpu, info, engine, self.override)
        return self._pricing[key]

    def _advance(self, engine: EngineHandle) -> list[dict[str, Any]]:
        self._cursors[id(engine)], steps = engine.work_trace(self._cursors.get(id(engine), 0))
        return steps

    def start(self, engine: EngineHandle) -> Any:
        """Skip past everything recorded so far (warm-up, earlier windows)."""
        if not hasattr(engine, "work_trace"):
            raise MeterError(
                f"the modeled meter needs an engine with a work trace (the reference server), not "
                f"{engine.config.engine}; use --specenergy-meter=nvml"
            )
        self._advance(engine)
        pricing = self.pricing(engine)
        self.label = pricing.label
        if pricing.label not in self.labels:
            self.labels.append(pricing.label)
        return engine

    def stop(self, token: Any) -> EnergyWindow:
        """Model the steps recorded since :meth:`start`."""
        steps = self._advance(token)
        pricing = self.pricing(token)
        self.label = pricing.label
        # The target's prefill forwards only: a draft model's prefill of the same prompts exists
        # because of speculation, so it stays in the speculative arm's decode energy (issue 41:
        # 0.6-8% of it, charged to no one before).
        prefill = window_from_steps(
            [
                s
                for s in steps
                if s.get("phase") == "prefill" and s.get("model", "target") == "target"
            ],
            self.gpu,
            pricing,
        )
        return replace(window_from_steps(steps, self.gpu, pricing), prefill_only=prefill)

    def close(self) -> None:
        """Nothing to release."""
