"""Issue 38 item 5: a dead drafter (accept length within a hair of 1.0) fails its own named check, on
every engine and every drafting arm; and an adaptive engine's nominal proposed count reports no
acceptance rate, saying why."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.meta_info import adaptive_speculation
from pytest_specenergy.measure.checks import DEAD_DRAFTER_ACCEPT_LENGTH
from pytest_specenergy.measure.checks import pair_checks
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult

OUT = ((5, 17, 3, 99, 42, 8, 61, 23), (7, 70, 11, 36, 90, 2, 54, 28))


def case(engine: str, drafter: Drafter, reference: Drafter | None = None) -> Case:
    return Case.of(
        engine=engine,
        model="tiny:dense" if engine == "reference" else "Qwen/Qwen3-8B",
        drafter=drafter,
        reference=reference,
        batch=2,
        corpus=load_corpus("code"),
    )


def arm(name: str, verify=None, correct=None, server_info=None) -> RunResult:
    proposed = None if verify is None else verify * 4
    sample = RepeatSample(1.0, 1.0, 10, 5.0, verify, correct, proposed)
    return RunResult.measured(
        arm=name,
        engine={"server_info": server_info or {}},
        source="modeled (h200)",
        samples=(sample,),
        outputs=OUT,
        finish_reasons=("length", "length"),
        verified_per_step=5 if verify is not None else 1,
        # as the arm measurer records it from the engine's /server_info
        nominal_proposals=adaptive_speculation(server_info or {}),
    )


def checks(pair: PairResult) -> dict[str, str]:
    return {c.name: c.message for c in pair_checks(pair) if c.severity == "fail"}


@pytest.mark.parametrize("engine", ["reference", "sglang"])
def test_every_draft_rejected_fails_dead_drafter_on_every_engine(engine):
    ngram = case(engine, Drafter("ngram", num_draft_tokens=4))
    dead = PairResult(ngram, ngram.id, arm("baseline"), arm("speculative", 40, 0))
    assert checks(dead)["dead-drafter"] == (
        "the speculative arm's drafter 'ngram-k4' is dead: accept length 1.000 (0 drafts accepted "
        "over 40 verify steps), at or below 1.02; nearly every draft was rejected (a draft model "
        "or head that did not load, a wrong token map, a drafter the engine version broke), so "
        "speculation only adds work"
    )
    # One accepted draft in 50 steps is the threshold itself: it fails (closed at a tie) ...
    assert "dead-drafter" in checks(
        PairResult(ngram, ngram.id, arm("baseline"), arm("speculative", 50, 1))
    )
    # ... one in 49 is above it, and a healthy drafter is far from it.
    for verify, correct in ((49, 1), (40, 20)):
        alive = PairResult(ngram, ngram.id, arm("baseline"), arm("speculative", verify, correct))
        assert "dead-drafter" not in checks(alive)
    assert DEAD_DRAFTER_ACCEPT_LENGTH == 1.02


def test_sglangs_own_accept_length_would_hide_a_dead_drafter():
    """SGLang's spec_accept_length for a request of 40 tokens whose every draft was rejected is
    completion / verify = 40 / 39 = 1.026, over the threshold; the check reads the counts (1 +
    accepted / verify = 1.000), which are exact at any length."""
    assert 40 / 39 > DEAD_DRAFTER_ACCEPT_LENGTH
    ngram = case("sglang", Drafter("ngram", num_draft_tokens=4))
    dead = PairResult(ngram, ngram.id, arm("baseline"), arm("speculative", 39, 0))
    assert dead.accept_length == 1.0 and "dead-drafter" in checks(dead)


def test_an_in_job_reference_drafter_that_died_fails_and_the_aa_control_is_exempt():
    draft = Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft")
    ab = case("reference", Drafter("ngram", num_draft_tokens=4), reference=draft)
    dead_reference = arm("speculative", 40, 0)
    dead_reference = RunResult(
        dataclasses.replace(dead_reference.record, arm="reference"), dead_reference.outputs
    )
    pair = PairResult(
        ab, ab.id, arm("baseline"), arm("speculative", 40, 30), reference=dead_reference
    )
    assert "the reference arm's drafter 'draft' is dead" in checks(pair)["dead-drafter"]
    aa = case("sglang", Drafter("none"))
    control = PairResult(aa, aa.id, arm("baseline"), arm("speculative"))
    assert "dead-drafter" not in checks(control)


def test_an_adaptive_engine_reports_no_acceptance_rate_and_says_why():
    ngram = case("sglang", Drafter("ngram", num_draft_tokens=4))
    steady = PairResult(ngram, ngram.id, arm("baseline"), arm("speculative", 40, 20))
    assert steady.acceptance_rate == 0.125
    assert not [c for c in pair_checks(steady) if c.name == "acceptance-rate-nominal"]
    info = {"speculative_adaptive": True}
    adaptive = PairResult(ngram, ngram.id, arm("baseline"), arm("speculative", 40, 20, info))
    assert adaptive.acceptance_rate is None and adaptive.accept_length == 1.5
    (note,) = [c for c in pair_checks(adaptive) if c.name == "acceptance-rate-nominal"]
    assert note.severity == "warn" and note.message.startswith(
        "acceptance rate not reported: adaptive speculation (/server_info speculative_adaptive is "
        "on), while SGLang books spec_num_proposed_drafts as verify steps x (num_draft_tokens - 1)"
    )
    assert adaptive.record().acceptance_rate is None
