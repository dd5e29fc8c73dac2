"""Latency targets as a gate: the lowest-energy configuration meeting a target, judged against a
reference run with the gate's own sequential rule on the configurations' per-repeat J/token."""

from __future__ import annotations

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.latency import LATENCY_LIMIT
from pytest_specenergy.gate.latency import compare_latency
from pytest_specenergy.gate.latency import latency_choices
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.verdict import Verdict

SRC = "modeled (h200, priced as Qwen3-8B)"
LIMIT, PLAN = parse_fail_expr(LATENCY_LIMIT), gate_plan()
WOBBLE = (1.0, 1.01, 0.99)


def _arm(ept: float, tbt: float, source: str) -> dict:
    samples = [
        {"decode_joules": ept * w * 100, "decode_seconds": 1.0, "decode_tokens": 100, "tbt_ms": tbt}
        for w in WOBBLE
    ]
    return {"source": source, "energy_per_token": ept, "tbt_ms": tbt, "samples": samples}


def row(
    drafter: str,
    batch: int,
    ept: float,
    tbt: float,
    base_ept: float,
    base_tbt: float,
    source: str = SRC,
) -> CaseRecord:
    return CaseRecord.from_dict(
        {
            "case_id": f"code-{drafter}-b{batch}",
            "source": source,
            "energy_per_token": ept,
            "tbt_ms": tbt,
            "case": {
                "model": "m",
                "batch": batch,
                "corpus": {"name": "code"},
                "drafter": {"id": drafter, "name": drafter},
            },
            "baseline": _arm(base_ept, base_tbt, source),
            "speculative": _arm(ept, tbt, source),
        }
    )


MAIN = [row("ngram", 1, 1.0, 2.0, 1.7, 3.5), row("ngram", 16, 0.20, 4.0, 0.25, 4.5)]


def test_the_choice_is_the_lowest_energy_configuration_meeting_the_target():
    [tight, loose] = latency_choices(MAIN, [3.0, 5.0])
    assert tight.choice.label == "ngram b1"  # only speculation at batch 1 meets 3 ms
    assert loose.choice.label == "ngram b16"  # batching is cheaper once the target allows it


def test_a_target_whose_best_configuration_got_costlier_regresses_naming_both():
    head = [row("ngram", 1, 1.2, 2.0, 1.7, 3.5), row("ngram", 16, 0.20, 4.0, 0.25, 4.5)]
    found = compare_latency(MAIN, head, [3.0, 5.0], LIMIT, PLAN)
    assert [c.verdict for c in found] == [Verdict.REGRESSED, Verdict.PASSED]
    message = found[0].failure_message("the reference run")
    assert "TBT <= 3 ms on m / code regressed" in message
    assert (
        "energy_per_token (median): baseline 1 J/token -> current 1.2 J/token, change +20.00%"
        in message
    )
    assert "lowest-energy configuration ngram b1 (reference: ngram b1)" in message
    assert found[0].rows[0].method.startswith("sequential welch-t")
    assert all(
        c.verdict is Verdict.PASSED for c in compare_latency(MAIN, MAIN, [3.0, 5.0], LIMIT, PLAN)
    )


def test_a_change_inside_the_limit_is_no_regression():
    head = [row("ngram", 1, 1.02, 2.0, 1.7, 3.5)]
    [found] = compare_latency(MAIN, head, [3.0], LIMIT, PLAN)
    assert found.verdict is not Verdict.REGRESSED


def test_a_target_no_configuration_meets_any_more_regresses():
    slow = [row("ngram", 1, 1.0, 3.4, 1.7, 3.5), row("ngram", 16, 0.20, 4.0, 0.25, 4.5)]
    [found] = compare_latency(MAIN, slow, [3.0], LIMIT, PLAN)
    assert found.verdict is Verdict.REGRESSED
    assert "no tested configuration meets the target any more" in found.reasons[0]
    assert "ngram b1" in found.reasons[0]


def test_figures_from_different_meters_are_never_compared():
    nvml = [row("ngram", 1, 1.0, 2.0, 1.7, 3.5, source="measured (nvml)")]
    [found] = compare_latency(MAIN, nvml, [3.0], LIMIT, PLAN)
    assert found.verdict is Verdict.INCOMPARABLE and "cannot be compared" in found.reasons[0]


def test_a_target_the_reference_could_not_meet_is_not_judged():
    assert compare_latency(MAIN, MAIN, [1.0], LIMIT, PLAN) == []
