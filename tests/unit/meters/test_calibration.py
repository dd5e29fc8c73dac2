"""The presets say which measurements their constants were fitted to, and every modeled window and
meter description carries it (issue 41, item 5): calibrated and uncalibrated figures can be told
apart while each figure still reads ``modeled (<gpu>, ...)``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_specenergy.meters.calibration import ML_ENERGY_H100
from pytest_specenergy.meters.calibration import ML_ENERGY_H200
from pytest_specenergy.meters.modeled import PRESETS
from pytest_specenergy.meters.modeled import ModeledMeter
from pytest_specenergy.meters.modeled import Pricing
from pytest_specenergy.meters.modeled import window_from_steps
from pytest_specenergy.meters.roofline import BALANCE_POINTS
from pytest_specenergy.meters.roofline import roofline
from pytest_specenergy.meters.shapes import SHAPES

ROOT = Path(__file__).resolve().parents[3]


def test_each_preset_names_its_calibration_and_the_h200_says_it_is_transferred():
    assert PRESETS["h100"].calibration is ML_ENERGY_H100
    assert PRESETS["h200"].calibration is ML_ENERGY_H200
    assert ML_ENERGY_H100.transferred == "" and "H100" in ML_ENERGY_H200.transferred
    assert PRESETS["h100"].calibration_id == "mlenergy-v3-h100@0cd52da"
    assert "transferred to h200" in PRESETS["h200"].calibration_id
    assert replace(PRESETS["h100"], calibration=None).calibration_id == "uncalibrated"


def test_the_calibration_cites_data_that_is_in_the_repository():
    data = json.loads((ROOT / ML_ENERGY_H100.data).read_text())
    assert data["source"]["commit"].startswith("0cd52da")
    assert "Apache-2.0" in data["source"]["licence"]
    assert ML_ENERGY_H100.id.endswith(data["source"]["commit"][:7])


def test_the_same_die_shares_its_fit_and_keeps_the_papers_balance_points():
    h100, h200 = PRESETS["h100"], PRESETS["h200"]
    for gpu, preset in PRESETS.items():
        assert preset.balance_point == pytest.approx(BALANCE_POINTS[gpu])
    assert h200.peak_flops_per_s == h100.peak_flops_per_s
    assert (h200.static_w, h200.joules_per_flop, h200.fixed_step_s) == (
        h100.static_w,
        h100.joules_per_flop,
        h100.fixed_step_s,
    )
    assert h200.bandwidth_bytes_per_s > h100.bandwidth_bytes_per_s


def test_memory_and_compute_time_add_unless_the_preset_overlaps_them():
    gpu = PRESETS["h100"]
    moved, flops = 1e10, 1e12
    memory, compute = moved / gpu.bandwidth_bytes_per_s, flops / gpu.peak_flops_per_s
    assert roofline(moved, flops, 0.0, gpu).seconds == pytest.approx(memory + compute)
    textbook = replace(gpu, overlapped=True)
    assert roofline(moved, flops, 0.0, textbook).seconds == pytest.approx(max(memory, compute))


def test_windows_and_the_meter_description_record_the_calibration():
    step = {
        "phase": "decode",
        "model": "target",
        "rids": ["r0"],
        "query_tokens": [1],
        "context_lens": [260],
    }
    gpu = PRESETS["h200"]
    win = window_from_steps([step], gpu, Pricing(gpu, {"target": SHAPES["qwen3-8b"]}))
    assert win.source == "modeled (h200, priced as Qwen3-8B)"
    assert win.details["calibration"] == gpu.calibration_id
    described = ModeledMeter("h200").describe()
    assert described["calibration"]["id"] == gpu.calibration_id
    assert described["calibration"]["data"] == "benchmarks/data/mlenergy_v3_h100.json"
    assert described["step_overhead"]["fixed_step_s"] == gpu.fixed_step_s
    json.dumps(described)  # it goes into the run document as it is
