"""Latency targets as a gate: the lowest-energy configuration meeting a target, against a reference."""

from __future__ import annotations

import pytest

from pytest_specenergy.report.latency import latency_choices
from pytest_specenergy.report.latency import latency_regressions
from pytest_specenergy.report.rows import ReportRow

SRC = "modeled (h200, priced as Qwen3-8B)"


def row(drafter: str, batch: int, ept: float, tbt: float, base_ept: float, base_tbt: float,
        source: str = SRC) -> ReportRow:
    return ReportRow(case_id=f"code-{drafter}-b{batch}", model="m", drafter_id=drafter, drafter_name=drafter,
                     batch=batch, corpus="code", source=source, baseline_source=source,
                     baseline_energy_per_token=base_ept, energy_per_token=ept, energy_saving=None,
                     accept_length=None, acceptance_rate=None, verified_per_step=None,
                     baseline_tbt_ms=base_tbt, tbt_ms=tbt, speedup=None, exact_fraction=1.0,
                     logprob_gap=0.0)


MAIN = [row("ngram", 1, 1.0, 2.0, 1.7, 3.5), row("ngram", 16, 0.20, 4.0, 0.25, 4.5)]


def test_the_choice_is_the_lowest_energy_configuration_meeting_the_target():
    [tight, loose] = latency_choices(MAIN, [3.0, 5.0])
    assert tight.choice.label == "ngram b1"  # only speculation at batch 1 meets 3 ms
    assert loose.choice.label == "ngram b16"  # batching is cheaper once the target allows it


def test_a_target_whose_best_configuration_got_costlier_fails_naming_both():
    head = [row("ngram", 1, 1.2, 2.0, 1.7, 3.5), row("ngram", 16, 0.20, 4.0, 0.25, 4.5)]
    [found] = latency_regressions(head, MAIN, [3.0, 5.0], tolerance=0.05)
    assert found.target_ms == 3.0 and found.change == pytest.approx(0.2)
    assert "now ngram b1 at 1.2 J/token, +20.0% against the reference's ngram b1 at 1 J/token" in found.message()
    assert latency_regressions(head, MAIN, [3.0], tolerance=0.25) == []  # inside tolerance
    assert latency_regressions(MAIN, MAIN, [3.0, 5.0], tolerance=0.0) == []  # unchanged


def test_a_target_no_configuration_meets_any_more_fails():
    slow = [row("ngram", 1, 1.0, 3.4, 1.7, 3.5), row("ngram", 16, 0.20, 4.0, 0.25, 4.5)]
    [found] = latency_regressions(slow, MAIN, [3.0], tolerance=0.05)
    assert found.current is None and "no tested configuration meets the target any more" in found.message()
    assert "ngram b1" in found.message()


def test_figures_from_different_meters_are_never_compared():
    nvml = [row("ngram", 1, 1.0, 2.0, 1.7, 3.5, source="measured (nvml)")]
    with pytest.raises(ValueError, match="cannot be compared"):
        latency_regressions(nvml, MAIN, [3.0], tolerance=0.05)
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        latency_regressions(MAIN, MAIN, [3.0], tolerance=-1)
