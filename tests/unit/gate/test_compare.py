"""The regression gate on records shaped exactly like ``PairResult.as_dict()``.

Each check is shown catching its bad case: a regression is REGRESSED with the numbers in the
message, an unchanged record PASSES, noise alone almost never REGRESSES, a small change
under noise is INCONCLUSIVE and asks for the next look until the cap, a session offset
cancels in the default ratio metric, in-job A/B judges against the reference arm, and
incomparable runs are INCOMPARABLE with the reason.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.document import RunDocument
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.gate import compare
from pytest_specenergy.gate.compare import Verdict
from pytest_specenergy.gate.compare import comparable
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.compare import repeats_needed
from pytest_specenergy.gate.compare import resolve_inconclusive
from pytest_specenergy.gate.limits import limits_for
from pytest_specenergy.gate.limits import merge_limits
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.metrics import METRICS


def parse_fail_exprs(texts):
    """Limits from expressions, a later one for the same metric and statistic winning."""
    return merge_limits([parse_fail_expr(t) for t in texts])


CASE = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram"),
    batch=4,
    corpus=load_corpus("code"),
)
ENGINE = {
    "engine": "reference",
    "version": "0.1.0",
    "config": {"engine": "reference", "options": {}},
    "server_info": {"version": "0.1.0"},
}
OUT = ((1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11, 12))
BASELINE_PATH = ".specenergy/modeled-h200-cpu-reference-0.1.0/0003_main_20260509_143000.json"


def _arm(
    name,
    epts,
    tbts,
    *,
    verify=None,
    correct=None,
    proposed=None,
    outputs=OUT,
    source="modeled (h200)",
    engine=ENGINE,
):
    samples = tuple(
        RepeatSample(
            decode_joules=e * 100,
            decode_seconds=1.0,
            decode_tokens=100,
            tbt_ms=t,
            verify_steps=verify,
            correct_drafts=correct,
            proposed_drafts=proposed,
        )
        for e, t in zip(epts, tbts)
    )
    return RunResult.measured(
        arm=name,
        engine=copy.deepcopy(engine),
        source=source,
        samples=samples,
        outputs=outputs,
        finish_reasons=("length",) * len(outputs),
        verified_per_step=9 if name == "speculative" else 1,
    )


def record(
    spec_ept,
    base_ept=None,
    *,
    spec_tbt=None,
    base_tbt=None,
    correct=60,
    verify=40,
    proposed=320,
    spec_outputs=OUT,
    source="modeled (h200)",
    engine=ENGINE,
    case=CASE,
):
    """A real ``PairResult.as_dict()``: per-repeat energy in J/token for each arm."""
    base_ept = base_ept if base_ept is not None else [2 * e for e in spec_ept]
    spec_tbt = spec_tbt if spec_tbt is not None else [8.0] * len(spec_ept)
    base_tbt = base_tbt if base_tbt is not None else [20.0] * len(base_ept)
    base = _arm("baseline", base_ept, base_tbt, source=source, engine=engine)
    spec = _arm(
        "speculative",
        spec_ept,
        spec_tbt,
        verify=verify,
        correct=correct,
        proposed=proposed,
        outputs=spec_outputs,
        source=source,
        engine=engine,
    )
    return PairResult(case, case.id, base, spec).as_dict()


ENERGY = parse_fail_exprs(["energy:5%"])


# The records are JSON objects, edited here the way a file could be; the gate reads them as a
# loaded run would give them: through the run document's one reader.
def _typed(record):
    return None if record is None else CaseRecord.from_dict(record)


def compare_case(baseline, current, *args, **kwargs):
    return compare.compare_case(_typed(baseline), _typed(current), *args, **kwargs)


def compare_in_job(record, *args, **kwargs):
    return compare.compare_in_job(_typed(record), *args, **kwargs)


def compare_documents(baseline, current, *args, **kwargs):
    return compare.compare_documents(
        RunDocument.from_dict(baseline), RunDocument.from_dict(current), *args, **kwargs
    )


def metric_samples(record, metric):
    return compare.metric_samples(_typed(record), metric)


def request_accept_lengths(record, arm="speculative"):
    return compare.request_accept_lengths(_typed(record), arm)


def run_info(record):
    return compare.run_info(_typed(record))


def noisy(center, n, sd, rng):
    return list(center * (1.0 + rng.normal(0.0, sd, n)))


# -- the verdicts -----------------------------------------------------------------------------
def ratio_record(ratios, base_ept, **kwargs):
    """A record whose speculative arm runs ``ratio x`` its baseline arm in each repeat."""
    return record([r * b for r, b in zip(ratios, base_ept)], list(base_ept), **kwargs)


def test_record_shape_is_pair_result_as_dict():
    r = record([1.0, 1.0, 1.0])
    assert {
        "case_id",
        "case",
        "source",
        "energy_saving",
        "accept_length",
        "equivalence",
        "baseline",
        "speculative",
    } <= set(r)
    assert metric_samples(r, "energy_per_token") == pytest.approx([1.0, 1.0, 1.0])
    assert metric_samples(r, "energy_ratio") == pytest.approx([0.5, 0.5, 0.5])
    assert metric_samples(r, "energy_saving") == pytest.approx([0.5, 0.5, 0.5])
    assert metric_samples(r, "speedup") == pytest.approx([2.5, 2.5, 2.5])
    # Acceptance is judged per repeat now, each repeat's own counters: 1 + 60 / 40.
    assert metric_samples(r, "accept_length") == pytest.approx([2.5, 2.5, 2.5])
    assert metric_samples(r, "acceptance_rate") == pytest.approx([60 / 320] * 3)
    assert metric_samples(r, "equivalence") == [1.0]


def test_energy_is_gated_on_the_session_ratio_by_default():
    assert [limit.metric for limit in limits_for(())][0] == "energy_ratio"
    assert parse_fail_exprs(["energy:5%"])[0].metric == "energy_ratio"
    assert METRICS["energy_ratio"].per_repeat and METRICS["energy_ratio"].worse == "up"


def test_regressed_record_fails_with_the_numbers():
    base = ratio_record([0.50, 0.505, 0.495], [2.0, 2.02, 1.98])
    cur = ratio_record([0.60, 0.606, 0.594], [2.0, 1.99, 2.01])
    result = compare_case(base, cur, ENERGY)
    assert result.verdict is Verdict.REGRESSED
    row = result.rows[0]
    assert row.metric == "energy_ratio" and row.change_rel == pytest.approx(0.20)
    assert row.method == "sequential welch-t on log ratios, look 1/5"
    message = result.failure_message(BASELINE_PATH)
    print(message)
    assert "code-ngram-b4 regressed" in message
    assert "energy_ratio (median): baseline 0.5 x -> current 0.6 x" in message
    assert "change +20.00%" in message and "limit 5% up [energy:5%]" in message
    assert re.search(
        r"p=[0-9.e-]+ \(sequential welch-t on log ratios, look 1/5, 3 vs 3 repeats, "
        r"change interval \[\+1\d\.\d\d%, \+2\d\.\d\d%\]\): REGRESSED",
        message,
    )
    assert row.p_value < 0.001 and row.interval[0] > 0.05 and row.p_sequential <= 0.05
    assert BASELINE_PATH in message


def test_unchanged_record_passes():
    r = record([1.00, 1.01, 0.99])
    result = compare_case(
        r,
        copy.deepcopy(r),
        parse_fail_exprs(
            [
                "energy:5%",
                "energy_per_token:5%",
                "tbt_ms:mean:10%",
                "accept:0.1",
                "energy_saving:2%",
                "equivalence:0",
                "acceptance_rate:0.01",
            ]
        ),
    )
    assert result.verdict is Verdict.PASSED, result.failure_message(None)
    assert [row.verdict for row in result.rows] == [Verdict.PASSED] * 7
    assert repeats_needed(result) == 0


def test_a_session_offset_moves_both_arms_and_cancels_in_the_ratio():
    """The current session's GPU runs 6% warmer on both arms: absolute J/token regresses,
    the within-session ratio (the default) does not."""
    base = ratio_record([0.50, 0.505, 0.495], [2.0, 2.02, 1.98])
    warm = ratio_record([0.50, 0.495, 0.505], [2.12, 2.10, 2.14])
    result = compare_case(base, warm, parse_fail_exprs(["energy:5%", "energy_per_token:5%"]))
    ratio, absolute = result.rows
    assert ratio.metric == "energy_ratio" and ratio.verdict is Verdict.PASSED
    assert absolute.metric == "energy_per_token" and absolute.verdict is not Verdict.PASSED
    assert absolute.change_rel == pytest.approx(0.06, abs=0.005)


def test_false_positive_rate_under_realistic_noise():
    """No real change, 2% sd per arm per repeat: how often does the gate cry REGRESSED?"""
    rng = np.random.default_rng(2026)
    trials, rates = 300, {}
    for n in (3, 5, 11):
        rates[n] = (
            sum(
                compare_case(
                    ratio_record(noisy(0.5, n, 0.02, rng), noisy(2.0, n, 0.02, rng)),
                    ratio_record(noisy(0.5, n, 0.02, rng), noisy(2.0, n, 0.02, rng)),
                    ENERGY,
                ).verdict
                is Verdict.REGRESSED
                for _ in range(trials)
            )
            / trials
        )
    print(f"\nfalse REGRESSED, energy:5%, 2% sd: {rates}")
    assert all(rate <= 0.01 for rate in rates.values())


def test_a_change_at_the_limit_regresses_at_most_alpha_at_any_repeat_count():
    """H0 is the limit itself: a true +5% under a 5% limit is REGRESSED <= alpha (5%) of the
    time with 3 repeats and with 11 - the verdict means the same at every repeat count."""
    rng = np.random.default_rng(7)
    rates = {}
    for n in (3, 11):
        rates[n] = (
            sum(
                compare_case(
                    ratio_record(noisy(0.5, 5, 0.02, rng), [2.0] * 5),
                    ratio_record(noisy(0.525, n, 0.02, rng), [2.0] * n),
                    ENERGY,
                ).verdict
                is Verdict.REGRESSED
                for _ in range(400)
            )
            / 400
        )
    print(f"\nP(REGRESSED | +5% at a 5% limit): {rates}")
    assert all(rate <= 0.05 + 0.02 for rate in rates.values())  # alpha plus sampling slack


def test_small_real_change_under_noise_is_inconclusive_and_asks_for_the_next_look():
    base = ratio_record([0.50, 0.515, 0.485], [2.0] * 3)
    cur = ratio_record([0.535, 0.55, 0.52], [2.0] * 3)  # +7% with overlapping repeats
    result = compare_case(base, cur, ENERGY)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.rows[0].change_rel == pytest.approx(0.07)
    assert repeats_needed(result) == 2  # looks at 3, 5, ..., 11
    assert "needs 2 more repeats (look 1/5)" in result.failure_message(BASELINE_PATH)
    # At the cap nothing more is asked for: the policy decides.
    at_cap = compare_case(
        base,
        ratio_record([0.535, 0.55, 0.52] * 3 + [0.535, 0.55], [2.0] * 11),
        ENERGY,
        plan=gate_plan(0.05, 3, 11),
    )
    assert at_cap.verdict is Verdict.INCONCLUSIVE and repeats_needed(at_cap) == 0
    assert "inconclusive at the repeat cap" in at_cap.failure_message(None)
    assert "re-save the baseline with more repeats, or compare in-job" in at_cap.failure_message(
        None
    )


def test_inconclusive_stops_asking_at_a_smaller_cap():
    base = ratio_record([0.50, 0.515, 0.485], [2.0] * 3)
    cur = ratio_record([0.535, 0.55, 0.52, 0.535, 0.55], [2.0] * 5)
    plan = gate_plan(0.05, 3, 5)
    result = compare_case(base, cur, ENERGY, plan=plan)
    assert result.verdict is Verdict.INCONCLUSIVE and repeats_needed(result) == 0


def test_noise_free_modeled_repeats_decide_at_the_first_look():
    # The modeled meter repeats exactly; zero spread makes any shift beyond the limit real.
    result = compare_case(record([1.0] * 3), ratio_record([0.55] * 3, [2.0] * 3), ENERGY)
    assert result.verdict is Verdict.REGRESSED
    assert compare_case(record([1.0] * 3), record([1.0] * 3), ENERGY).verdict is Verdict.PASSED
    # A change inside the limit is not a regression however exact the numbers are.
    inside = compare_case(record([1.0] * 3), ratio_record([0.52] * 3, [2.0] * 3), ENERGY)
    assert inside.verdict is Verdict.PASSED


def test_too_few_repeats_ask_for_the_first_look_and_a_one_repeat_baseline_is_incomparable():
    for n in (1, 2):
        result = compare_case(
            ratio_record([0.5, 0.51, 0.49], [2.0] * 3), ratio_record([0.75] * n, [2.0] * n), ENERGY
        )
        assert result.verdict is Verdict.INCONCLUSIVE and repeats_needed(result) == 3 - n
    single = compare_case(record([1.0]), record([1.5] * 3), ENERGY)
    assert single.verdict is Verdict.INCOMPARABLE
    assert "the stored baseline has 1 repeat" in single.failure_message(None)


def test_inconclusive_policies():
    result = compare_case(
        ratio_record([0.50, 0.515, 0.485], [2.0] * 3),
        ratio_record([0.535, 0.55, 0.52], [2.0] * 3),
        ENERGY,
    )
    for policy in ("fail", "warn", "xfail"):
        resolution = resolve_inconclusive(policy, result, BASELINE_PATH)
        assert resolution.action == policy
        assert "inconclusive" in resolution.message and BASELINE_PATH in resolution.message
    with pytest.raises(ValueError, match="expected one of fail, warn, xfail"):
        resolve_inconclusive("ignore")


def test_improvement_is_reported():
    result = compare_case(
        ratio_record([0.60, 0.606, 0.594], [2.0] * 3),
        ratio_record([0.50, 0.505, 0.495], [2.0] * 3),
        ENERGY,
    )
    assert result.verdict is Verdict.IMPROVED
    assert "consider updating the baseline" in result.failure_message(None)


def test_acceptance_is_judged_per_repeat_not_as_an_exact_number():
    base = record([1.0, 1.0, 1.0])  # accept length 1 + 60/40 = 2.5 in every repeat
    shorter = record([1.0, 1.0, 1.0], correct=50)  # 2.25 in every repeat, acceptance 50/320
    result = compare_case(base, shorter, parse_fail_exprs(["accept:0.1", "acceptance_rate:0.05"]))
    accept, rate = result.rows
    assert accept.verdict is Verdict.REGRESSED and accept.method.startswith("sequential")
    assert rate.verdict is Verdict.PASSED  # 0.1875 -> 0.15625 is within 0.05
    assert (
        "accept_length (median): baseline 2.5 tokens/step -> current 2.25 tokens/step"
        in result.failure_message(BASELINE_PATH)
    )
    # One repeat in which one prompt diverged: a noisy, small drop is not a regression, even
    # under a zero limit (the exact comparison called it REGRESSED).
    one_off = copy.deepcopy(base)
    one_off["speculative"]["samples"][1]["correct_drafts"] = 58
    zero = compare_case(base, one_off, parse_fail_exprs(["accept_length:0"]))
    assert zero.verdict is Verdict.INCONCLUSIVE and repeats_needed(zero) == 2


def test_a_drafter_that_accepts_nothing_regresses_under_a_relative_limit():
    none = record([1.0, 1.0, 1.0], correct=0)
    result = compare_case(record([1.0] * 3), none, parse_fail_exprs(["acceptance_rate:5%"]))
    assert result.verdict is Verdict.REGRESSED, result.failure_message(None)


def _with_requests(rec, per_repeat):
    rec = copy.deepcopy(rec)
    for sample, values in zip(rec["speculative"]["samples"], per_repeat):
        sample["accept_lengths"] = list(values)
    return rec


def test_per_request_accept_lengths_are_used_when_present():
    base = _with_requests(record([1.0] * 3), [[2.5] * 16] * 3)
    assert request_accept_lengths(base) == [2.5] * 16
    # One prompt of 16 diverging in one repeat: not REGRESSED at a 5% limit.
    one = _with_requests(record([1.0] * 3), [[2.5] * 16, [2.5] * 15 + [1.5], [2.5] * 16])
    result = compare_case(base, one, parse_fail_exprs(["accept_length:5%"]))
    row = result.rows[0]
    assert "bootstrap over requests" in row.method and row.verdict is not Verdict.REGRESSED
    # Every request shorter by 20%: REGRESSED.
    worse = _with_requests(record([1.0] * 3), [[2.0] * 16] * 3)
    assert (
        compare_case(base, worse, parse_fail_exprs(["accept_length:5%"])).verdict
        is Verdict.REGRESSED
    )
    # Absent on one side: per repeat.
    mixed = compare_case(record([1.0] * 3), worse, parse_fail_exprs(["accept_length:5%"]))
    assert "welch" in mixed.rows[0].method
    # RepeatSample.as_dict() names the field accept_lengths.
    real = record([1.0] * 3)
    for sample in real["speculative"]["samples"]:
        sample["accept_lengths"] = [2.0] * 16
    assert request_accept_lengths(real) == [2.0] * 16


def test_deterministic_equivalence():
    base = record([1.0, 1.0, 1.0])
    diverged = record([1.0, 1.0, 1.0], spec_outputs=((1, 2, 3, 4, 5, 6), (7, 8, 0, 10, 11, 12)))
    eq = compare_case(base, diverged, parse_fail_exprs(["equivalence:0"]))
    assert eq.verdict is Verdict.REGRESSED and eq.rows[0].method == "deterministic"
    assert "change -50.00% (-50 pts)" in eq.failure_message(BASELINE_PATH)


def test_energy_saving_pairs_repeats_and_uses_points():
    base = record([1.0, 1.01, 0.99], [2.0, 2.02, 1.98])  # saving 50%
    cur = record([1.0, 1.01, 0.99], [1.6, 1.616, 1.584])  # saving 37.5%
    result = compare_case(base, cur, parse_fail_exprs(["energy_saving:2%"]))
    row = result.rows[0]
    assert result.verdict is Verdict.REGRESSED
    assert row.method.startswith("sequential welch-t on differences")
    assert row.change_abs == pytest.approx(-0.125)
    assert "(-12.5 pts)" in row.change_text()
    same = compare_case(base, copy.deepcopy(base), parse_fail_exprs(["energy_saving:2%"]))
    assert same.verdict is Verdict.PASSED


def test_missing_values_are_incomparable_not_passed():
    no_counters = record([1.0, 1.0, 1.0], correct=None, verify=None, proposed=None)
    result = compare_case(record([1.0, 1.0, 1.0]), no_counters, parse_fail_exprs(["accept:0.1"]))
    assert result.verdict is Verdict.INCOMPARABLE
    assert "current record has no accept_length values" in result.failure_message(None)


def test_no_baseline():
    result = compare_case(None, record([1.0, 1.0, 1.0]), ENERGY)
    assert result.verdict is Verdict.NO_BASELINE and result.verdict.mark == "?"


# -- in-job A/B -------------------------------------------------------------------------------
def ab_record(
    cand_ratios,
    ref_ratios,
    base_ept,
    *,
    ref_correct=60,
    cand_correct=60,
    ref_source="modeled (h200)",
):
    """A record with a reference drafter's arm, sample i of all three arms from cycle i."""
    rec = ratio_record(cand_ratios, base_ept, correct=cand_correct)
    ref = _arm(
        "speculative",
        [r * b for r, b in zip(ref_ratios, base_ept)],
        [8.0] * len(base_ept),
        verify=40,
        correct=ref_correct,
        proposed=320,
        source=ref_source,
    )
    rec["reference"] = {**ref.as_dict(), "arm": "reference"}
    rec["reference_drafter"] = Drafter("ngram", num_draft_tokens=4, id="ngram-old").as_dict()
    return rec


def test_in_job_a_b_regressed_candidate_fails_against_the_reference():
    rec = ab_record([0.60, 0.606, 0.594], [0.50, 0.505, 0.495], [2.0, 2.1, 1.9])
    result = compare_in_job(rec, limits_for(()))
    assert result.verdict is Verdict.REGRESSED
    energy = result.rows[0]
    assert energy.metric == "energy_ratio" and energy.method.startswith("sequential paired t")
    assert energy.change_rel == pytest.approx(0.20)
    message = result.failure_message(None)
    assert "against reference drafter ngram-old (in-job A/B)" in message
    assert result.as_dict()["mode"] == "in-job"


def test_in_job_a_b_unchanged_candidate_passes_and_the_shared_baseline_cancels():
    # The baseline arm drifts 10% over the session; candidate = reference: PASSED at look 1.
    rec = ab_record([0.50, 0.505, 0.495], [0.50, 0.505, 0.495], [2.0, 2.1, 2.2])
    result = compare_in_job(rec, limits_for(()))
    assert result.verdict is Verdict.PASSED, result.failure_message(None)


def test_in_job_a_b_inconclusive_asks_for_repeats_of_all_arms_until_the_cap():
    cand, ref = [0.535, 0.52, 0.55], [0.50, 0.51, 0.49]
    result = compare_in_job(ab_record(cand, ref, [2.0] * 3), ENERGY)
    assert result.verdict is Verdict.INCONCLUSIVE and repeats_needed(result) == 2
    full = compare_in_job(ab_record(cand * 3 + cand[:2], ref * 3 + ref[:2], [2.0] * 11), ENERGY)
    assert repeats_needed(full) == 0


def test_in_job_a_b_acceptance_and_equivalence():
    rec = ab_record([0.5] * 3, [0.5] * 3, [2.0] * 3, cand_correct=40, ref_correct=60)
    result = compare_in_job(rec, parse_fail_exprs(["accept_length:5%", "equivalence:0"]))
    accept, eq = result.rows
    assert accept.verdict is Verdict.REGRESSED  # 2.0 vs the reference's 2.5 tokens/step
    assert eq.verdict is Verdict.PASSED and "compared with 1.0" in eq.note


def test_in_job_a_b_with_another_energy_source_is_incomparable():
    rec = ab_record([0.5] * 3, [0.5] * 3, [2.0] * 3, ref_source="measured (nvml)")
    result = compare_in_job(rec, ENERGY)
    assert result.verdict is Verdict.INCOMPARABLE and "energy source" in result.reasons[0]


# -- comparability --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(source="measured (nvml)"), "modeled and measured energy are never compared"),
        (dict(source="modeled (h100)"), "modeled GPU differs"),
        (
            dict(engine={**ENGINE, "version": "0.2.0"}),
            "engine version differs: baseline '0.1.0', current '0.2.0'",
        ),
        (dict(engine={**ENGINE, "engine": "sglang"}), "engine differs"),
        (
            dict(engine={**ENGINE, "server_info": {"disable_cuda_graph": True}}),
            "the baseline does not record its CUDA-graph setting",
        ),
    ],
)
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
    assert result.reasons == (
        "CUDA-graph setting differs: disable_cuda_graph=False (baseline) "
        "vs True (current); CUDA graphs change the result",
    )


def test_machine_key_and_scenario_mismatch():
    base, cur = record([1.0] * 3), record([1.0] * 3)
    result = compare_case(
        base,
        cur,
        ENERGY,
        baseline_info={"machine_key": "1xnvidia-h100-nvml"},
        current_info={"machine_key": "1xnvidia-h200-nvml"},
    )
    assert result.verdict is Verdict.INCOMPARABLE
    assert (
        "machine key differs: baseline '1xnvidia-h100-nvml', current '1xnvidia-h200-nvml'"
        in result.reasons[0]
    )
    other = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=load_corpus("news"),
    )
    reasons = comparable(run_info(base), run_info(record([1.0] * 3, case=other)))
    assert len(reasons) == 1 and reasons[0].startswith("corpus differs")
    assert comparable(run_info(base), run_info(cur)) == []


def test_compare_documents_matches_by_case_and_flags_missing():
    base_doc = {"machine_key": "k", "results": [ratio_record([0.5, 0.505, 0.495], [2.0] * 3)]}
    other = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=8,
        corpus=load_corpus("code"),
    )
    cur_doc = {
        "machine_key": "k",
        "results": [ratio_record([0.6, 0.606, 0.594], [2.0] * 3), record([1.0] * 3, case=other)],
    }
    first, second = compare_documents(base_doc, cur_doc, ENERGY)
    assert (first.case_id, first.verdict) == ("code-ngram-b4", Verdict.REGRESSED)
    assert (second.case_id, second.verdict) == ("code-ngram-b8", Verdict.NO_BASELINE)
    assert first.as_dict()["rows"][0]["verdict"] == "regressed"
    assert first.summary() == "code-ngram-b4: regressed (energy_ratio +20.00% (+0.1 x))"


def test_an_a_a_control_is_not_judged_on_drafting_metrics():
    """Drafter("none") drafts nothing: accept length and acceptance rate do not apply to it, so
    the default limits (accept_length among them) leave it comparable on energy and equivalence."""
    aa_case = Case.of(
        engine="sglang",
        model="tiny:dense",
        drafter=Drafter("none"),
        batch=4,
        corpus=load_corpus("code"),
    )
    aa = record(
        [1.0, 1.01, 0.99], [1.0, 1.01, 0.99], correct=None, verify=None, proposed=None, case=aa_case
    )
    result = compare_case(aa, copy.deepcopy(aa), limits_for(()))
    assert [row.metric for row in result.rows] == ["energy_ratio", "equivalence"]
    assert result.verdict is Verdict.PASSED
    ngram = record([1.0, 1.01, 0.99], correct=None, verify=None, proposed=None)
    assert compare_case(ngram, copy.deepcopy(ngram), limits_for(())).verdict is Verdict.INCOMPARABLE


def test_modeled_runs_under_different_calibrations_are_incomparable():
    """A modeled figure priced before the presets were fitted to measurements (no calibration in
    its window's details) is never compared with one priced after."""

    def calibrated(data, calibration):
        for arm in ("baseline", "speculative"):
            for sample in data[arm]["samples"]:
                sample["window"] = {"full": {"details": {"calibration": calibration}}}
        return data

    base = calibrated(record([1.0, 1.0, 1.0]), None)
    cur = calibrated(record([1.0, 1.0, 1.0]), "mlenergy-v3-h100@0cd52da")
    result = compare_case(base, cur, ENERGY)
    assert result.verdict is Verdict.INCOMPARABLE
    assert "modeled meter's calibration" in result.failure_message(BASELINE_PATH)
    same = compare_case(
        cur, calibrated(record([1.0, 1.0, 1.0]), "mlenergy-v3-h100@0cd52da"), ENERGY
    )
    assert same.verdict is not Verdict.INCOMPARABLE
