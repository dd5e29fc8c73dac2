"""Help texts stay true to the tables the code checks against: every choice an option's parser
accepts is named in its ``--help`` (the fault list, the golden modes, the check modes, ...)."""

from __future__ import annotations

import re

import pytest

from pytest_specenergy.meters.roofline import PRESETS
from pytest_specenergy.options import OPTIONS
from pytest_specenergy.options import _choice
from pytest_specenergy.options import _Option
from pytest_specenergy.options import help_drift
from pytest_specenergy.refserver.faults import FAULTS


def test_every_choice_valued_option_names_its_choices():
    assert help_drift() == []


def test_the_check_sees_each_kind_of_choice():
    checked = {opt.name: list(getattr(opt.parse, "choices", ())) for opt in OPTIONS}
    assert checked["fault"] == list(FAULTS) and "numerical-noise" in checked["fault"]
    assert checked["golden"] == ["check", "update", "regen-all", "new-only"]
    assert checked["checks"] == ["fail", "warn"]
    assert sum(1 for choices in checked.values() if choices) >= 9


def test_a_drifted_help_text_is_caught():
    drifted = _Option(
        "checks",
        "fail",
        "what a tripped check does: fail or warn",
        _choice(("fail", "warn", "xfail")),
    )
    assert help_drift([drifted]) == ["--specenergy-checks: the help does not name 'xfail'"]
    # A word inside another (warn in warning, regen in regen-all) does not count as naming it.
    inside = _Option("x", "", "warnings only; regen-all", _choice(("warn", "regen")))
    assert len(help_drift([inside])) == 2
    meter = next(o for o in OPTIONS if o.name == "meter")
    assert "h200" in PRESETS
    assert help_drift(
        [_Option("meter", "auto", meter.help.replace("h200", "h2OO"), meter.parse)]
    ) == ["--specenergy-meter: the help does not name 'h200'"]


def test_pytest_help_shows_every_fault(pytester: pytest.Pytester):
    result = pytester.runpytest("--help")
    text = re.sub(r"\s+", " ", result.stdout.str())
    fault_help = text[text.index("--specenergy-fault") :][:1500]
    for fault in FAULTS:
        # help lines wrap at hyphens
        assert re.search(fault.replace("-", r"-\s?"), fault_help), fault
