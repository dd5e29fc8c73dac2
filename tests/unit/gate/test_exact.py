"""A deterministic meter's figures have no spread: the gate says the change is exact, and shows
no p-value (it would read p=0) and no zero-width "interval" (issue 40 item 5)."""

from __future__ import annotations

from pytest_specenergy.gate.compare import compare_metric
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.sequential import compare_paired
from pytest_specenergy.gate.sequential import compare_per_request
from pytest_specenergy.gate.sequential import compare_stored
from pytest_specenergy.gate.verdict import Verdict

LIMIT = parse_fail_expr("energy_ratio:5%")


def test_no_spread_on_either_side_is_an_exact_change_without_p_or_interval():
    result = compare_stored([0.66] * 3, [0.66] * 3, limit=0.05)
    assert result.exact and result.verdict is Verdict.UNCHANGED
    line = result.describe()
    assert "exact change +0.00%" in line and "p=" not in line and "[+0.00%, +0.00%]" not in line
    row = compare_metric(LIMIT, [0.60] * 3, [0.66] * 3)
    assert row.exact and row.verdict is Verdict.REGRESSED
    assert row.p_value is None and row.interval is None and row.as_dict()["exact"] is True
    assert "p=" not in row.describe() and "exact" in row.describe()


def test_a_spread_in_the_last_bits_is_no_spread():
    # A deterministic meter's repeats summed in another order differ by ~1e-16 relative: the
    # tutorial's +10.61% read "p=2.84e-31 ... interval [+10.61%, +10.61%]" before.
    noisy = [0.60 * (1 + k * 2e-16) for k in range(3)]
    row = compare_metric(LIMIT, noisy, [0.66 * (1 - k * 2e-16) for k in range(5)])
    assert row.exact and row.verdict is Verdict.REGRESSED
    assert row.p_value is None and row.interval is None and "p=" not in row.describe()
    paired = compare_paired([0.66, 0.66 * (1 + 3e-16), 0.66], [0.60] * 3, limit=0.05)
    assert paired.exact and "p=" not in paired.describe()


def test_any_spread_keeps_the_interval_and_the_p_value():
    result = compare_paired([0.66, 0.67, 0.66], [0.66, 0.66, 0.66], limit=0.05)
    assert not result.exact and "p=" in result.describe()
    row = compare_metric(LIMIT, [0.66, 0.661, 0.659], [0.66] * 3)
    assert not row.exact and row.p_value is not None and row.interval is not None
    assert "exact" not in row.as_dict() or row.as_dict()["exact"] is None


def test_a_block_drift_allowance_is_the_only_width_an_exact_change_gets():
    result = compare_stored([0.66] * 3, [0.66] * 3, limit=0.05, drift=0.0296)
    assert result.exact and result.interval[0] < 0 < result.interval[1]
    row = compare_metric(LIMIT, [0.66] * 3, [0.66] * 3, drift=0.03, unpaired="blocked order")
    assert row.exact and row.interval is not None and "block-drift allowance" in row.describe()


def test_a_deterministic_engines_per_request_figures_are_exact_too():
    result = compare_per_request([2, 3, 4], [1, 1, 1], [2, 3, 4], [1, 1, 1], limit=0.05)
    assert result.exact and result.verdict is Verdict.UNCHANGED and "p=" not in result.describe()
