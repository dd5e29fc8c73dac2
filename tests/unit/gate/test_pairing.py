"""Blocked cases whose limit no block-drift allowance leaves room in are refused up front."""

from __future__ import annotations

import pytest

from pytest_specenergy.gate.limits import DEFAULT_BLOCK_DRIFT
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.pairing import allowance_refusal
from pytest_specenergy.gate.pairing import allowance_refusals

DEFAULTS = [parse_fail_expr(e) for e in ("energy_ratio:5%", "accept_length:5%", "equivalence:0")]


def refusal(limits, sides):
    return allowance_refusal(
        "t.py::test[x]", limits, why_blocked="one GPU", block_drift=DEFAULT_BLOCK_DRIFT, sides=sides
    )


def test_a_stored_comparison_of_blocked_runs_at_the_default_limit_is_refused_naming_the_fix():
    # Two blocked runs allow 1.03^2 - 1 = 6.1% either way: a 5% limit can never be met.
    message = refusal(DEFAULTS, sides=2)
    assert message is not None and "6.1%" in message and "energy_ratio:5%" in message
    assert "resident=True" in message and "reference_drafter" in message
    assert "energy_ratio:8%" in message  # a limit that leaves room


def test_a_limit_beyond_the_allowance_and_a_limit_drift_does_not_move_pass():
    assert refusal(DEFAULTS, sides=1) is None  # in-job: 3% allowed, 5% leaves room
    assert refusal([parse_fail_expr("energy_ratio:3%")], sides=1) is not None  # at it: refused
    assert refusal([parse_fail_expr("accept_length:1%")], sides=2) is None  # counters: no drift
    assert refusal([parse_fail_expr("energy_ratio:7%")], sides=2) is None


def test_only_blocked_tests_are_judged():
    tests = [("a", DEFAULTS, None), ("b", DEFAULTS, "one GPU")]
    [only] = allowance_refusals(tests, DEFAULT_BLOCK_DRIFT, sides=2)
    assert only.startswith("b: ")


SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [pytest.mark.model("tiny:dense", device="cuda"), pytest.mark.corpus("code"),
              pytest.mark.generation(max_new_tokens=8, prompts=3)]

@pytest.mark.drafter("ngram")
@pytest.mark.reference_drafter(Drafter("ngram", num_draft_tokens=4))
@pytest.mark.batch(1)
@pytest.mark.tolerance(energy_ratio="LIMIT")
def test_ab(spec_pair):
    spec_pair.measure()
"""


@pytest.mark.parametrize("limit", ["3%", "4%"])
def test_the_session_refuses_it_at_collection_before_any_engine_starts(
    pytester: pytest.Pytester, limit: str
):
    """A reference engine on a GPU runs one engine at a time (blocked): an in-job A/B allows 3%.
    Collection ends there; nothing is measured (no CUDA here: a started engine would fail)."""
    pytester.makepyfile(SUITE.replace("LIMIT", limit))
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only")
    if limit == "3%":
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*test_ab*blocked order*3.0%*energy_ratio:3%*"])
    else:
        assert result.ret == pytest.ExitCode.OK
