"""The modeled meter prices each forward of a work trace at the real shape the server declares."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_specenergy.meters import roofline
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.modeled import PRESETS
from pytest_specenergy.meters.modeled import ModeledMeter
from pytest_specenergy.meters.modeled import TracedMoe
from pytest_specenergy.meters.modeled import pricing_for
from pytest_specenergy.meters.modeled import step_cost
from pytest_specenergy.meters.prediction import predict
from pytest_specenergy.meters.shapes import SHAPES

H200 = PRESETS["h200"]
DENSE_INFO = {
    "model_path": "tiny:dense",
    "priced_as": {"target": "qwen3-8b", "draft": "qwen3-0.6b"},
}
MOE_INFO = {
    "model_path": "tiny:moe",
    "priced_as": {"target": "qwen3-30b-a3b"},
    "model_shape": {"num_experts": 16, "num_experts_per_tok": 2, "num_layers": 4},
}


def trace_step(
    rows: int,
    tokens: int,
    context: int = 260,
    phase: str = "verify",
    model: str = "target",
    rid0: int = 0,
    **extra,
) -> dict:
    """A work-trace step as the reference server serves it (tiny-model bytes: ignored when priced)."""
    return {
        "phase": phase,
        "model": model,
        "rids": [f"r{rid0 + i}" for i in range(rows)],
        "query_tokens": [tokens] * rows,
        "context_lens": [context] * rows,
        "weight_bytes": 1000,
        "kv_bytes": 10,
        "flops": 2000,
        **extra,
    }


class FakeEngine:
    """An engine handle with a ``/server_info`` record and a trace the test appends to."""

    def __init__(self, info: dict | None = None, options: tuple = ()):
        self.server_info = info or {}
        self.config = SimpleNamespace(engine="reference", options=options)
        self.steps: list[dict] = []

    def work_trace(self, start):
        return len(self.steps), self.steps[start:]


def window(engine: FakeEngine, steps: list[dict], gpu: str = "h200"):
    meter = ModeledMeter(gpu)
    token = meter.start(engine)
    engine.steps += steps
    return meter, meter.stop(token)


# --- labels and what is priced -----------------------------------------------------------------
def test_label_names_the_gpu_and_the_shape_priced():
    meter, win = window(FakeEngine(DENSE_INFO), [trace_step(1, 1, phase="decode")])
    assert win.source == meter.label == "modeled (h200, priced as Qwen3-8B)"
    assert win.details["priced_as"] == {"target": "Qwen3-8B", "draft": "Qwen3-0.6B"}
    assert win.details["cuda_graph"] is True
    assert "modeled (h200, priced as Qwen3-8B)" in meter.describe()["labels"]


def test_priced_steps_ignore_the_tiny_bytes_of_the_trace():
    _, win = window(FakeEngine(DENSE_INFO), [trace_step(1, 1, phase="decode")])
    assert win.details["bytes"] > 15e9  # Qwen3-8B's weights, not the trace's 1010 bytes
    assert 3.3e-3 < win.seconds < 4.5e-3


def test_without_a_declared_shape_the_trace_prices_itself_and_says_so():
    _, win = window(FakeEngine({"model_path": "tiny:dense"}), [trace_step(1, 1, phase="decode")])
    assert win.source == "modeled (h200, priced as tiny model)"
    assert win.details["priced_as"] == "self"
    assert win.joules == pytest.approx(step_cost(trace_step(1, 1), H200).joules)
    _, real = window(
        FakeEngine({"model_path": "/models/qwen3-8b"}), [trace_step(1, 1, phase="decode")]
    )
    assert real.source == "modeled (h200, priced as served model)"


def test_self_override_restores_the_tiny_models_own_size():
    meter = ModeledMeter("h200:self")
    engine = FakeEngine(DENSE_INFO)
    token = meter.start(engine)
    engine.steps.append(trace_step(1, 1, phase="decode"))
    win = meter.stop(token)
    assert win.source == "modeled (h200, priced as tiny model)"
    assert win.details["bytes"] == 1010
    assert (
        ModeledMeter("h100", priced_as="qwen3-4b").pricing(engine).label
        == "modeled (h100, priced as Qwen3-4B)"
    )


def test_unknown_shapes_are_errors_naming_the_known_ones():
    with pytest.raises(MeterError, match="qwen3-8b"):
        ModeledMeter("h200:llama-9000")
    with pytest.raises(MeterError, match="priced as 'gpt-5'.*qwen3-4b"):
        ModeledMeter("h200").start(FakeEngine({"priced_as": {"target": "gpt-5"}}))


def test_undeclared_draft_is_priced_at_its_own_size():
    pricing = pricing_for(H200, {"priced_as": {"target": "qwen3-8b"}})
    assert pricing.shape("target") is SHAPES["qwen3-8b"] and pricing.shape("draft") is None
    assert pricing_for(H200, {"priced_as": "qwen3-4b"}).shape("target") is SHAPES["qwen3-4b"]


# --- CUDA graphs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("info", "options"),
    [
        ({"cuda_graph": False}, ()),
        ({"disable_cuda_graph": True}, ()),
        ({}, (("disable_cuda_graph", True),)),
    ],
)
def test_cuda_graphs_off_pays_a_launch_per_kernel(info, options):
    on = window(FakeEngine(DENSE_INFO), [trace_step(1, 1, phase="decode")])[1]
    off = window(FakeEngine({**DENSE_INFO, **info}, options), [trace_step(1, 1, phase="decode")])[1]
    assert off.source == "modeled (h200, priced as Qwen3-8B, no CUDA graphs)"
    assert off.details["cuda_graph"] is False
    # Both pay the preset's fixed step cost; without graphs every kernel's launch on top.
    extra = roofline.KERNEL_LAUNCH_S * (36 * 10 + 4)
    assert off.seconds - on.seconds == pytest.approx(extra)
    assert off.joules > on.joules


# --- what the plugin reads from a window -------------------------------------------------------
def test_window_reports_verify_intensity_balance_point_and_compute_bound():
    _, small = window(FakeEngine({"priced_as": "qwen3-4b"}), [trace_step(1, 16)])
    assert small.details["intensity_phase"] == "verify"
    assert small.details["verify_intensity"] == pytest.approx(16.1, abs=0.2)
    assert small.details["balance_point"] == pytest.approx(163)
    assert small.details["compute_bound"] is False
    _, big = window(FakeEngine({"priced_as": "qwen3-4b"}), [trace_step(16, 16), trace_step(16, 16)])
    assert big.details["compute_bound"] is True
    expected = predict(SHAPES["qwen3-4b"], 16, 260, "h200", batches=[16])[0].verify_intensity
    assert big.details["verify_intensity"] == pytest.approx(expected)


def test_a_plain_engines_verify_step_is_its_decode_step():
    _, win = window(
        FakeEngine(DENSE_INFO),
        [trace_step(4, 3, 0, phase="prefill"), trace_step(4, 1, phase="decode")],
    )
    assert win.details["intensity_phase"] == "decode"
    assert win.details["verify_intensity"] == win.details["decode_intensity"] < 10
    assert win.details["draft_share"] == 0.0


def test_joules_split_by_phase_and_model_and_the_draft_share():
    steps = [
        trace_step(2, 30, 0, phase="prefill"),
        trace_step(2, 30, 0, phase="prefill", model="draft"),
    ]
    steps += [trace_step(2, 1, phase="draft", model="draft") for _ in range(4)] + [trace_step(2, 5)]
    _, win = window(FakeEngine(DENSE_INFO), steps)
    phases, models = win.details["joules_by_phase"], win.details["joules_by_model"]
    assert sum(phases.values()) == pytest.approx(win.joules) == pytest.approx(sum(models.values()))
    assert phases["decode"] == 0.0 and phases["verify"] > 0 and phases["draft"] > 0
    assert win.details["draft_share"] == pytest.approx(
        phases["draft"] / (phases["draft"] + phases["verify"])
    )
    # Four Qwen3-0.6B passes cost well under one Qwen3-8B verify pass: verification dominates.
    assert 0.1 < win.details["draft_share"] < 0.5


def test_meter_and_prediction_agree_on_the_same_work():
    _, win = window(FakeEngine({"priced_as": "qwen3-4b"}), [trace_step(16, 16)])
    row = predict(SHAPES["qwen3-4b"], 16, 260, "h200", accept_length=2.0, batches=[16])[0]
    assert win.joules == pytest.approx(row.spec_joules_per_token * 16 * 2.0)
    assert win.seconds == pytest.approx(row.spec_step_s)


# --- the paper's first-order effects at real shapes --------------------------------------------
def draft_model_run(engine_info: dict, batch: int, k: int, accept: float, steps: int = 8) -> float:
    """J per committed token of a chain draft model: K one-token draft passes + a K+1 verify."""
    trace = []
    for i in range(steps):
        context = 260 + int(i * accept)
        trace += [trace_step(batch, 1, context + j, phase="draft", model="draft") for j in range(k)]
        trace.append(trace_step(batch, k + 1, context))
    return window(FakeEngine(engine_info), trace)[1].joules / (steps * batch * accept)


def baseline_run(engine_info: dict, batch: int, steps: int = 24) -> float:
    trace = [trace_step(batch, 1, 260 + i, phase="decode") for i in range(steps)]
    return window(FakeEngine(engine_info), trace)[1].joules / (steps * batch)


def test_a_draft_model_with_accept_length_near_3_saves_and_savings_shrink_with_batch():
    savings = [
        1 - draft_model_run(DENSE_INFO, b, 3, 2.9) / baseline_run(DENSE_INFO, b)
        for b in (1, 16, 64)
    ]
    assert savings[0] > 0.4  # paper s.4: single-stream savings around half of decode energy
    assert savings[0] > savings[1] > savings[2]


def test_tiny_model_pricing_made_drafting_look_dominant():
    # The regression this fixes: at the tiny size the fixed step overhead made the draft model lose.
    tiny = {"model_path": "tiny:dense"}
    assert 1 - draft_model_run(tiny, 1, 3, 2.9) / baseline_run(tiny, 1) < 0
    assert 1 - draft_model_run(DENSE_INFO, 1, 3, 2.9) / baseline_run(DENSE_INFO, 1) > 0


# --- MoE: experts touched, scaled to the real expert count -------------------------------------
def test_tiny_expert_counts_scale_to_the_real_model():
    shape, traced = SHAPES["qwen3-30b-a3b"], TracedMoe(16, 2, 4)
    one = step_cost(trace_step(1, 1, experts_touched=[2] * 4), H200, shape, traced=traced)
    same = step_cost(trace_step(1, 8, experts_touched=[2] * 4), H200, shape, traced=traced)
    spread = step_cost(trace_step(1, 8, experts_touched=[16] * 4), H200, shape, traced=traced)
    expert_bytes = shape.expert_params * shape.dtype_bytes * shape.layers
    # 8 tokens that all routed alike read what 1 token reads (8 experts per layer)...
    assert same.bytes - one.bytes < expert_bytes  # under one extra expert per layer
    # ...while 8 spread tokens read ~128 (1 - (15/16)^8) ~ 52 experts per layer.
    assert (spread.bytes - one.bytes) / expert_bytes == pytest.approx(52 - 8, abs=1.5)


def test_moe_verify_costs_more_than_dense_verify_relative_to_decode():
    def ratio(info: dict, touched: list | None) -> float:
        extra = {"experts_touched": touched} if touched else {}
        decode = window(
            FakeEngine(info),
            [trace_step(1, 1, phase="decode", **({"experts_touched": [2] * 4} if touched else {}))],
        )[1]
        verify = window(FakeEngine(info), [trace_step(1, 8, **extra)])[1]
        return verify.joules / decode.joules

    # Each spread verify token reads its own experts (the paper's n-gram-on-MoE loss); dense does
    # not.
    assert ratio(MOE_INFO, [16] * 4) > 2.0
    assert ratio(DENSE_INFO, None) < 1.1


# --- the real reference engine, end to end -----------------------------------------------------
@pytest.fixture(scope="module")
def reference_engines():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pytest_specenergy.refserver.engine import ReferenceEngine
    from pytest_specenergy.refserver.records import EngineConfig

    return {
        drafter: ReferenceEngine(
            EngineConfig(model="tiny:dense", drafter=drafter, num_draft_tokens=3)
        )
        for drafter in ("none", "draft_model")
    }


class EngineHandle:
    """The meter's view of an in-process reference engine."""

    def __init__(self, engine):
        self.engine = engine
        self.server_info = engine.server_info()
        self.config = SimpleNamespace(engine="reference", options=())

    def work_trace(self, start):
        cursor, steps = self.engine.trace.read(start)
        return cursor, [s.to_json() for s in steps]


def decode_joules_per_token(engine, batch: int) -> tuple[float, dict]:
    from pytest_specenergy.refserver.records import GenerationRequest
    from pytest_specenergy.refserver.records import SamplingParams

    handle = EngineHandle(engine)
    prompts = [
        "def forward(self, x):\n    return self.proj(x)\n\ndef",
        "The energy of the GPU per token is",
    ]
    requests = [
        GenerationRequest(
            tuple(engine.tokenizer.encode(prompts[i % 2] + " " * i)),
            SamplingParams(max_new_tokens=24, ignore_eos=True),
        )
        for i in range(batch)
    ]
    meter = ModeledMeter("h200")
    token = meter.start(handle)
    results = engine.generate(requests)
    win = meter.stop(token)
    phases = win.details["joules_by_phase"]
    decoded = sum(len(r.output_ids) for r in results) - batch  # the first token comes from prefill
    return (phases["decode"] + phases["verify"] + phases["draft"]) / decoded, win.details


def test_reference_engine_priced_as_qwen3_8b_shows_the_papers_effects(reference_engines):
    base = {b: decode_joules_per_token(reference_engines["none"], b) for b in (1, 4)}
    spec = {b: decode_joules_per_token(reference_engines["draft_model"], b) for b in (1, 4)}
    assert spec[1][1]["label"] == "modeled (h200, priced as Qwen3-8B)"
    assert spec[1][1]["priced_as"] == {"target": "Qwen3-8B", "draft": "Qwen3-0.6B"}
    saving = {b: 1 - spec[b][0] / base[b][0] for b in (1, 4)}
    assert saving[1] > 0.3 and saving[1] > saving[4]  # saves at batch 1, less at batch 4
    assert 1.0 < base[1][0] < 2.5  # J/token of Qwen3-8B decode at single stream on H200
    for b in (1, 4):
        assert 0.05 < spec[b][1]["draft_share"] < 0.45  # verification dominates on dense models


def test_every_tiny_model_declares_a_shape_the_meter_knows():
    pytest.importorskip("torch")
    from pytest_specenergy.refserver.tiny_models import TINY_MODELS
    from pytest_specenergy.refserver.tiny_models import priced_as_for

    assert {name: spec.priced_as for name, spec in TINY_MODELS.items() if not spec.draft_for} == {
        "tiny:dense": "qwen3-8b",
        "tiny:moe": "qwen3-30b-a3b",
        "tiny:hybrid": "qwen3.6-27b",
    }
    assert all(spec.priced_as in SHAPES for spec in TINY_MODELS.values())
    assert priced_as_for("tiny:dense", "tiny:dense-draft") == {
        "target": "qwen3-8b",
        "draft": "qwen3-0.6b",
    }
    assert priced_as_for("/models/my-checkpoint") is None
