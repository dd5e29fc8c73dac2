"""Degeneracy detectors and fail-closed checks on synthetic data: each trips on its bad case."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.measure.checks import checked
from pytest_specenergy.measure.checks import counter_problems
from pytest_specenergy.measure.checks import pair_checks
from pytest_specenergy.measure.coherence import Coherence
from pytest_specenergy.measure.degeneracy import degeneracy
from pytest_specenergy.measure.degeneracy import distinct_n
from pytest_specenergy.measure.degeneracy import repeated_suffix_fraction
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult

VARIED = [5, 17, 3, 99, 42, 8, 61, 23, 7, 70, 11, 36, 90, 2, 54, 28]
LOOPING = [5, 17, 3] + [9, 4] * 20


def test_repetition_and_distinct_n():
    assert repeated_suffix_fraction(VARIED) == 0.0
    assert repeated_suffix_fraction(LOOPING) > 0.9
    assert distinct_n(VARIED) == 1.0
    assert distinct_n(LOOPING) < 0.2


def test_degeneracy_is_relative_to_the_baseline():
    healthy = degeneracy([VARIED, LOOPING], [VARIED, LOOPING], special_ids=[0])
    assert healthy.problems() == []
    broken = degeneracy(
        [VARIED, VARIED], [LOOPING, VARIED + [0, 1] + VARIED + VARIED], special_ids=[0]
    )
    found = " | ".join(broken.problems())
    assert "repetition loop" in found
    assert "distinct-2 collapse" in found
    assert "special-token leakage: 1" in found
    assert "length blow-up" in found


def counters(completion, verify, correct, proposed=None, hist=None):
    return RequestCounters(
        rid="r",
        prompt_tokens=5,
        completion_tokens=completion,
        finish_type="length",
        finish_detail=None,
        e2e_latency=0.1,
        spec_verify_ct=verify,
        spec_num_correct_drafts=correct,
        spec_num_proposed_drafts=proposed,
        correct_drafts_histogram=hist,
    )


def test_counter_consistency():
    # 33 tokens: 1 from prefill + 8 steps committing 4 each (3 drafts + bonus).
    assert counter_problems([counters(33, 8, 24, 32)], drafted_per_step=4) == []
    # The last step cut by max_new_tokens: up to 4 more drafts accepted than committed.
    assert counter_problems([counters(31, 8, 24, 32)], drafted_per_step=4) == []
    inflated = counter_problems([counters(33, 8, 40, 32)], drafted_per_step=4)
    assert any(
        "40 accepted drafts reported, but 33 tokens over 8 verify steps allow 24 to 28" in p
        for p in inflated
    )
    assert counter_problems([counters(33, 8, 24, 16)], drafted_per_step=4)
    assert counter_problems([counters(33, 8, 24, 32, hist=(0, 0, 0, 1))], drafted_per_step=4)


CASE = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram", num_draft_tokens=4),
    batch=2,
    corpus=load_corpus("code"),
)


def run(
    arm, outputs, verify=None, correct=None, mean_running=2.0, max_running=2, window_means=None
):
    sample = RepeatSample(
        1.0, 1.0, 10, 5.0, verify, correct, None if verify is None else verify * 4
    )
    return RunResult.measured(
        arm=arm,
        engine={},
        source="modeled (h200)",
        samples=(sample,),
        outputs=tuple(map(tuple, outputs)),
        finish_reasons=("length", "length"),
        verified_per_step=5 if arm == "speculative" else 1,
        concurrency={
            "requested": 2,
            "max_running": max_running,
            "min_running": 1,
            "mean_running": mean_running,
            "window_means": window_means,
        },
    )


def names(pair):
    return {c.name for c in pair_checks(pair)}


def test_healthy_pair_trips_nothing():
    pair = PairResult(
        CASE,
        CASE.id,
        run("baseline", [VARIED, LOOPING]),
        run("speculative", [VARIED, LOOPING], verify=10, correct=20),
    )
    assert pair_checks(pair) == []


def test_fail_closed_controls():
    base = run("baseline", [VARIED, LOOPING])
    missing = PairResult(CASE, CASE.id, base, run("speculative", [VARIED, LOOPING]))
    assert "missing-counters" in names(missing)
    zero = PairResult(
        CASE, CASE.id, base, run("speculative", [VARIED, LOOPING], verify=0, correct=0)
    )
    assert "no-verify-steps" in names(zero)
    nothing = PairResult(
        CASE, CASE.id, base, run("speculative", [VARIED, LOOPING], verify=10, correct=0)
    )
    assert "accept-length-1-on-repetition" in names(nothing)
    self_draft = Drafter("draft_model", draft_model="tiny:dense", num_draft_tokens=4)
    self_case = dataclasses.replace(CASE, spec=dataclasses.replace(CASE.spec, drafter=self_draft))
    # 2 requests, 10 verify steps of 4: at least (10 - 2) * 4 = 32 accepted drafts.
    weak_self = PairResult(
        self_case, "x", base, run("speculative", [VARIED, LOOPING], verify=10, correct=30)
    )
    assert "self-draft-not-exact" in names(weak_self)
    cut_short = PairResult(
        self_case, "x", base, run("speculative", [VARIED, LOOPING], verify=10, correct=32)
    )
    assert "self-draft-not-exact" not in names(cut_short)


def test_incoherent_divergence_and_warnings():
    base = run("baseline", [VARIED, VARIED], mean_running=1.0, max_running=1)
    spec = run("speculative", [LOOPING, VARIED], verify=10, correct=20)
    coherence = Coherence(
        (-0.2, 0.0), (-3.5, 0.0), degeneracy([VARIED, VARIED], [LOOPING, VARIED]), (True, False)
    )
    assert coherence.mean_gap == 3.3
    pair = PairResult(CASE, CASE.id, base, spec, coherence)
    found = names(pair)
    assert {"incoherent", "degenerate-output", "concurrency-below-batch"} <= found
    assert checked(pair).failed_checks


def windowed(arm, prefill_j, full_j, gpus=(), graph=None, full_loops=1, prefill_loops=1):
    window = {
        "full": {
            "joules": full_j,
            "loops": full_loops,
            "details": {"gpus": [{"uuid": g} for g in gpus]},
        },
        "prefill": {"joules": prefill_j, "loops": prefill_loops},
    }
    sample = RepeatSample(
        full_j / full_loops - prefill_j / prefill_loops,
        1.0,
        10,
        5.0,
        10 if arm == "speculative" else None,
        20 if arm == "speculative" else None,
        40 if arm == "speculative" else None,
        window=window,
    )
    engine = {"server_info": {"disable_cuda_graph": graph}} if graph is not None else {}
    return RunResult.measured(
        arm=arm,
        engine=engine,
        source="measured (nvml)",
        samples=(sample,),
        outputs=(tuple(VARIED), tuple(LOOPING)),
        finish_reasons=("length", "length"),
        verified_per_step=5,
        concurrency={},
    )


def test_pairing_and_window_checks():
    good = PairResult(
        CASE,
        CASE.id,
        windowed("baseline", 1.0, 10.0, ["GPU-a"], False),
        windowed("speculative", 1.0, 8.0, ["GPU-a"], False),
    )
    assert not {
        "cuda-graph-differs",
        "gpu-differs",
        "prefill-in-window",
        "prefill-dominates-window",
    } & names(good)
    bad = PairResult(
        CASE,
        CASE.id,
        windowed("baseline", 1.0, 10.0, ["GPU-a"], False),
        windowed("speculative", 1.0, 8.0, ["GPU-b"], True),
    )
    assert {"cuda-graph-differs", "gpu-differs"} <= names(bad)
    no_decode = PairResult(
        CASE, CASE.id, windowed("baseline", 5.0, 5.0), windowed("speculative", 1.0, 8.0)
    )
    assert "prefill-in-window" in names(no_decode)
    heavy = PairResult(
        CASE, CASE.id, windowed("baseline", 6.0, 10.0), windowed("speculative", 1.0, 8.0)
    )
    assert "prefill-dominates-window" in names(heavy)


def test_concurrency_check_reads_the_mean_and_fails_closed():
    # The speculative batch drained: it touched the batch (max 2 = batch) but averaged 1.2.
    # The old check read the max and never fired.
    drained = PairResult(
        CASE,
        CASE.id,
        run("baseline", [VARIED, LOOPING]),
        run(
            "speculative", [VARIED, LOOPING], verify=10, correct=20, mean_running=1.2, max_running=2
        ),
    )
    checks = [c for c in pair_checks(drained) if c.name == "concurrency-below-batch"]
    assert checks and checks[0].severity == "fail" and "speculative" in checks[0].message
    assert checked(drained).failed_checks
    # At 90% of the batch it passes; one repeat below it fails even when the merged mean is fine.
    held = PairResult(
        CASE,
        CASE.id,
        run("baseline", [VARIED, LOOPING], mean_running=1.8),
        run("speculative", [VARIED, LOOPING], verify=10, correct=20, mean_running=1.85),
    )
    assert "concurrency-below-batch" not in names(held)
    one_bad = PairResult(
        CASE,
        CASE.id,
        run("baseline", [VARIED, LOOPING], mean_running=1.9, window_means=[2.0, 1.5]),
        run("speculative", [VARIED, LOOPING], verify=10, correct=20),
    )
    assert "concurrency-below-batch" in names(one_bad)


def test_prefill_share_is_per_loop_not_per_window():
    # Under nvml both windows are stretched to the same few seconds: a run whose prefill is 5%
    # of its energy (1.0 J per full loop, 0.05 J per prefill loop) fills 5 s with 5 full loops
    # (5 J) but 84 prefill-only loops (4.2 J). Window totals read 84%; per loop it is 5%.
    light = PairResult(
        CASE,
        CASE.id,
        windowed("baseline", 4.2, 5.0, full_loops=5, prefill_loops=84),
        windowed("speculative", 4.2, 5.0, full_loops=5, prefill_loops=84),
    )
    assert "prefill-dominates-window" not in names(light)
    assert "prefill-in-window" not in names(light)
    # A real 60% share still warns, loops or not.
    heavy = PairResult(
        CASE,
        CASE.id,
        windowed("baseline", 6.0 * 8, 10.0, full_loops=1, prefill_loops=8),
        windowed("speculative", 1.0, 8.0),
    )
    assert "prefill-dominates-window" in names(heavy)


def test_sglang_twin_whose_resolved_settings_differ_fails():
    """SGLang picks a finer CUDA-graph list for a speculative engine: the resolved
    /server_info of the two arms then differs outside speculative_*, and the pair fails."""

    def sglang(run, **info):
        engine = {
            "engine": "sglang",
            "version": "0.5.23",
            "server_info": {
                "cuda_graph_bs": [1, 2, 4, 8],
                "port": 30000,
                "speculative_algorithm": None,
                **info,
            },
        }
        return run.replaced(engine=engine)

    base = windowed("baseline", 1.0, 10.0, ["GPU-a"], False)
    spec = windowed("speculative", 1.0, 8.0, ["GPU-a"], False)
    matched = PairResult(
        CASE, CASE.id, sglang(base), sglang(spec, port=30001, speculative_algorithm="NGRAM")
    )
    assert "twin-differs" not in names(matched)
    finer = PairResult(
        CASE, CASE.id, sglang(base), sglang(spec, cuda_graph_bs=[1, 2, 3, 4, 5, 6, 7, 8])
    )
    assert "twin-differs" in names(finer)
    assert "cuda_graph_bs" in next(
        c.message for c in pair_checks(finer) if c.name == "twin-differs"
    )


def covered(arm, share, prompts=2, **kwargs):
    """``run`` over ``prompts`` outputs with every sample's coverage set to ``share``."""
    base = run(arm, [VARIED, LOOPING] * (prompts // 2), **kwargs)
    return base.replaced(
        samples=tuple(dataclasses.replace(s, coverage=share) for s in base.samples)
    )


def test_arms_are_compared_with_each_other_not_only_with_the_batch():
    # Both arms pass the 90% floor at batch 2 (>= 1.8), yet one ran 7.5% of the batch fewer rows.
    apart = PairResult(
        CASE,
        CASE.id,
        run("baseline", [VARIED, LOOPING], mean_running=1.99),
        run("speculative", [VARIED, LOOPING], verify=10, correct=20, mean_running=1.84),
    )
    found = pair_checks(apart)
    assert "concurrency-below-batch" not in {c.name for c in found}
    differs = [c for c in found if c.name == "concurrency-differs"]
    assert (
        differs
        and differs[0].severity == "fail"
        and "1.99 (baseline) vs 1.84" in differs[0].message
    )
    close = PairResult(
        CASE,
        CASE.id,
        run("baseline", [VARIED, LOOPING], mean_running=1.98),
        run("speculative", [VARIED, LOOPING], verify=10, correct=20, mean_running=1.92),
    )
    assert "concurrency-differs" not in names(close)


def test_coverage_gap_between_the_arms_fails_past_the_bound():
    # A pool of 20 at batch 2 leaves at most 1/20 uncovered by construction: the 10-point bound
    # holds.
    far = PairResult(
        CASE,
        CASE.id,
        covered("baseline", 1.0, prompts=20),
        covered("speculative", 0.85, prompts=20, verify=10, correct=20),
    )
    checks = [c for c in pair_checks(far) if c.name == "coverage-differs"]
    assert checks and checks[0].severity == "fail", checks
    assert (
        "100.0% (baseline) vs 85.0%" in checks[0].message
        and "pool of 20 prompts" in checks[0].message
    )
    near = PairResult(
        CASE,
        CASE.id,
        covered("baseline", 0.95, prompts=20),
        covered("speculative", 0.90, prompts=20, verify=10, correct=20),
    )
    assert "coverage-differs" not in names(near)
    # A record written before coverage existed is not judged.
    old = PairResult(
        CASE, CASE.id, covered("baseline", None), covered("speculative", 0.5, verify=10, correct=20)
    )
    assert "coverage-differs" not in names(old)
    assert far.speculative.record.coverage == 0.85


def test_a_small_pool_allows_the_gap_its_window_close_makes_and_says_so():
    # Pool 2 at batch 2: one slot may still hold a whole output when the window closes, so the
    # arms may be up to 50 points apart with nothing wrong; 15 points warns, naming the pool
    # that would hold 10, and 60 points (more than the pool allows) fails.
    small = PairResult(
        CASE, CASE.id, covered("baseline", 1.0), covered("speculative", 0.85, verify=10, correct=20)
    )
    [check] = [c for c in pair_checks(small) if c.name == "coverage-differs"]
    assert (
        check.severity == "warn"
        and "up to 50%" in check.message
        and "at least 10 prompts" in check.message
    )
    beyond = PairResult(
        CASE, CASE.id, covered("baseline", 1.0), covered("speculative", 0.4, verify=10, correct=20)
    )
    [check] = [c for c in pair_checks(beyond) if c.name == "coverage-differs"]
    assert check.severity == "fail" and "more than the 50%" in check.message


def test_coverage_is_stored_and_an_old_record_without_it_still_loads():
    from pytest_specenergy.document import Arm

    arm = covered("speculative", 0.875, verify=10, correct=20).record
    back = Arm.from_dict(arm.as_dict(), "speculative")
    assert back.coverage == 0.875 and back.samples[0].coverage == 0.875
    old = arm.as_dict()
    old.pop("coverage")
    for sample in old["samples"]:
        sample.pop("coverage")
    assert Arm.from_dict(old, "speculative").coverage is None


def twinned(arm, grouping="engine", twin_engine=None, idle=None, retracted=0):
    """An arm whose one repeat's twin ran grouped and where the arguments say, under a board
    meter: 9 J of decode (10 J full, 1 J twin over 0.1 s) for 10 tokens."""
    prefill = {"joules": 1.0, "seconds": 0.1, "loops": 1, "grouping": grouping}
    prefill.update({"twin_engine": twin_engine} if twin_engine else {})
    prefill.update({"idle_seconds": idle} if idle is not None else {})
    sample = RepeatSample.from_dict(
        {
            "decode_joules": 9.0 if arm == "baseline" else 6.0,
            "decode_seconds": 1.0,
            "decode_tokens": 10,
            "tbt_ms": 5.0,
            "verify_steps": 10 if arm == "speculative" else None,
            "correct_drafts": 20 if arm == "speculative" else None,
            "proposed_drafts": 40 if arm == "speculative" else None,
            "window": {"full": {"joules": 10.0, "seconds": 1.0, "loops": 1}, "prefill": prefill},
            "retractions": {"requests": 2, "retracted": retracted, "total": retracted},
        }
    )
    return RunResult.measured(
        arm=arm,
        engine={},
        source="measured (nvml)",
        samples=(sample,),
        outputs=(tuple(VARIED), tuple(LOOPING)),
        finish_reasons=("length", "length"),
        verified_per_step=5,
        concurrency={},
        retractions=sample.retractions,
    )


DRAFT_CASE = dataclasses.replace(
    CASE,
    spec=dataclasses.replace(
        CASE.spec, drafter=Drafter("draft_model", draft_model="tiny:dense-draft")
    ),
)


def test_a_twin_grouped_by_send_time_fails_the_case():
    """Issue 41 item 1: SGLang without its forward stamps leaves only send times, which put 5 twin
    forwards for the baseline's 8 at b16 (queued refills): up to 6 points of bias."""
    guessed = PairResult(CASE, "x", twinned("baseline", "send-time"), twinned("speculative"))
    assert "prefill-grouping-guessed" in {c.name for c in checked(guessed).failed_checks}
    stamped = PairResult(
        CASE,
        "x",
        twinned("baseline", "engine (forward_entry_time)"),
        twinned("speculative", "engine (forward_entry_time)"),
    )
    assert "prefill-grouping-guessed" not in names(stamped)


def test_a_draft_models_prefill_subtracted_by_a_twin_on_its_own_engine_fails_the_case():
    own = PairResult(
        DRAFT_CASE, "x", twinned("baseline"), twinned("speculative", twin_engine="own")
    )
    assert "draft-prefill-uncharged" in {c.name for c in checked(own).failed_checks}
    charged = PairResult(
        DRAFT_CASE, "x", twinned("baseline"), twinned("speculative", twin_engine="baseline")
    )
    assert "draft-prefill-uncharged" not in names(charged)
    # n-gram has no draft model: nothing of its own to prefill.
    ngram = PairResult(CASE, "x", twinned("baseline"), twinned("speculative", twin_engine="own"))
    assert "draft-prefill-uncharged" not in names(ngram)


def test_the_twins_idle_round_trips_are_bounded_and_fail_past_half_a_point():
    from pytest_specenergy.measure.checks import twin_idle_bound

    # 1 ms of the twin's 100 ms idle: at most 0.01 J of each arm's 9 or 6 J read as prefill; the
    # speculative arm's given back moves the saving most: 1 - 0.601 / 0.9 against 1 - 0.6 / 0.9.
    small = PairResult(
        CASE, "x", twinned("baseline", idle=0.001), twinned("speculative", idle=0.001)
    )
    assert twin_idle_bound(small) == pytest.approx(100 * 0.001 / 0.9, abs=1e-6)
    assert "twin-idle" not in names(small)
    large = PairResult(CASE, "x", twinned("baseline", idle=0.05), twinned("speculative", idle=0.05))
    assert twin_idle_bound(large) > 0.5 and "twin-idle" in names(large)
    unknown = PairResult(CASE, "x", twinned("baseline"), twinned("speculative"))
    assert twin_idle_bound(unknown) is None


def test_arms_that_retracted_differently_fail_and_alike_warn():
    differ = PairResult(CASE, "x", twinned("baseline"), twinned("speculative", retracted=1))
    assert "retractions-differ" in {c.name for c in checked(differ).failed_checks}
    alike = PairResult(
        CASE, "x", twinned("baseline", retracted=1), twinned("speculative", retracted=1)
    )
    assert {c.severity for c in checked(alike).checks if c.name == "retractions"} == {"warn"}
    assert not {"retractions", "retractions-differ"} & names(
        PairResult(CASE, "x", twinned("baseline"), twinned("speculative"))
    )
