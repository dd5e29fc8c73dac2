"""The cycle plan: which arms a measurement runs, in what order, interleaved or blocked."""

from __future__ import annotations

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure.cycles import ArmSpec
from pytest_specenergy.measure.cycles import CyclePlan

CASE = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram"),
    reference=Drafter("draft_model", draft_model="tiny:dense-draft"),
    batch=2,
    corpus=load_corpus("code"),
)
BASE = (ArmSpec("baseline", CASE, CASE.baseline_config()),)
DRAFTING = (
    ArmSpec("speculative", CASE, CASE.spec_config()),
    ArmSpec("reference", CASE, CASE.reference_config()),
)
REMOVAL = (ArmSpec("removal", CASE, CASE.spec_config().replaying("verify"), replays=CASE),)


def names(arms):
    return [arm.name for arm in arms]


def test_the_drafting_arms_alternate_between_cycles_after_the_baseline():
    plan = CyclePlan.decide(CASE, BASE, DRAFTING, REMOVAL, max_live=0)
    assert plan.interleaved
    assert names(plan.cycle(0)) == ["baseline", "speculative", "reference", "removal"]
    assert names(plan.cycle(1)) == ["baseline", "reference", "speculative", "removal"]
    assert names(plan.cycle(2)) == names(plan.cycle(0))
    assert names(plan.arms) == names(plan.cycle(0))


def test_arms_run_blocked_only_when_the_pool_cannot_hold_them_all():
    assert CyclePlan.decide(CASE, BASE, DRAFTING, (), max_live=3).interleaved  # all resident
    assert not CyclePlan.decide(CASE, BASE, DRAFTING, (), max_live=2).interleaved
    assert not CyclePlan.decide(CASE, BASE, DRAFTING[:1], (), max_live=1).interleaved
    # A lone drafting arm (its baseline shared from a sibling) has nothing to alternate with.
    assert CyclePlan.decide(CASE, (), DRAFTING[:1], (), max_live=1).interleaved
