"""Unit tests of the sequential gate rule, the t distribution and per-request comparisons."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pytest_specenergy.gate.fdr import bh_reject
from pytest_specenergy.gate.sequential import DEFAULT_PLAN
from pytest_specenergy.gate.sequential import REGRESSED
from pytest_specenergy.gate.sequential import SequentialPlan
from pytest_specenergy.gate.sequential import Verdict
from pytest_specenergy.gate.sequential import compare_paired
from pytest_specenergy.gate.sequential import compare_per_request
from pytest_specenergy.gate.sequential import compare_stored
from pytest_specenergy.gate.sequential import sequential_arrays
from pytest_specenergy.gate.tdist import t_ppf
from pytest_specenergy.gate.tdist import t_sf

# Noise pattern with mean 0 and sd 1 (fixed, so the tests are exact, not random).
PATTERN = np.array([0.9, -1.3, 0.4, 1.1, -0.6, -0.2, 1.4, -1.0, 0.3, -0.7, -0.3])
PATTERN = (PATTERN - PATTERN.mean()) / PATTERN.std(ddof=1)


def lognormal(change: float, sd: float, n: int = 11, shift: int = 0) -> np.ndarray:
    """exp(log(1 + change) + sd * pattern) - a deterministic 'sample'."""
    return np.exp(math.log1p(change) + sd * np.roll(PATTERN, shift)[:n])


# -- t distribution ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 10, 2.2281388519649385),
        (0.95, 2, 2.919985580353726),
        (0.999, 4, 7.173182219782),
        (0.975, math.inf, 1.959963984540054),
        (0.5, 3, 0.0),
        (0.01, 7.5, -2.9430993234067215),
    ],
)
def test_t_ppf_known_values(p: float, df: float, expected: float) -> None:
    assert float(t_ppf(p, df)) == pytest.approx(expected, abs=1e-7)


def test_t_sf_round_trips_and_is_symmetric() -> None:
    t = np.array([-6.0, -1.0, 0.0, 0.5, 3.0, 12.0])
    for df in (1.0, 2.5, 9.0, 40.0):
        sf = t_sf(t, df)
        assert np.allclose(sf + t_sf(-t, df), 1.0)
        assert np.allclose(t_ppf(1.0 - sf[1:-1], df), t[1:-1], atol=1e-6)
    assert t_sf(np.inf, 3.0) == 0.0 and t_sf(-np.inf, 3.0) == 1.0


def test_t_matches_scipy_when_available() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    t, df = rng.normal(0, 4, 500), rng.uniform(0.7, 60, 500)
    assert np.max(np.abs(t_sf(t, df) - stats.t.sf(t, df))) < 1e-10


def test_t_ppf_starts_near_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate solves two quantiles per look: from Fisher's expansion Newton needs at most 5 tail
    evaluations for df >= 3 (9 from the old start at -1), and lands on the root."""
    from pytest_specenergy.gate import tdist

    calls = []
    monkeypatch.setattr(tdist, "t_sf", lambda t, df: calls.append(1) or t_sf(t, df))
    for df in (3.0, 4.7, 11.0, 58.0):
        calls.clear()
        found = tdist.t_ppf(np.array([0.995, 0.9, 0.02]), df)
        assert len(calls) <= 5, (df, len(calls))
        for p, t in zip((0.995, 0.9, 0.02), found):
            assert float(t_sf(-t, df)) == pytest.approx(p, rel=1e-12)


def test_t_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        t_sf(1.0, 0.0)
    with pytest.raises(ValueError):
        t_ppf(1.0, 5.0)


# -- plan ------------------------------------------------------------------------------------
def test_default_plan_looks_and_spending() -> None:
    plan = DEFAULT_PLAN
    assert plan.looks == (3, 5, 7, 9, 11)
    assert sum(plan.weights) == pytest.approx(1.0)
    assert [plan.alpha_at(k) for k in range(1, 6)] == pytest.approx([0.001] * 4 + [0.046])
    assert (plan.look_for(2), plan.look_for(3), plan.look_for(6), plan.look_for(40)) == (0, 1, 2, 5)
    assert (plan.next_size(3), plan.next_size(10), plan.next_size(11)) == (5, 11, None)
    assert "3, 5, 7, 9, 11" in plan.describe()


def test_plan_variants_and_validation() -> None:
    assert SequentialPlan(start=3, step=3, cap=10).looks == (3, 6, 9, 10)
    assert SequentialPlan(spending="equal").weights == pytest.approx([0.2] * 5)
    assert SequentialPlan(start=5, cap=5).weights == (1.0,)
    # One look spends the whole alpha there: interim_share (checked only with interim looks) plays
    # no part.
    assert (
        SequentialPlan(start=5, cap=5, interim_share=float("inf")).alpha_at(1)
        == SequentialPlan().alpha
    )
    for bad in (
        {"start": 1},
        {"step": 0},
        {"cap": 2},
        {"alpha": 0.0},
        {"beta": 0.7},
        {"spending": "pocock"},
        {"interim_share": 0.3},
    ):
        with pytest.raises(ValueError):
            SequentialPlan(**bad)


# -- the rule on one case --------------------------------------------------------------------
def test_clear_regression_regresses_and_interval_is_beyond_the_limit() -> None:
    result = compare_paired(lognormal(0.20, 0.01), lognormal(0.0, 0.01, shift=3), limit=0.05)
    assert result.verdict is Verdict.REGRESSED
    assert result.interval[0] > 0.05
    assert result.estimate == pytest.approx(0.20, abs=0.01)
    assert result.more_repeats == 0 and result.p_value <= result.alpha_look


def test_unchanged_stops_early_as_unchanged() -> None:
    result = compare_paired(lognormal(0.0, 0.01), lognormal(0.0, 0.01, shift=5), limit=0.05)
    assert result.verdict is Verdict.UNCHANGED
    assert result.interval[1] < 0.05
    assert result.n_current < 11  # decided before the cap


def test_improvement_beyond_the_limit_is_improved() -> None:
    result = compare_paired(lognormal(-0.20, 0.01), lognormal(0.0, 0.01, shift=2), limit=0.05)
    assert result.verdict is Verdict.IMPROVED
    assert result.interval[1] < -0.05


def test_change_inside_the_limit_never_regresses_however_many_repeats() -> None:
    cand, ref = lognormal(0.04, 0.02), lognormal(0.0, 0.02, shift=4)
    verdicts = [compare_paired(cand[:n], ref[:n], limit=0.05).verdict for n in (3, 5, 7, 9, 11)]
    assert Verdict.REGRESSED not in verdicts


def test_the_first_deciding_look_is_the_verdict() -> None:
    cand, ref = lognormal(0.30, 0.01), lognormal(0.0, 0.01, shift=1)
    early = compare_paired(cand[:5], ref[:5], limit=0.05)
    full = compare_paired(cand, ref, limit=0.05)
    assert early.verdict is Verdict.REGRESSED
    assert full == early  # repeats past the deciding look are not used


def test_inconclusive_asks_for_the_next_look_then_stops_at_the_cap() -> None:
    cand, ref = lognormal(0.06, 0.04), lognormal(0.0, 0.04, shift=6)
    first = compare_paired(cand[:3], ref[:3], limit=0.05)
    assert first.verdict is Verdict.INCONCLUSIVE and first.more_repeats == 2
    at_cap = compare_paired(cand, ref, limit=0.05)
    if at_cap.verdict is Verdict.INCONCLUSIVE:
        assert at_cap.more_repeats == 0 and "cap" in at_cap.note


def test_before_the_first_look() -> None:
    result = compare_paired([1.1, 1.2], [1.0, 1.0], limit=0.05)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.look == 0 and result.more_repeats == 1


def test_zero_spread_is_decided_by_the_values() -> None:
    assert compare_paired([1.1] * 3, [1.0] * 3, limit=0.05).verdict is Verdict.REGRESSED
    assert compare_paired([1.02] * 3, [1.0] * 3, limit=0.05).verdict is Verdict.UNCHANGED
    assert compare_stored([0.7] * 3, [0.7] * 3, limit=0.05).verdict is Verdict.UNCHANGED


def test_regresses_down_for_metrics_that_get_worse_going_down() -> None:
    result = compare_paired(
        lognormal(-0.2, 0.01), lognormal(0.0, 0.01, shift=1), limit=0.05, worse="down"
    )
    assert result.verdict is Verdict.REGRESSED and result.interval[1] < -0.05
    up = compare_paired(
        lognormal(0.2, 0.01), lognormal(0.0, 0.01, shift=1), limit=0.05, worse="down"
    )
    assert up.verdict is Verdict.IMPROVED


def test_stored_mode_precision_is_bounded_by_the_stored_repeats() -> None:
    current = lognormal(0.05, 0.05)
    stored = lognormal(0.0, 0.05, n=3, shift=2)
    result = compare_stored(current, stored, limit=0.05)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.projected_repeats is None and "stored baseline" in result.note
    assert result.n_reference == 3 and result.method.startswith("welch")


def test_session_sd_widens_the_interval() -> None:
    cand, ref = lognormal(0.08, 0.01), lognormal(0.0, 0.01, shift=2)
    plain = compare_paired(cand, ref, limit=0.05)
    wide = compare_paired(cand, ref, limit=0.05, session_sd=0.03)
    assert plain.verdict is Verdict.REGRESSED
    assert wide.verdict is not Verdict.REGRESSED
    assert wide.interval[0] < plain.interval[0]


def test_input_validation() -> None:
    with pytest.raises(ValueError):
        compare_paired([1.0, -1.0, 1.0], [1.0, 1.0, 1.0], limit=0.05)
    with pytest.raises(ValueError):
        compare_paired([1.0, 1.0, 1.0], [1.0, 1.0], limit=0.05)
    with pytest.raises(ValueError):
        compare_stored([1.0, 1.0, 1.0], [1.0], limit=0.05)
    with pytest.raises(ValueError):
        compare_paired([1.0] * 3, [1.0] * 3, limit=-0.1)
    with pytest.raises(ValueError):
        compare_paired([1.0] * 3, [1.0] * 3, limit=1.0, worse="down")
    with pytest.raises(ValueError):
        compare_paired([1.0] * 3, [1.0] * 3, limit=0.05, worse="sideways")


def test_result_is_json_ready_and_describes_itself() -> None:
    result = compare_paired(lognormal(0.06, 0.04), lognormal(0.0, 0.04, shift=6), limit=0.05)
    record = json.loads(json.dumps(result.as_dict(), allow_nan=False))
    assert record["verdict"] == result.verdict.value and len(record["interval"]) == 2
    assert "limit +5.00%" in result.describe()
    early = compare_paired([1.1, 1.2], [1.0, 1.0], limit=0.05)  # before the first look
    assert json.loads(json.dumps(early.as_dict(), allow_nan=False))["p_sequential"] == 1.0


# -- the vectorized engine: the same numbers, and the error rates -------------------------------
def test_engine_rows_equal_the_one_case_api() -> None:
    rng = np.random.default_rng(3)
    d = rng.normal(math.log(1.06), 0.04, (40, 11))
    arrays = sequential_arrays(d, None, limit=0.05)
    for i in range(0, 40, 7):
        one = compare_paired(np.exp(d[i]), np.ones(11), limit=0.05)
        assert (
            one.verdict.value
            == {0: "inconclusive", 1: "unchanged", 2: "improved", 3: "regressed"}[
                int(arrays.code[i])
            ]
        )
        assert one.p_sequential == pytest.approx(arrays.p_sequential[i])


@pytest.mark.parametrize("reference", [None, 5])
def test_false_regressions_at_the_limit_stay_below_alpha(reference: int | None) -> None:
    rng = np.random.default_rng(11)
    rows, ell = 12000, math.log(1.05)
    if reference is None:
        arrays = sequential_arrays(rng.normal(ell, 0.04, (rows, 11)), None, limit=0.05)
    else:
        arrays = sequential_arrays(
            rng.normal(ell, 0.04, (rows, 11)), rng.normal(0.0, 0.04, (rows, reference)), limit=0.05
        )
    rate = np.mean(arrays.code == REGRESSED)
    assert rate <= DEFAULT_PLAN.alpha + 0.006  # Monte Carlo sd ~0.002
    # The repeated p-value is valid: P(p_sequential <= a) <= a.
    for a in (0.01, 0.05, 0.2):
        assert np.mean(arrays.p_sequential <= a) <= a + 0.008


def test_more_repeats_do_not_make_a_change_inside_the_limit_regress_more() -> None:
    rng = np.random.default_rng(5)
    rates = []
    for n in (3, 5, 11):
        single = SequentialPlan(start=n, cap=n)
        d = rng.normal(math.log(1.04), 0.03 * math.sqrt(2), (12000, n))
        rates.append(np.mean(sequential_arrays(d, None, limit=0.05, plan=single).code == REGRESSED))
    assert rates[0] + 0.006 >= rates[1] >= rates[2] - 0.003
    assert max(rates) <= 0.05


# -- per-request metrics -------------------------------------------------------------------------
def _requests(rate: float, n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    verify = rng.integers(20, 40, n).astype(float)
    accepted = np.round(verify * rate * rng.uniform(0.5, 1.5, n))
    return accepted, verify


def test_identical_requests_are_unchanged_at_once() -> None:
    acc, ver = _requests(1.4)
    result = compare_per_request(acc, ver, acc, ver, limit=0.05, offset=1.0)
    assert result.verdict is Verdict.UNCHANGED and result.estimate == 0.0
    assert result.interval == (0.0, 0.0)


def test_accept_length_drop_regresses_and_small_drift_does_not() -> None:
    acc, ver = _requests(1.4)
    dropped = np.round(acc * 0.7)
    result = compare_per_request(dropped, ver, acc, ver, limit=0.05, offset=1.0)
    assert result.verdict is Verdict.REGRESSED and result.interval[1] < -0.05
    rng = np.random.default_rng(9)
    jitter = np.maximum(acc + rng.integers(-1, 2, acc.size), 0)  # GPU nondeterminism
    small = compare_per_request(jitter, ver, acc, ver, limit=0.05, offset=1.0)
    assert small.verdict is Verdict.UNCHANGED


def test_one_diverging_prompt_is_not_a_regression() -> None:
    # Audit item 6: one of 16 prompts diverging must not regress by itself.
    acc, ver = _requests(1.4, n=16)
    worse = acc.copy()
    worse[3] = 0.0
    result = compare_per_request(worse, ver, acc, ver, limit=0.05, offset=1.0)
    assert result.verdict is not Verdict.REGRESSED


def test_per_request_options_and_validation() -> None:
    acc, ver = _requests(0.5, seed=1)
    acc2, ver2 = _requests(0.5, n=50, seed=2)
    unpaired = compare_per_request(acc2, ver2, acc, ver, limit=0.05, paired=False, n_repeats=3)
    assert unpaired.method.startswith("two-sample") and unpaired.n_current == 50
    again = compare_per_request(acc2, ver2, acc, ver, limit=0.05, paired=False, n_repeats=3)
    assert again == unpaired  # seeded
    if unpaired.verdict is Verdict.INCONCLUSIVE:
        assert unpaired.more_repeats == 2
    with pytest.raises(ValueError):
        compare_per_request(acc2, ver2, acc, ver, limit=0.05)  # paired needs equal counts
    with pytest.raises(ValueError):
        compare_per_request(acc, ver[:-1], acc, ver, limit=0.05)
    with pytest.raises(ValueError):
        compare_per_request(acc, np.zeros_like(ver), acc, ver, limit=0.05)


def test_accept_length_p_resolves_below_the_resampling_floor_for_bh_over_1000_comparisons() -> None:
    """Issue 22 item 7: 5000 resamples once floored p at 1/5001 = 2e-4, so BH over 1,000
    comparisons (rank-1 threshold 0.05 / 1000 = 5e-5) could never reject an accept-length drop."""
    acc, ver = _requests(1.4)
    p = {
        drop: compare_per_request(
            np.round(acc * (1 - drop)), ver, acc, ver, limit=0.05, offset=1.0, resamples=5000
        ).p_value
        for drop in (0.10, 0.15, 0.30)
    }
    assert all(v < 1 / 5001 for v in p.values()), p
    assert p[0.30] < p[0.15] < p[0.10]  # graded, not one floor value
    assert p[0.30] < 1e-12
    family = np.concatenate([[p[0.15]], np.linspace(0.01, 1.0, 999)])  # one drop among 999 nulls
    assert bh_reject(family, 0.05)[0]
    # Where the tail holds replicates the p is the usual bootstrap share, unchanged.
    rng = np.random.default_rng(9)
    jitter = np.maximum(acc + rng.integers(-1, 2, acc.size), 0)
    middling = compare_per_request(jitter, ver, acc, ver, limit=0.05, offset=1.0, resamples=5000)
    assert middling.p_value * 5001 == pytest.approx(round(middling.p_value * 5001))
