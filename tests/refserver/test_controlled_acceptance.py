"""Controlled acceptance (--draft-accept-p): the target's own continuation, corrupted with a seeded
P."""

from __future__ import annotations

import pytest

from pytest_specenergy.refserver.records import EngineConfig
from pytest_specenergy.refserver.records import GenerationRequest
from pytest_specenergy.refserver.records import SamplingParams

K = 4
SHAPES = {
    "chain": {"drafter": "draft_model", "num_draft_tokens": K},
    "block": {"drafter": "block", "block_size": K + 1},
}


def _reqs(engine, make_requests, n=6, max_new=33):
    return [
        GenerationRequest(r.input_ids, SamplingParams(max_new_tokens=max_new, ignore_eos=True))
        for r in make_requests(engine, n, 1)
    ]


def _accept(results):
    return sum(r.spec.num_correct_drafts for r in results) / sum(r.spec.verify_ct for r in results)


@pytest.mark.parametrize(
    ("model", "shape"), [("tiny:dense", "chain"), ("tiny:dense", "block"), ("tiny:hybrid", "chain")]
)
def test_controlled_acceptance_is_exact(engine_for, make_requests, model, shape):
    plain = engine_for(model=model)
    engine = engine_for(model=model, draft_accept_p=0.7, max_running_requests=3, **SHAPES[shape])
    reqs = _reqs(engine, make_requests, n=5, max_new=20)
    start = len(engine.trace)
    got = engine.generate(reqs)
    assert [r.output_ids for r in got] == [r.output_ids for r in plain.generate(reqs)]
    steps = engine.trace.read(start)[1]
    assert {s.model for s in steps} == {"target", "draft"}  # the oracle's forwards are not charged
    draft = [s for s in steps if s.phase == "draft"]
    verify = [s for s in steps if s.phase == "verify"]
    # the wrapped drafter's own passes: K per verify for the chain (at least), one for the block
    assert len(draft) >= K * len(verify) if shape == "chain" else len(draft) == len(verify)
    # the small draft model
    assert max(s.weight_bytes for s in draft) < min(s.weight_bytes for s in verify)


def test_accept_p_is_a_knob(engine_for, make_requests):
    """Mean accepted drafts per step follows sum(P^j); P=1 accepts all K, P=0 nothing; same for both
    shapes."""
    run = {
        (shape, p): engine_for(model="tiny:dense", draft_accept_p=p, **SHAPES[shape])
        for shape in SHAPES
        for p in (0.5, 1.0)
    }
    half = {
        shape: run[shape, 0.5].generate(_reqs(run[shape, 0.5], make_requests, n=4, max_new=29))
        for shape in SHAPES
    }
    # corruption is keyed by request and position, not by the drafter: the same acceptance in both
    # shapes
    assert [r.spec.correct_drafts_histogram for r in half["chain"]] == [
        r.spec.correct_drafts_histogram for r in half["block"]
    ]
    assert _accept(half["chain"]) == pytest.approx(sum(0.5**j for j in range(1, K + 1)), abs=0.4)
    for shape in SHAPES:
        engine = run[shape, 1.0]
        for r in engine.generate(_reqs(engine, make_requests, n=3, max_new=1 + 4 * (K + 1))):
            assert r.spec.correct_drafts_histogram == (0, 0, 0, 0, 4)  # every step all K, none cut
    never = engine_for(model="tiny:dense", draft_accept_p=0.0, **SHAPES["block"])
    assert _accept(never.generate(_reqs(never, make_requests, n=2, max_new=6))) == 0


def test_self_draft_chain_is_its_own_oracle(engine_for, make_requests):
    """With the target as chain draft model, nothing untraced runs: the drafter is the oracle."""
    engine = engine_for(
        model="tiny:dense", drafter="draft_model", draft_model="tiny:dense", draft_accept_p=0.5
    )
    assert engine.scheduler.drafter.oracle is None
    target_bytes = engine.runner.shape.num_params
    start = len(engine.trace)
    engine.generate(_reqs(engine, make_requests, n=2, max_new=10))
    draft = [s for s in engine.trace.read(start)[1] if s.phase == "draft"]
    # target-sized draft passes, charged
    assert draft and all(s.weight_bytes > target_bytes for s in draft)


def test_accept_p_validation():
    with pytest.raises(ValueError, match="needs a drafter with draft passes"):
        EngineConfig(drafter="ngram", draft_accept_p=0.5)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        EngineConfig(drafter="draft_model", draft_accept_p=1.5)
