"""The gate's options: the sequential plan's cap, the FDR level and their checks."""

from __future__ import annotations

import argparse

import pytest

from pytest_specenergy.options import ALPHA
from pytest_specenergy.options import FDR
from pytest_specenergy.options import MAX_REPEATS
from pytest_specenergy.options import OPTIONS
from pytest_specenergy.options import _cap
from pytest_specenergy.options import add_cli_options


def test_the_cap_defaults_to_11_and_is_checked():
    assert _cap(0, 3) == 11
    assert _cap(0, 15) == 15  # never below the repeats already measured
    assert _cap(7, 3) == 7
    with pytest.raises(
        pytest.UsageError, match=r"the cap \(2\) must be at least --specenergy-repeats \(3\)"
    ):
        _cap(2, 3)
    # 60 looks would spend more than alpha on interim looks: the plan cannot be built.
    with pytest.raises(pytest.UsageError, match="--specenergy-max-repeats=121: interim_share"):
        _cap(121, 3)


def test_fdr_level_is_a_rate_in_0_1():
    assert FDR.parse("0.05") == 0.05
    for bad in ("0", "1", "-0.1", "x"):
        with pytest.raises(ValueError, match="a false-discovery rate between 0 and 1"):
            FDR.parse(bad)
    assert FDR in OPTIONS and FDR.default == ""  # off by default


def test_help_texts_state_the_stopping_rule_and_the_cap():
    assert "default 11" in MAX_REPEATS.help and "every 2 more" in MAX_REPEATS.help
    assert "--specenergy-inconclusive" in MAX_REPEATS.help
    assert "pending FDR" in FDR.help and "off by" in FDR.help
    assert "exactly at the limit" in ALPHA.help and ALPHA.default == 0.05


def test_cli_gate_options_render_and_parse():
    parser = argparse.ArgumentParser()
    add_cli_options(parser, gate=True)
    parser.format_help()  # %-formatting of every help text
    args = parser.parse_args(["--max-repeats", "7", "--alpha", "0.01"])
    assert (args.max_repeats, args.alpha) == (7, 0.01)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-repeats", "-1"])
