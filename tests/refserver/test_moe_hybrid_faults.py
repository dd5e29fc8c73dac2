"""MoE and hybrid (linear attention) models, and the fault switches."""

from __future__ import annotations

import pytest

from pytest_specenergy.refserver.faults import FAULTS
from pytest_specenergy.refserver.faults import validate_faults
from pytest_specenergy.refserver.records import EngineConfig

MAX_NEW = 24


@pytest.fixture(scope="module")
def baselines(engine_for, make_requests):
    out = {}
    for model in ("tiny:moe", "tiny:hybrid"):
        engine = engine_for(model=model)
        out[model] = {b: engine.generate(make_requests(engine, b, MAX_NEW)) for b in (1, 8)}
    return out


@pytest.mark.parametrize("drafter", ("ngram", "draft_model"))
@pytest.mark.parametrize("model", ("tiny:moe", "tiny:hybrid"))
@pytest.mark.parametrize("batch", (1, 8))
def test_speculative_equals_baseline(engine_for, make_requests, baselines, model, drafter, batch):
    engine = engine_for(model=model, drafter=drafter, num_draft_tokens=4)
    got = engine.generate(make_requests(engine, batch, MAX_NEW))
    want = baselines[model][batch]
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    rejected = sum(r.spec.verify_ct * 4 - r.spec.num_correct_drafts for r in got)
    assert rejected > 0  # the rollback path really ran


def test_hybrid_self_draft_accepts_everything(engine_for, make_requests):
    k = 3
    engine = engine_for(model="tiny:hybrid", drafter="draft_model", draft_model="tiny:hybrid", num_draft_tokens=k)
    for r in engine.generate(make_requests(engine, 4, 1 + 5 * (k + 1))):
        assert r.spec.correct_drafts_histogram == (0, 0, 0, 5)


def test_fault_names_are_validated():
    assert validate_faults(["wrong-accept-count", "wrong-accept-count"]) == ("wrong-accept-count",)
    with pytest.raises(ValueError) as err:
        EngineConfig(faults=("bogus",))
    for name in FAULTS:
        assert name in str(err.value)


@pytest.mark.parametrize("drafter", ("ngram", "draft_model"))
def test_skip_state_rollback_corrupts_hybrid_output(engine_for, make_requests, baselines, drafter):
    good = engine_for(model="tiny:hybrid", drafter=drafter, num_draft_tokens=4)
    bad = engine_for(model="tiny:hybrid", drafter=drafter, num_draft_tokens=4, faults=("skip-state-rollback",))
    reqs = make_requests(good, 8, MAX_NEW)
    ok, broken = good.generate(reqs), bad.generate(reqs)
    base = baselines["tiny:hybrid"][8]
    assert [r.output_ids for r in ok] == [r.output_ids for r in base]
    diverged = sum(r.output_ids != b.output_ids for r, b in zip(broken, base))
    assert diverged >= 6  # incoherent output ...
    for r in broken:  # ... while every counter stays self-consistent
        s = r.spec
        assert sum(s.correct_drafts_histogram) == s.verify_ct
        assert r.completion_tokens == 1 + s.verify_ct + s.num_correct_drafts


def test_skip_state_rollback_is_harmless_without_recurrent_state(engine_for, make_requests):
    engine = engine_for(model="tiny:dense", drafter="ngram", num_draft_tokens=4, faults=("skip-state-rollback",))
    plain = engine_for(model="tiny:dense")
    reqs = make_requests(plain, 4, 20)
    assert [r.output_ids for r in engine.generate(reqs)] == [r.output_ids for r in plain.generate(reqs)]


def test_wrong_accept_count_inflates_counters_only(engine_for, make_requests):
    good = engine_for(model="tiny:dense", drafter="ngram", num_draft_tokens=4)
    bad = engine_for(model="tiny:dense", drafter="ngram", num_draft_tokens=4, faults=("wrong-accept-count",))
    reqs = make_requests(good, 4, 24)
    ok, wrong = good.generate(reqs), bad.generate(reqs)
    for a, b in zip(ok, wrong):
        assert a.output_ids == b.output_ids
        assert b.spec.num_correct_drafts == a.spec.num_correct_drafts + a.spec.verify_ct
        assert sum(b.spec.correct_drafts_histogram) == b.spec.verify_ct  # looks consistent ...
        assert b.completion_tokens != 1 + b.spec.verify_ct + b.spec.num_correct_drafts  # ... but is not


@pytest.mark.parametrize("model", ("tiny:dense", "tiny:hybrid"))
def test_stale_draft_cache_lowers_acceptance_not_output(engine_for, make_requests, model):
    good = engine_for(model=model, drafter="draft_model", num_draft_tokens=4)
    bad = engine_for(model=model, drafter="draft_model", num_draft_tokens=4, faults=("stale-draft-cache",))
    reqs = make_requests(good, 8, 40)
    ok, stale = good.generate(reqs), bad.generate(reqs)
    assert [r.output_ids for r in ok] == [r.output_ids for r in stale]
    accept = lambda rs: sum(r.spec.num_correct_drafts for r in rs) / sum(r.spec.verify_ct for r in rs)  # noqa: E731
    assert accept(stale) < 0.9 * accept(ok)


@pytest.mark.parametrize("model", ("tiny:moe", "tiny:hybrid"))
def test_batch_invariance_of_prefill_padding(baselines, model):
    """Left padding leaves a fresh recurrent state exactly zero: same tokens alone or in a batch."""
    assert baselines[model][8][0].output_ids == baselines[model][1][0].output_ids
