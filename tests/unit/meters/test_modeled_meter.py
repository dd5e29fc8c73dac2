"""The modeled meter on synthetic traces priced at the trace's own size (``priced_as="self"``).

These steps carry their own bytes and FLOPs (an 8B-like model), so the roofline itself is tested
here; pricing at real shapes is in ``test_modeled_pricing.py``.
"""

from __future__ import annotations

import pytest

from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.modeled import PRESETS
from pytest_specenergy.meters.modeled import ModeledMeter
from pytest_specenergy.meters.modeled import step_cost
from pytest_specenergy.meters.modeled import window_from_steps

# An 8B-parameter dense model at bf16, 36 layers, 8 KV heads of 128.
PARAMS = 8e9
KV_BYTES_PER_TOKEN = 2 * 36 * 8 * 128 * 2


def step(rows: int, tokens_per_row: int, context: int = 260, phase: str = "verify") -> dict:
    query = rows * tokens_per_row
    return {
        "phase": phase,
        "model": "target",
        "rids": [f"r{i}" for i in range(rows)],
        "query_tokens": [tokens_per_row] * rows,
        "context_lens": [context] * rows,
        "weight_bytes": int(2 * PARAMS),
        "kv_bytes": int(rows * (context + tokens_per_row) * KV_BYTES_PER_TOKEN),
        "flops": int(2 * PARAMS * query),
    }


def energy_per_token(rows: int, verified: int, accept_length: float, gpu: str = "h200") -> float:
    """J per committed token of one step that commits accept_length tokens per row."""
    cost = step_cost(step(rows, verified), PRESETS[gpu])
    return cost.joules / (rows * accept_length)


def test_memory_bound_verify_costs_about_a_decode_step():
    decode = step_cost(step(1, 1, phase="decode"), PRESETS["h200"])
    verify = step_cost(step(1, 5), PRESETS["h200"])
    assert not verify.compute_bound
    # Calibrated, a step's compute time adds to its memory time: 4 more tokens' math is ~2.5% of
    # an 8B step at single stream.
    assert verify.seconds == pytest.approx(decode.seconds, rel=0.03)
    assert verify.joules == pytest.approx(decode.joules, rel=0.05)


def test_savings_follow_accepted_tokens():
    baseline = energy_per_token(1, 1, 1.0)
    low = 1 - energy_per_token(1, 5, 1.5) / baseline
    high = 1 - energy_per_token(1, 5, 3.5) / baseline
    assert 0.25 < low < high < 0.75


def test_batching_amortises_weight_bytes():
    assert energy_per_token(16, 1, 1.0) < energy_per_token(1, 1, 1.0) / 5


def test_large_batch_block_drafter_turns_compute_bound_and_loses():
    # DFlash-16-like: 16 verified tokens per row, under 3 accepted (paper s.9).
    verify = step_cost(step(64, 16), PRESETS["h200"])
    assert verify.compute_bound
    saving = 1 - energy_per_token(64, 16, 2.8) / energy_per_token(64, 1, 1.0)
    assert saving < 0
    # ...while at single stream the same drafter still saves.
    assert 1 - energy_per_token(1, 16, 2.8) / energy_per_token(1, 1, 1.0) > 0


def test_balance_point_differs_between_gpus():
    # 16 rows x 16 tokens = 256 FLOP/byte on weights: past H200's 163, short of H100's 316.
    assert PRESETS["h200"].balance_point == pytest.approx(163)
    assert PRESETS["h100"].balance_point == pytest.approx(316)
    assert step_cost(step(16, 16), PRESETS["h200"]).compute_bound
    assert not step_cost(step(16, 16), PRESETS["h100"]).compute_bound


def test_window_sums_steps_and_attributes_time_per_request():
    steps = [step(2, 1, phase="prefill"), step(2, 3), step(1, 3)]
    steps[2]["rids"] = ["r0"]
    window = window_from_steps(steps, PRESETS["h200"])
    costs = [step_cost(s, PRESETS["h200"]) for s in steps]
    assert window.joules == pytest.approx(sum(c.joules for c in costs))
    assert window.request_seconds["r0"] == pytest.approx(sum(c.seconds for c in costs))
    assert window.request_seconds["r1"] == pytest.approx(costs[0].seconds + costs[1].seconds)
    # Time between tokens counts the decode steps only, never the request's prefill.
    assert window.request_decode_seconds["r0"] == pytest.approx(costs[1].seconds + costs[2].seconds)
    assert window.request_decode_seconds["r1"] == pytest.approx(costs[1].seconds)
    assert window.source == "modeled (h200, priced as tiny model)"
    assert window.details["steps"] == 3
    assert window.details["priced_as"] == "self"


def test_malformed_step_is_an_error_not_zero():
    with pytest.raises(MeterError, match="weight_bytes"):
        step_cost({"phase": "decode"}, PRESETS["h200"])


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(MeterError, match="h100, h200"):
        ModeledMeter("a100")


def test_self_pricing_keeps_the_fixed_overhead_of_the_old_meter():
    gpu = PRESETS["h200"]
    cost = step_cost(step(1, 1), gpu)
    moved = 2 * PARAMS + 261 * KV_BYTES_PER_TOKEN
    flops = 2 * PARAMS
    # Its own 12 us, not the calibrated fixed step cost of a real shape.
    assert cost.seconds == pytest.approx(
        moved / gpu.bandwidth_bytes_per_s + flops / gpu.peak_flops_per_s + 12e-6
    )


class FakeTraceEngine:
    """An engine handle whose trace grows as the test appends steps."""

    def __init__(self):
        self.steps: list[dict] = []

    def work_trace(self, start):
        return len(self.steps), self.steps[start:]


def test_meter_window_covers_only_steps_since_start():
    engine = FakeTraceEngine()
    engine.steps.append(step(1, 1))  # warm-up: outside the window
    meter = ModeledMeter("h100")
    token = meter.start(engine)
    engine.steps += [step(1, 1), step(1, 1)]
    window = meter.stop(token)
    assert window.details["steps"] == 2
    # The fake engine declares no shape: priced at the trace's own size, and the label says so.
    assert window.source == meter.label == "modeled (h100, priced as tiny model)"


def test_a_draft_models_prefill_is_not_in_the_prefill_only_window():
    """Issue 41 item 2: the draft model's prefill of the prompts exists because of speculation;
    the prefill-only window (what the twin subtracts) is the target's prefill alone. Before, both
    were subtracted and 0.6-8% of the speculative arm's decode energy was charged to no one."""
    engine = FakeTraceEngine()
    meter = ModeledMeter("h200")
    token = meter.start(engine)
    target, draft = step(2, 1, phase="prefill"), step(2, 1, phase="prefill")
    draft["model"] = "draft"
    draft["weight_bytes"] //= 10
    engine.steps += [target, draft, step(2, 3)]
    window = meter.stop(token)
    prefill = window.prefill_only
    assert prefill.joules == pytest.approx(step_cost(target, PRESETS["h200"]).joules)
    assert window.joules - prefill.joules == pytest.approx(
        step_cost(draft, PRESETS["h200"]).joules + step_cost(step(2, 3), PRESETS["h200"]).joules
    )


def test_a_request_waits_through_every_step_after_its_first_token():
    """Issue 41 item 3: the time a user sees between tokens runs from the end of its prefill to
    the end of its last step, another request's refill prefill in between included; its own
    decode time leaves that prefill out."""
    steps = [step(1, 1, phase="prefill"), step(1, 3), step(1, 1, phase="prefill"), step(2, 3)]
    steps[2]["rids"], steps[3]["rids"] = ["r1"], ["r0", "r1"]
    window = window_from_steps(steps, PRESETS["h200"])
    costs = [step_cost(s, PRESETS["h200"]).seconds for s in steps]
    assert window.request_visible_seconds["r0"] == pytest.approx(sum(costs[1:]))
    assert window.request_decode_seconds["r0"] == pytest.approx(costs[1] + costs[3])
    assert window.request_visible_seconds["r1"] == pytest.approx(costs[3])
