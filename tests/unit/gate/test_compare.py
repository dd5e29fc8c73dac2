"""The regression gate on records shaped exactly like ``PairResult.as_dict()``.

Each check is shown catching its bad case: a regression is REGRESSED with the numbers in the
message, an unchanged record PASSES, noise alone almost never REGRESSES, a small change
under noise is INCONCLUSIVE, and incomparable runs are INCOMPARABLE with the reason.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.gate.compare import Verdict
from pytest_specenergy.gate.compare import comparable
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.compare import compare_documents
from pytest_specenergy.gate.compare import metric_samples
from pytest_specenergy.gate.compare import needs_more_repeats
from pytest_specenergy.gate.compare import resolve_inconclusive
from pytest_specenergy.gate.compare import run_info
from pytest_specenergy.gate.limits import parse_fail_exprs
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RepeatSample
from pytest_specenergy.measure.results import RunResult

CASE = Case(engine="reference", model="tiny:dense", drafter=Drafter("ngram"), batch=4,
            corpus=load_corpus("code"))
ENGINE = {"engine": "reference", "version": "0.1.0",
          "config": {"engine": "reference", "options": {}}, "server_info": {"version": "0.1.0"}}
OUT = ((1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11, 12))
BASELINE_PATH = ".specenergy/modeled-h200-cpu-reference-0.1.0/0003_main_20260509_143000.json"


def _arm(name, epts, tbts, *, verify=None, correct=None, proposed=None, outputs=OUT,
         source="modeled (h200)", engine=ENGINE):
    samples = tuple(RepeatSample(decode_joules=e * 100, decode_seconds=1.0, decode_tokens=100,
                                 tbt_ms=t, verify_steps=verify, correct_drafts=correct,
                                 proposed_drafts=proposed) for e, t in zip(epts, tbts))
    return RunResult(arm=name, engine=copy.deepcopy(engine), source=source, samples=samples,
                     outputs=outputs, finish_reasons=("length",) * len(outputs),
                     verified_per_step=9 if name == "speculative" else 1)


def record(spec_ept, base_ept=None, *, spec_tbt=None, base_tbt=None, correct=60, verify=40,
           proposed=320, spec_outputs=OUT, source="modeled (h200)", engine=ENGINE, case=CASE):
    """A real ``PairResult.as_dict()``: per-repeat energy in J/token for each arm."""
    base_ept = base_ept if base_ept is not None else [2 * e for e in spec_ept]
    spec_tbt = spec_tbt if spec_tbt is not None else [8.0] * len(spec_ept)
    base_tbt = base_tbt if base_tbt is not None else [20.0] * len(base_ept)
    base = _arm("baseline", base_ept, base_tbt, source=source, engine=engine)
    spec = _arm("speculative", spec_ept, spec_tbt, verify=verify, correct=correct,
                proposed=proposed, outputs=spec_outputs, source=source, engine=engine)
    return PairResult(case, case.id, base, spec).as_dict()


ENERGY = parse_fail_exprs(["energy:5%"])


def noisy(center, n, sd, rng):
    return list(center * (1.0 + rng.normal(0.0, sd, n)))


# -- the verdicts -----------------------------------------------------------------------------
def test_record_shape_is_pair_result_as_dict():
    r = record([1.0, 1.0, 1.0])
    assert {"case_id", "case", "source", "energy_saving", "accept_length", "equivalence",
            "baseline", "speculative"} <= set(r)
    assert metric_samples(r, "energy_per_token") == pytest.approx([1.0, 1.0, 1.0])
    assert metric_samples(r, "energy_saving") == pytest.approx([0.5, 0.5, 0.5])
    assert metric_samples(r, "speedup") == pytest.approx([2.5, 2.5, 2.5])
    assert metric_samples(r, "accept_length") == pytest.approx([2.5])  # 1 + 60 / 40
    assert metric_samples(r, "equivalence") == [1.0]


def test_regressed_record_fails_with_the_numbers():
    base = record([1.00, 1.01, 0.99])
    cur = record([1.20, 1.21, 1.19])
    result = compare_case(base, cur, ENERGY)
    assert result.verdict is Verdict.REGRESSED
    row = result.rows[0]
    assert row.method == "bootstrap+welch" and row.change_rel == pytest.approx(0.20)
    message = result.failure_message(BASELINE_PATH)
    print(message)
    assert "code-ngram-b4 regressed" in message
    assert "energy_per_token (median): baseline 1 J/token -> current 1.2 J/token" in message
    assert "change +20.00% (+0.2 J/token)" in message
    assert "limit 5% up [energy:5%]" in message
    assert re.search(r"p=[0-9.e-]+ \(bootstrap\+welch, 3 vs 3 repeats\): REGRESSED", message)
    assert row.p_value < 0.01 and row.interval[0] > 1.05
    assert BASELINE_PATH in message


def test_regression_with_enough_repeats_uses_mann_whitney():
    result = compare_case(record([1.00, 1.01, 0.99, 1.02, 0.98]),
                          record([1.10, 1.12, 1.09, 1.11, 1.08]), ENERGY)
    row = result.rows[0]
    assert result.verdict is Verdict.REGRESSED
    assert row.method == "mann-whitney" and row.p_value == pytest.approx(2 / 252)
    assert "p=0.00794 (mann-whitney, 5 vs 5 repeats)" in result.failure_message(BASELINE_PATH)


def test_unchanged_record_passes():
    r = record([1.00, 1.01, 0.99])
    result = compare_case(r, copy.deepcopy(r), parse_fail_exprs(
        ["energy:5%", "tbt_ms:mean:10%", "accept:0.1", "energy_saving:2%", "equivalence:0",
         "acceptance_rate:0.01"]))
    assert result.verdict is Verdict.PASSED
    assert [row.verdict for row in result.rows] == [Verdict.PASSED] * 6
    assert not needs_more_repeats(result)


def test_3_vs_3_identical_ish_is_not_regressed_and_20pct_shift_always_is():
    rng = np.random.default_rng(11)
    for _ in range(50):
        same = compare_case(record(noisy(1.0, 3, 0.01, rng)), record(noisy(1.0, 3, 0.01, rng)),
                            ENERGY)
        assert same.verdict is Verdict.PASSED
        shifted = compare_case(record(noisy(1.0, 3, 0.01, rng)),
                               record(noisy(1.2, 3, 0.01, rng)), ENERGY)
        assert shifted.verdict is Verdict.REGRESSED, shifted.failure_message(None)


@pytest.mark.parametrize("limit", ["energy:5%", "energy:2%", "energy:0%"])
def test_false_positive_rate_under_realistic_noise(limit):
    """No real change, 2% relative sd per repeat: how often does the gate cry REGRESSED?"""
    limits = parse_fail_exprs([limit])
    rng = np.random.default_rng(2026)
    trials, rates = 300, {}
    for n in (3, 5, 10):
        regressed = sum(
            compare_case(record(noisy(1.0, n, 0.02, rng)), record(noisy(1.0, n, 0.02, rng)),
                         limits, resamples=2000).verdict is Verdict.REGRESSED
            for _ in range(trials))
        rates[n] = regressed / trials
    overall = sum(rates.values()) / len(rates)
    print(f"\nfalse-positive REGRESSED rate, {limit}, 2% sd, {trials} trials per size: "
          + ", ".join(f"{n} vs {n}: {r:.2%}" for n, r in rates.items())
          + f"; overall {overall:.2%} (alpha 1%)")
    assert all(rate <= 0.05 for rate in rates.values())


def test_small_real_change_under_noise_is_inconclusive():
    # +7% median shift, but the repeats overlap: beyond the limit, not significant.
    base = record([1.00, 1.03, 0.97])
    cur = record([1.07, 1.10, 1.04])
    result = compare_case(base, cur, ENERGY)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.rows[0].change_rel == pytest.approx(0.07)
    assert needs_more_repeats(result)
    assert "more repeats would decide" in result.failure_message(BASELINE_PATH)
    # The same with 6 repeats a side: the U test cannot separate them at 0.01 either.
    six = compare_case(record([1.00, 1.03, 0.97, 1.05, 0.95, 1.01]),
                       record([1.08, 1.03, 1.10, 1.06, 1.12, 1.00]), ENERGY)
    assert six.verdict is Verdict.INCONCLUSIVE and six.rows[0].method == "mann-whitney"
    assert six.rows[0].p_value > 0.01


def test_ranges_that_merely_separate_are_not_proof():
    # With limit 0 the interval clears as soon as the 3 + 3 values do not overlap, which
    # noise alone does 1 time in 20; Welch's t (p ~ 0.02 here) holds it back.
    result = compare_case(record([1.00, 1.01, 1.02]), record([1.03, 1.04, 1.05]),
                          parse_fail_exprs(["energy:0%"]))
    row = result.rows[0]
    assert row.interval[0] > 1.0
    assert 0.01 < row.p_value < 0.05
    assert result.verdict is Verdict.INCONCLUSIVE


def test_noise_free_modeled_repeats_regress_deterministically():
    # The modeled meter repeats exactly; zero spread makes any shift beyond the limit real.
    result = compare_case(record([1.0, 1.0, 1.0]), record([1.1, 1.1, 1.1]), ENERGY)
    assert result.verdict is Verdict.REGRESSED
    assert compare_case(record([1.0] * 3), record([1.0] * 3), ENERGY).verdict is Verdict.PASSED


def test_too_few_repeats_are_never_regressed():
    for n in (1, 2):
        result = compare_case(record([1.0] * n), record([1.5] * n), ENERGY)
        assert result.verdict is Verdict.INCONCLUSIVE
        assert result.rows[0].method == "too few repeats"


def test_4_vs_4_falls_back_to_bootstrap_because_u_cannot_reach_alpha():
    result = compare_case(record([1.00, 1.01, 0.99, 1.00]), record([1.20, 1.21, 1.19, 1.20]),
                          ENERGY)
    assert result.verdict is Verdict.REGRESSED and result.rows[0].method == "bootstrap+welch"


def test_inconclusive_policies():
    result = compare_case(record([1.00, 1.03, 0.97]), record([1.07, 1.10, 1.04]), ENERGY)
    for policy in ("fail", "warn", "xfail"):
        resolution = resolve_inconclusive(policy, result, BASELINE_PATH)
        assert resolution.action == policy
        assert "inconclusive" in resolution.message and BASELINE_PATH in resolution.message
    with pytest.raises(ValueError, match="expected one of fail, warn, xfail"):
        resolve_inconclusive("ignore")


def test_improvement_is_reported():
    result = compare_case(record([1.20, 1.21, 1.19]), record([1.00, 1.01, 0.99]), ENERGY)
    assert result.verdict is Verdict.IMPROVED
    assert "consider updating the baseline" in result.failure_message(None)


def test_deterministic_counters_and_equivalence():
    base = record([1.0, 1.0, 1.0])  # accept length 1 + 60/40 = 2.5
    shorter = record([1.0, 1.0, 1.0], correct=50)  # 2.25, acceptance 50/320
    result = compare_case(base, shorter, parse_fail_exprs(["accept:0.1", "acceptance_rate:0.05"]))
    accept, rate = result.rows
    assert accept.verdict is Verdict.REGRESSED and accept.method == "deterministic"
    assert accept.p_value is None
    assert rate.verdict is Verdict.PASSED  # 0.1875 -> 0.15625 is within 0.05
    assert "accept_length (median): baseline 2.5 tokens/step -> current 2.25 tokens/step" \
        in result.failure_message(BASELINE_PATH)
    diverged = record([1.0, 1.0, 1.0], spec_outputs=((1, 2, 3, 4, 5, 6), (7, 8, 0, 10, 11, 12)))
    eq = compare_case(base, diverged, parse_fail_exprs(["equivalence:0"]))
    assert eq.verdict is Verdict.REGRESSED
    assert "change -50.00% (-50 pts)" in eq.failure_message(BASELINE_PATH)


def test_energy_saving_pairs_repeats_and_uses_points():
    base = record([1.0, 1.01, 0.99], [2.0, 2.02, 1.98])         # saving 50%
    cur = record([1.0, 1.01, 0.99], [1.6, 1.616, 1.584])        # saving 37.5%
    result = compare_case(base, cur, parse_fail_exprs(["energy_saving:2%"]))
    row = result.rows[0]
    assert result.verdict is Verdict.REGRESSED
    assert row.change_abs == pytest.approx(-0.125)
    assert "(-12.5 pts)" in row.change_text()


def test_missing_values_are_incomparable_not_passed():
    no_counters = record([1.0, 1.0, 1.0], correct=None, verify=None, proposed=None)
    result = compare_case(record([1.0, 1.0, 1.0]), no_counters, parse_fail_exprs(["accept:0.1"]))
    assert result.verdict is Verdict.INCOMPARABLE
    assert "current record has no accept_length values" in result.failure_message(None)


def test_no_baseline():
    result = compare_case(None, record([1.0, 1.0, 1.0]), ENERGY)
    assert result.verdict is Verdict.NO_BASELINE and result.verdict.mark == "?"


# -- comparability --------------------------------------------------------------------------
@pytest.mark.parametrize("change, fragment", [
    (dict(source="measured (nvml)"), "modeled and measured energy are never compared"),
    (dict(source="modeled (h100)"), "modeled GPU differs"),
    (dict(engine={**ENGINE, "version": "0.2.0"}), "engine version differs: baseline '0.1.0', "
                                                  "current '0.2.0'"),
    (dict(engine={**ENGINE, "engine": "sglang"}), "engine differs"),
    (dict(engine={**ENGINE, "server_info": {"disable_cuda_graph": True}}),
     "the baseline does not record its CUDA-graph setting"),
])
def test_incomparable_records(change, fragment):
    base = record([1.0, 1.0, 1.0])
    cur = record([1.2, 1.2, 1.2], **change)
    result = compare_case(base, cur, ENERGY)
    assert result.verdict is Verdict.INCOMPARABLE
    assert result.rows == ()  # no numbers compared at all
    message = result.failure_message(BASELINE_PATH)
    assert fragment in message and BASELINE_PATH in message


def test_runs_priced_as_different_models_are_incomparable():
    base = record([1.0, 1.0, 1.0], source="modeled (h200, priced as Qwen3-8B)")
    cur = record([1.0, 1.0, 1.0], source="modeled (h200, priced as tiny model)")
    result = compare_case(base, cur, ENERGY)
    assert result.verdict is Verdict.INCOMPARABLE
    assert "modeled pricing differs" in result.failure_message(BASELINE_PATH)


def test_cuda_graph_difference_is_named():
    on = {**ENGINE, "server_info": {"disable_cuda_graph": False, "cuda_graph_max_bs": 16}}
    off = {**ENGINE, "server_info": {"disable_cuda_graph": True, "cuda_graph_max_bs": 16}}
    result = compare_case(record([1.0] * 3, engine=on), record([1.0] * 3, engine=off), ENERGY)
    assert result.verdict is Verdict.INCOMPARABLE
    assert result.reasons == ("CUDA-graph setting differs: disable_cuda_graph=False (baseline) "
                              "vs True (current); CUDA graphs change the result",)


def test_machine_key_and_scenario_mismatch():
    base, cur = record([1.0] * 3), record([1.0] * 3)
    result = compare_case(base, cur, ENERGY, baseline_info={"machine_key": "1xnvidia-h100-nvml"},
                          current_info={"machine_key": "1xnvidia-h200-nvml"})
    assert result.verdict is Verdict.INCOMPARABLE
    assert "machine key differs: baseline '1xnvidia-h100-nvml', current '1xnvidia-h200-nvml'" \
        in result.reasons[0]
    other = Case(engine="reference", model="tiny:dense", drafter=Drafter("ngram"), batch=4,
                 corpus=load_corpus("news"))
    reasons = comparable(run_info(base), run_info(record([1.0] * 3, case=other)))
    assert len(reasons) == 1 and reasons[0].startswith("corpus differs")
    assert comparable(run_info(base), run_info(cur)) == []


def test_compare_documents_matches_by_case_and_flags_missing():
    base_doc = {"machine_key": "k", "results": [record([1.0, 1.01, 0.99])]}
    other = Case(engine="reference", model="tiny:dense", drafter=Drafter("ngram"), batch=8,
                 corpus=load_corpus("code"))
    cur_doc = {"machine_key": "k", "results": [record([1.2, 1.21, 1.19]),
                                               record([1.0] * 3, case=other)]}
    first, second = compare_documents(base_doc, cur_doc, ENERGY)
    assert (first.case_id, first.verdict) == ("code-ngram-b4", Verdict.REGRESSED)
    assert (second.case_id, second.verdict) == ("code-ngram-b8", Verdict.NO_BASELINE)
    assert first.as_dict()["rows"][0]["verdict"] == "regressed"
    assert first.summary() == "code-ngram-b4: regressed (energy_per_token +20.00% (+0.2 J/token))"
