"""Unit tests of Benjamini-Hochberg adjustment and the plugin's immediate/pending split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specenergy.gate import fdr


def brute_force_bh(p: np.ndarray, q: float) -> np.ndarray:
    """The step-up definition, literally."""
    n = p.size
    order = np.argsort(p)
    k = 0
    for rank in range(n, 0, -1):
        if p[order[rank - 1]] <= q * rank / n:
            k = rank
            break
    reject = np.zeros(n, dtype=bool)
    reject[order[:k]] = True
    return reject


def test_bh_adjust_hand_example() -> None:
    adjusted = fdr.bh_adjust([0.01, 0.04, 0.03, 0.005])
    assert adjusted.tolist() == pytest.approx([0.02, 0.04, 0.04, 0.02])


def test_by_adjust_scales_by_the_harmonic_number() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    c = 1 + 1 / 2 + 1 / 3 + 1 / 4
    assert fdr.bh_adjust(p, method="by").tolist() == pytest.approx(
        np.minimum(1.0, np.array([0.02, 0.04, 0.04, 0.02]) * c).tolist()
    )


def test_bh_matches_scipy_when_available() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for _ in range(20):
        p = rng.uniform(0, 1, 50) ** 3
        assert np.allclose(fdr.bh_adjust(p), stats.false_discovery_control(p, method="bh"))
        assert np.allclose(
            fdr.bh_adjust(p, method="by"), stats.false_discovery_control(p, method="by")
        )


def test_bh_reject_is_the_step_up_procedure() -> None:
    rng = np.random.default_rng(2)
    for _ in range(200):
        p = rng.uniform(0, 1, 30) ** rng.uniform(1, 6)
        q = rng.uniform(0.01, 0.3)
        assert np.array_equal(fdr.bh_reject(p, q), brute_force_bh(p, q))


def test_missing_p_values_are_left_out() -> None:
    adjusted = fdr.bh_adjust([0.01, math.nan, 0.02])
    assert math.isnan(adjusted[1])
    assert adjusted[[0, 2]].tolist() == pytest.approx([0.02, 0.02])  # a family of 2
    assert fdr.bh_reject([math.nan, 0.001], 0.05).tolist() == [False, True]
    assert fdr.bh_adjust([]).size == 0


def test_immediate_decisions_never_contradict_session_end_bh() -> None:
    rng = np.random.default_rng(3)
    n, q = 40, 0.1
    for _ in range(300):
        p = rng.uniform(0, 1, n) ** rng.uniform(1, 8)
        for method in fdr.METHODS:
            final = fdr.bh_reject(p, q, method=method)
            for value, rejected in zip(p, final, strict=True):
                decision = fdr.immediate_decision(value, q, n, method=method)
                if decision == fdr.FAIL_NOW:
                    assert rejected
                elif decision == fdr.PASS_NOW:
                    assert not rejected


def test_immediate_decision_thresholds() -> None:
    assert fdr.immediate_decision(0.05 / 200, 0.05, 200) == fdr.FAIL_NOW
    assert fdr.immediate_decision(0.01, 0.05, 200) == fdr.PENDING
    assert fdr.immediate_decision(0.051, 0.05, 200) == fdr.PASS_NOW
    assert fdr.immediate_decision(math.nan, 0.05, 200) == fdr.PASS_NOW
    # BY is stricter: 0.04 can still be rejected by BH but never by BY with 200 tests.
    assert fdr.immediate_decision(0.04, 0.05, 200, method="by") == fdr.PASS_NOW


def test_suite_fdr_reports_what_the_session_must_fail() -> None:
    pvalues = {"a": 0.0001, "b": 0.01, "c": 0.5, "d": None, "e": 0.012}
    result = fdr.suite_fdr(pvalues, 0.05, pending=("b", "e"))
    assert result.n_tests == 4
    assert result.rejected == ("a", "b", "e")
    assert result.pending_rejected == ("b", "e")
    assert math.isnan(result.adjusted["d"])
    text = result.summary()
    assert "3 regressed" in text and "decided at session end" in text
    assert "0 regressed" in fdr.suite_fdr({"x": 0.9}, 0.05).summary()


def test_fdr_plan_stops_regressed_only_where_bh_rejects_regardless() -> None:
    from pytest_specenergy.gate.sequential import DEFAULT_PLAN

    plan = fdr.fdr_plan(DEFAULT_PLAN, 0.05, 200)
    assert plan.alpha == pytest.approx(0.05 / 200)
    assert plan.looks == DEFAULT_PLAN.looks and plan.beta == DEFAULT_PLAN.beta
    with pytest.raises(ValueError):
        fdr.fdr_plan(DEFAULT_PLAN, 0.05, 0)


def test_validation() -> None:
    with pytest.raises(ValueError):
        fdr.bh_adjust([0.5, 1.5])
    with pytest.raises(ValueError):
        fdr.bh_adjust([0.5], method="holm")
    with pytest.raises(ValueError):
        fdr.bh_reject([0.5], 0.0)
    with pytest.raises(ValueError):
        fdr.immediate_decision(0.5, 0.05, 0)
