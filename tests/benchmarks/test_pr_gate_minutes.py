"""benchmarks/pr_gate_minutes.py prints where the pull-request gate stands against its goal, from
the gate's own rule and the plan's own pricing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_prints_the_power_the_minutes_and_what_the_goal_would_take(capsys):
    spec = importlib.util.spec_from_file_location(
        "pr_gate_minutes", ROOT / "benchmarks" / "pr_gate_minutes.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["pr_gate_minutes"] = module
    spec.loader.exec_module(module)
    assert module.main() == 0
    out = capsys.readouterr().out
    assert "per-repeat noise 3%: power" in out and "90% flagged by repeat" in out
    assert "ci_gate as shipped: b1/16/64, 512 new tokens" in out
    assert "Goal: <= 10 GPU minutes per verdict at >= 90% power." in out
    stats = module.repeats_at_power(0.03, cases=400)
    assert stats["power"] >= 0.9 and stats["mean_repeats"] <= 11
