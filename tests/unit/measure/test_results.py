"""Metrics and assertion helpers on synthetic arms: each helper fails on the bad pair."""

from __future__ import annotations

import pytest

from pytest_specenergy import metrics
from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure.equivalence import compare_outputs
from pytest_specenergy.measure.equivalence import first_divergence
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.measure.results import SpecEnergyAssertionError

CASE = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram"),
    batch=4,
    corpus=load_corpus("code"),
)


def sample(joules, tokens=100, seconds=1.0, tbt=10.0, verify=None, correct=None, proposed=None):
    return RepeatSample(joules, seconds, tokens, tbt, verify, correct, proposed)


def arm(name, joules, outputs, tbt=10.0, verify=None, correct=None, proposed=None, k=8):
    samples = tuple(
        sample(j, tbt=tbt, verify=verify, correct=correct, proposed=proposed) for j in joules
    )
    return RunResult.measured(
        arm=name,
        engine={},
        source="modeled (h200)",
        samples=samples,
        outputs=tuple(tuple(o) for o in outputs),
        finish_reasons=("length",) * len(outputs),
        verified_per_step=k + 1 if name == "speculative" else 1,
    )


OUT = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]


def pair(spec_joules=(5.0, 5.2, 4.9), outputs=OUT, verify=40, correct=60, proposed=320):
    base = arm("baseline", (10.0, 10.1, 9.9), OUT, tbt=20.0)
    spec = arm(
        "speculative",
        spec_joules,
        outputs,
        tbt=8.0,
        verify=verify,
        correct=correct,
        proposed=proposed,
    )
    return PairResult(CASE, CASE.id, base, spec)


def test_metric_definitions():
    p = pair()
    assert p.energy_per_token == pytest.approx(0.05)  # median of 5.0, 5.2, 4.9 J over 100 tokens
    assert p.baseline.energy_per_token == pytest.approx(0.10)
    assert p.energy_saving == pytest.approx(0.5)
    # pooled over three repeats: 1 + 180 / 120
    assert p.accept_length == pytest.approx(2.5)
    assert p.acceptance_rate == pytest.approx(180 / 960)
    assert p.speedup == pytest.approx(2.5)
    assert p.verified_per_step == 9


def test_metrics_fail_closed():
    assert metrics.accept_length(10, 0) is None
    assert metrics.accept_length(None, 5) is None
    assert metrics.energy_per_token(3.0, 0) is None
    assert metrics.energy_saving(None, 1.0) is None
    assert metrics.request_tbt_ms(1.0, 1) is None
    assert metrics.request_tbt_ms(0.9, 10) == pytest.approx(100.0)


def test_assertions_pass_on_a_healthy_pair():
    pair().assert_saves_energy(at_least=0.4).assert_acceptance(at_least=2.0).assert_equivalent()


def test_assert_saves_energy_fails_when_speculation_costs_energy():
    bad = pair(spec_joules=(12.0, 12.5, 11.9))
    with pytest.raises(SpecEnergyAssertionError) as info:
        bad.assert_saves_energy()
    text = str(info.value)
    assert "energy saving -20.00% is below the required +0.00%" in text
    assert "case code-ngram-b4 [modeled (h200)]" in text
    assert "baseline:    0.1 J/token" in text and "speculative: 0.12 J/token" in text


def test_assert_saves_energy_fails_below_the_limit():
    with pytest.raises(SpecEnergyAssertionError, match="below the required"):
        pair().assert_saves_energy(at_least=0.6)


def test_assert_acceptance_fails_on_a_broken_drafter():
    with pytest.raises(
        SpecEnergyAssertionError, match=r"accept length 1\.000 is below the required 2\.000"
    ):
        pair(correct=0).assert_acceptance(at_least=2.0)


def test_assert_acceptance_fails_closed_without_counters():
    with pytest.raises(SpecEnergyAssertionError, match="no verify steps"):
        pair(verify=None, correct=None).assert_acceptance(at_least=1.0)


def test_assert_equivalent_fails_on_divergent_output():
    broken = [[1, 2, 3, 99, 5, 6], OUT[1]]
    bad = pair(outputs=broken)
    with pytest.raises(SpecEnergyAssertionError, match=r"exact-match fraction 0\.500"):
        bad.assert_equivalent()
    with pytest.raises(
        SpecEnergyAssertionError, match="diverge from the baseline at token 3 of prompt 0"
    ):
        bad.assert_equivalent(min_common_prefix=4)
    bad.assert_equivalent(min_common_prefix=3)
    bad.assert_equivalent(min_exact_fraction=0.5)


def test_equivalence_details():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    eq = compare_outputs([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 0, 6]])
    assert eq.exact_fraction == 0.5
    assert eq.min_common_prefix == 1
    assert eq.median_common_prefix == 2.0
    assert eq.summary() == "1/2 exact, first divergence at token 1 (prompt 1)"
    with pytest.raises(ValueError, match="different numbers of prompts"):
        compare_outputs([[1]], [])
