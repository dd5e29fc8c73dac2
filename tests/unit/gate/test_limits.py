"""Fail expressions: every accepted form, every rejected form with a message that helps."""

from __future__ import annotations

import argparse

import pytest

from pytest_specenergy.gate.limits import GATE_METRICS
from pytest_specenergy.gate.limits import FailExprError
from pytest_specenergy.gate.limits import merge_limits
from pytest_specenergy.gate.limits import parse_fail_expr


@pytest.mark.parametrize(
    "text, metric, stat, threshold, relative",
    [
        ("energy_per_token:5%", "energy_per_token", "median", 0.05, True),
        ("energy:5%", "energy_ratio", "median", 0.05, True),  # the session-robust default
        ("ratio:5%", "energy_ratio", "median", 0.05, True),
        ("epat:median:2.5%", "energy_per_token", "median", 0.025, True),
        ("accept_length:median:0.1", "accept_length", "median", 0.1, False),
        ("acceptance:0.2", "accept_length", "median", 0.2, False),
        ("accept:mean:10%", "accept_length", "mean", 0.10, True),
        ("acceptance_rate:0.02", "acceptance_rate", "median", 0.02, False),
        ("tbt_ms:mean:10%", "tbt_ms", "mean", 0.10, True),
        ("tbt_ms:max:1.5", "tbt_ms", "max", 1.5, False),
        ("energy_per_token:MIN:1e-3", "energy_per_token", "min", 0.001, False),
        ("equivalence:0", "equivalence", "median", 0.0, False),
        # Fractions that can sit at or cross zero: N% means N percentage points.
        ("energy_saving:2%", "energy_saving", "median", 0.02, False),
        ("energy_saving:0.02", "energy_saving", "median", 0.02, False),
        ("  Energy : 5% ", "energy_ratio", "median", 0.05, True),
    ],
)
def test_valid_expressions(text, metric, stat, threshold, relative):
    limit = parse_fail_expr(text)
    assert (limit.metric, limit.stat, limit.relative) == (metric, stat, relative)
    assert limit.threshold == pytest.approx(threshold)
    assert limit.expr == text.strip()


def test_worse_directions():
    up = {m for m, info in GATE_METRICS.items() if info.worse == "up"}
    down = {m for m, info in GATE_METRICS.items() if info.worse == "down"}
    assert up == {"energy_ratio", "energy_per_token", "tbt_ms"}
    assert down == {"accept_length", "acceptance_rate", "energy_saving", "equivalence", "speedup"}


def test_worse_amount_is_positive_only_in_the_worse_direction():
    energy = parse_fail_expr("energy:5%")
    assert energy.worse_amount(1.0, 1.2) == pytest.approx(0.2)  # more energy: worse
    assert energy.worse_amount(1.0, 0.8) == pytest.approx(-0.2)  # less energy: better
    accept = parse_fail_expr("accept_length:0.1")
    assert accept.worse_amount(2.5, 2.3) == pytest.approx(0.2)  # shorter accept: worse
    assert accept.worse_amount(2.5, 2.7) == pytest.approx(-0.2)
    saving = parse_fail_expr("energy_saving:2%")
    # 30% -> 27% saving is 3 points worse, beyond a 2-point limit.
    assert saving.worse_amount(0.30, 0.27) == pytest.approx(0.03)
    assert saving.worse_amount(-0.01, 0.01) < 0  # crossing zero is fine in points
    assert energy.describe() == "5% up"
    assert saving.describe() == "2 pts down"
    assert accept.describe() == "0.1 tokens/step down"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty fail expression"),
        ("energy", "has 0 ':' separators"),
        ("energy:median:5%:x", "has 3 ':' separators"),
        ("joules:5%", "unknown metric 'joules'"),
        ("energy:p99:5%", "unknown statistic 'p99'"),
        ("energy:-5%", "not a non-negative number"),
        ("energy:five%", "not a non-negative number"),
        ("energy:nan", "not a non-negative number"),
        ("energy:inf", "not a non-negative number"),
        ("energy:%", "not a non-negative number"),
        ("energy:", "not a non-negative number"),
        ("verified_per_step:1", "unknown metric"),  # has no better direction: cannot gate
    ],
)
def test_invalid_expressions_say_why_and_what_is_valid(text, fragment):
    with pytest.raises(FailExprError) as info:
        parse_fail_expr(text)
    message = str(info.value)
    assert fragment in message
    assert isinstance(info.value, ValueError)
    if "metric" in fragment or "separators" in fragment or "empty" in fragment:
        assert "METRIC[:STAT]:LIMIT" in message and "energy:5%" in message


def test_argparse_type_shows_our_message(capsys):
    parser = argparse.ArgumentParser(prog="pytest")
    parser.add_argument("--specenergy-compare-fail", type=parse_fail_expr, action="append")
    args = parser.parse_args(
        [
            "--specenergy-compare-fail=energy:5%",
            "--specenergy-compare-fail",
            "accept_length:median:0.1",
        ]
    )
    assert [lim.metric for lim in args.specenergy_compare_fail] == ["energy_ratio", "accept_length"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--specenergy-compare-fail=energy:lots"])
    err = capsys.readouterr().err
    assert "limit 'lots' is not a non-negative number" in err


def test_repeatable_later_overrides_earlier():
    limits = merge_limits(
        [parse_fail_expr(t) for t in ["ratio:5%", "accept:0.1", "energy:median:3%"]]
    )
    assert [(lim.metric, lim.threshold) for lim in limits] == [
        ("energy_ratio", 0.03),
        ("accept_length", 0.1),
    ]
