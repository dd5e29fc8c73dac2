"""Numerical ties against real divergences: classification by the tie rule (the engine's noise
margin, the share bound), assert_equivalent, JSON, samples. The pairs here have no engine facts, so
their noise margin is the assumed bfloat16 one (0.125 nats), a real GPU engine's."""

from __future__ import annotations

import json

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.measure.coherence import Coherence
from pytest_specenergy.measure.degeneracy import degeneracy
from pytest_specenergy.measure.equivalence import DEFAULT_TIE_MARGIN
from pytest_specenergy.measure.equivalence import DivergenceMargin
from pytest_specenergy.measure.equivalence import compare_outputs
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.measure.results import SpecEnergyAssertionError
from pytest_specenergy.measure.window import request_accept_lengths

CASE = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram"),
    batch=2,
    corpus=load_corpus("code"),
)
BASE = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]]
# Prompt 1 diverges at token 2 (9 -> 90), prompt 2 at token 4 (17 -> 70).
SPEC = [BASE[0], [7, 8, 90, 10, 11, 12], [13, 14, 15, 16, 70, 18]]
TIE = DivergenceMargin(0.01, (9, 90), True, 0.02, 3)
REAL = DivergenceMargin(1.7, (17, 70), True, 0.0, None)


def run(name: str, outputs, server_info=None) -> RunResult:
    sample = RepeatSample(
        1.0,
        1.0,
        10,
        5.0,
        4 if name == "speculative" else None,
        6 if name == "speculative" else None,
        16 if name == "speculative" else None,
    )
    return RunResult.measured(
        arm=name,
        engine={"server_info": server_info or {}},
        source="modeled (h200)",
        samples=(sample,),
        outputs=tuple(tuple(o) for o in outputs),
        finish_reasons=("length",) * len(outputs),
        verified_per_step=5 if name == "speculative" else 1,
    )


def pair(margins, spec=SPEC, server_info=None, scores=(0.0, 0.0, 0.0)) -> PairResult:
    diverged = tuple(b != s for b, s in zip(BASE, spec))
    coherence = Coherence(
        (0.0,) * 3, tuple(scores), degeneracy(BASE, spec), diverged, tuple(margins)
    )
    return PairResult(
        CASE,
        CASE.id,
        run("baseline", BASE, server_info),
        run("speculative", spec, server_info),
        coherence,
    )


def test_a_divergence_at_a_near_tie_of_the_baselines_two_best_is_a_tie():
    eq = compare_outputs(BASE, SPEC, [None, TIE, REAL])
    assert [r.kind() for r in eq.requests] == ["exact", "tie", "real"]
    assert [r.prompt_index for r in eq.ties] == [1]
    assert [r.prompt_index for r in eq.real_divergences] == [2]
    assert eq.matched_fraction == pytest.approx(2 / 3) and eq.exact_fraction == pytest.approx(1 / 3)
    assert eq.summary().endswith("1 numerical tie(s), 1 real")


@pytest.mark.parametrize(
    ("margin", "why"),
    [
        (None, "not measured"),
        (DivergenceMargin(0.2, (9, 90), True, 0.0), "margin over the threshold"),
        (DivergenceMargin(0.01, (9, 55), False, 0.0), "speculative token not the runner-up"),
        (DivergenceMargin(0.01, (9, 90), True, 0.9, 5), "text after the tie not greedy"),
    ],
)
def test_anything_short_of_a_proven_tie_is_real(margin, why):
    assert compare_outputs(BASE, SPEC, [None, margin, REAL]).requests[1].kind() == "real", why


def test_the_threshold_is_an_argument_and_zero_is_exact_equality():
    eq = compare_outputs(BASE, SPEC, [None, TIE, REAL])
    # At 2 nats both divergences are near-ties: 2 of 3 prompts, over the share ties may excuse.
    wide = eq.classified(2.0)
    assert len(wide.near_ties) == 2 and wide.ties == () and wide.ties_over_bound
    assert len(eq.classified(2.0, max_tie_share=1.0).ties) == 2
    assert len(eq.classified(0.0).ties) == 0
    with pytest.raises(ValueError, match="tie_margin must be a finite number of nats >= 0"):
        eq.classified(-0.1)
    with pytest.raises(ValueError, match=r"max_tie_share must be a share of prompts in \[0, 1\]"):
        eq.classified(max_tie_share=1.5)
    with pytest.raises(ValueError, match="3 divergence margins for 2 prompts"):
        compare_outputs(BASE[:2], SPEC[:2], [None, TIE, REAL])


def test_assert_equivalent_passes_ties_and_fails_real_divergences_naming_prompt_token_margin():
    tied = pair([None, TIE, None], spec=[BASE[0], SPEC[1], BASE[2]])
    tied.assert_equivalent()
    assert "1 numerical tie(s), 0 real" in tied.describe()
    with pytest.raises(SpecEnergyAssertionError, match="tie threshold 0.001"):
        tied.assert_equivalent(tie_margin=0.001)  # exact-ish equality: the tie counts as real

    broken = pair([None, TIE, REAL])
    with pytest.raises(SpecEnergyAssertionError) as info:
        broken.assert_equivalent()
    text = str(info.value)
    assert (
        "exact-match fraction 0.667 (counting 1 numerical tie(s) as matches) is below the "
        "required 1.000\n" in text
    )
    assert (
        "\n  1 real divergence(s), the first at token 4 of prompt 2 (baseline top-2 margin 1.700 "
        "nats" in text
    )


def test_the_bounds_count_ties_as_matches_and_still_fail_a_real_divergence():
    broken = pair([None, TIE, REAL])
    broken.assert_equivalent(min_exact_fraction=0.6)
    with pytest.raises(SpecEnergyAssertionError, match="below the required 0.700"):
        broken.assert_equivalent(min_exact_fraction=0.7)
    # The tie at token 2 does not count against the prefix; the real divergence at 4 does.
    broken.assert_equivalent(min_common_prefix=4)
    with pytest.raises(
        SpecEnergyAssertionError,
        match=r"at token 4 of prompt 2, before the required common prefix of 5 \(1 of 3",
    ):
        broken.assert_equivalent(min_common_prefix=5)


def test_no_margins_means_exact_equality_as_before():
    unmeasured = PairResult(CASE, CASE.id, run("baseline", BASE), run("speculative", SPEC))
    with pytest.raises(SpecEnergyAssertionError, match="baseline top-2 margin not measured"):
        unmeasured.assert_equivalent()
    empty = PairResult(CASE, CASE.id, run("baseline", []), run("speculative", []))
    with pytest.raises(SpecEnergyAssertionError, match="the arms answered no prompts"):
        empty.assert_equivalent()


def test_json_records_each_divergence_with_margin_and_class():
    record = json.loads(json.dumps(pair([None, TIE, REAL]).as_dict()))
    eq = record["equivalence"]
    assert (eq["ties"], eq["real_divergences"], eq["tie_margin"]) == (1, 1, DEFAULT_TIE_MARGIN)
    assert [
        (d["prompt"], d["first_divergence"], d["margin"], d["class"]) for d in eq["divergences"]
    ] == [(1, 2, 0.01, "tie"), (2, 4, 1.7, "real")]
    assert eq["divergences"][0]["top2"]["later_gap"] == 0.02
    assert record["coherence"]["margins"][1]["top_ids"] == [9, 90]


def counters(completion: int, verify: int | None) -> RequestCounters:
    return RequestCounters("r", 5, completion, "length", None, None, spec_verify_ct=verify)


def test_per_request_accept_lengths_and_their_json_round_trip():
    lengths = request_accept_lengths([counters(33, 8), counters(1, None), counters(17, 16)])
    assert lengths == (4.0, 1.0)  # the request that finished in its prefill has no verify step
    assert request_accept_lengths([counters(33, None)]) is None  # a baseline arm
    sample = RepeatSample(1.0, 1.0, 48, 5.0, 24, 24, 96, accept_lengths=lengths)
    back = RepeatSample.from_dict(json.loads(json.dumps(sample.as_dict())))
    assert back == sample and back.accept_lengths == (4.0, 1.0)
    old = sample.as_dict()
    del old["accept_lengths"]  # a file written before the field existed
    assert RepeatSample.from_dict(old).accept_lengths is None
    with pytest.raises(
        ValueError, match="'accept_lengths' is 'many', expected an array of finite numbers >= 0"
    ):
        RepeatSample.from_dict({**old, "accept_lengths": "many"})
    with pytest.raises(ValueError, match="lacks 'decode_tokens'"):
        RepeatSample.from_dict({"decode_joules": 1.0, "decode_seconds": 1.0})


FLOAT32 = {"dtype": "float32"}
NOISY = {"dtype": "float32", "logit_noise_scale": 2.0**-8}


def test_a_float32_engine_excuses_no_near_tie_its_rounding_cannot_flip():
    """Issue 40 item 2: the margin a tie may have is the engine's own rounding's, not a fixed 0.125
    nats. partial-accept-state on tiny:hybrid (float32) diverged at margins 0.029 and 0.122, which
    the fixed margin excused; a float32 engine's margin is its path noise floor, 2**-13."""
    tied = pair([None, TIE, None], spec=[BASE[0], SPEC[1], BASE[2]], server_info=FLOAT32)
    assert tied.noise_margin.margin == 2.0**-13
    assert tied.equivalence.ties == () and len(tied.equivalence.real_divergences) == 1
    with pytest.raises(
        SpecEnergyAssertionError,
        match=r"token 2 of prompt 1 \(baseline top-2 margin 0.010 nats, tie threshold 0.000122; "
        r"the threshold is the float32 engine's path noise floor \(decode vs verify logits\), "
        r"2\*\*-13\)",
    ):
        tied.assert_equivalent()
    # The same divergence on an engine that rounds like bfloat16 is a tie.
    noisy = pair([None, TIE, None], spec=[BASE[0], SPEC[1], BASE[2]], server_info=NOISY)
    assert noisy.noise_margin.margin == 0.125 and len(noisy.equivalence.ties) == 1
    noisy.assert_equivalent()
    assert noisy.as_dict()["equivalence"]["tie_margin_source"].startswith(
        "the engine's emulated logit rounding (relative 0.00391"
    )


def test_ties_excuse_at_most_half_the_prompts():
    both = DivergenceMargin(0.02, (17, 70), True, 0.03, 4)
    crowded = pair([None, TIE, both])
    eq = crowded.equivalence
    assert len(eq.near_ties) == 2 and eq.ties == () and eq.matched_fraction == pytest.approx(1 / 3)
    with pytest.raises(
        SpecEnergyAssertionError,
        match=r"a near-tie, but 2 of 3 prompts diverge at near-ties, more than the 50% ties may "
        r"excuse\)",
    ):
        crowded.assert_equivalent()
    assert "(2 near-ties, over the tie share bound)" in crowded.describe()
    record = crowded.as_dict()["equivalence"]
    assert (record["near_ties"], record["ties"], record["max_tie_share"]) == (2, 0, 0.5)
    crowded.assert_equivalent(max_tie_share=1.0)  # the caller's bound


def test_a_tied_prompts_other_greedy_path_is_left_out_of_the_mean_gap():
    """Under numerical-noise the quickstart's hybrid b4 tied one prompt whose continuation, the
    target's greedy text up to noise at every token, scored 0.300 nats/token below the baseline's:
    another greedy path, which failed assert_coherent's mean gap although nothing was wrong."""
    tied = pair([None, TIE, None], spec=[BASE[0], SPEC[1], BASE[2]], scores=(0.0, -0.3, 0.0))
    assert tied.coherence.mean_gap == pytest.approx(0.3)
    tied.assert_coherent()
    real = pair([None, REAL, None], spec=[BASE[0], SPEC[1], BASE[2]], scores=(0.0, -0.3, 0.0))
    with pytest.raises(SpecEnergyAssertionError, match="log-probability gap 0.300 nats/token"):
        real.assert_coherent(tie_margin=float("inf"))
