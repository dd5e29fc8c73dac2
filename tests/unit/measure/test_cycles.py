"""The cycle plan: which arms a measurement runs, in what order, interleaved or blocked."""

from __future__ import annotations

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure.cycles import ArmSpec
from pytest_specenergy.measure.cycles import CyclePlan
from pytest_specenergy.measure.cycles import group_engines

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


SIBLING = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram", num_draft_tokens=4),
    batch=2,
    corpus=load_corpus("code"),
)


def test_a_groups_engines_count_each_config_once():
    # The baseline, two drafters and the A/B reference: four engines held together.
    assert group_engines((CASE, SIBLING)) == 4 and group_engines((SIBLING,)) == 2


def test_every_member_runs_in_each_cycle_and_its_pair_holds_its_own_arms_only():
    mine = ArmSpec("speculative", CASE, CASE.spec_config(), owner=CASE)
    theirs = ArmSpec("speculative", SIBLING, SIBLING.spec_config(), owner=SIBLING, slot=1)
    plan = CyclePlan.decide(CASE, BASE, (mine, theirs), (), max_live=0, members=(CASE, SIBLING))
    assert [arm.key for arm in plan.cycle(0)] == [
        "baseline",
        "0|speculative",
        "1|speculative",
    ]
    assert plan.cycle(1)[1:] == (theirs, mine)  # the drafters' order alternates
    assert plan.arms_of(SIBLING) == (BASE[0], theirs) and plan.members == (CASE, SIBLING)
    # Three engines on a pool that holds two: blocked.
    assert not CyclePlan.decide(CASE, BASE, (mine, theirs), (), 2, (CASE, SIBLING)).interleaved
