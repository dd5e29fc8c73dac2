"""The block drafter: one draft forward proposes B - 1 drafts; the target verifies B positions."""

from __future__ import annotations

import pytest

from pytest_specenergy.refserver.records import EngineConfig
from pytest_specenergy.refserver.records import GenerationRequest
from pytest_specenergy.refserver.records import SamplingParams


def _reqs(engine, make_requests, n=6):
    return [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=6 + (5 * i) % 15, ignore_eos=i % 2 == 0)
        )
        for i, r in enumerate(make_requests(engine, n, 1))
    ]


@pytest.mark.parametrize(
    ("model", "block"), [("tiny:dense", 4), ("tiny:dense", 8), ("tiny:hybrid", 4)]
)
def test_block_drafter_is_exact_with_joins(engine_for, make_requests, model, block):
    plain = engine_for(model=model)
    engine = engine_for(model=model, drafter="block", block_size=block, max_running_requests=3)
    reqs = _reqs(engine, make_requests)
    want = plain.generate(reqs)
    start = len(engine.trace)
    got = engine.generate(reqs)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in want]
    steps = engine.trace.read(start)[1]
    verify = [s for s in steps if s.phase == "verify"]
    draft = [s for s in steps if s.phase == "draft"]
    assert len(draft) == len(verify), "exactly one draft forward per verify step"
    assert all(set(s.query_tokens) == {block} for s in verify)  # B verified positions per row
    # per row: the block (last committed + B-1 placeholders) plus drafts accepted last step
    assert all(q >= block for s in draft for q in s.query_tokens)
    assert any(set(s.query_tokens) == {block} for s in draft)
    for r in got:
        if r.spec is None:
            continue
        assert r.spec.num_proposed_drafts == r.spec.verify_ct * (block - 1)
        assert len(r.spec.correct_drafts_histogram) == block
        assert r.completion_tokens == 1 + r.spec.verify_ct + r.spec.num_correct_drafts
    info = engine.server_info()
    assert info["verified_per_step"] == block and info["speculative_block_size"] == block
    assert (
        info["speculative_num_draft_tokens"] == block - 1
        and info["speculative_algorithm"] == "BLOCK"
    )


@pytest.mark.parametrize("model", ("tiny:dense", "tiny:hybrid"))
def test_self_block_draft_always_gets_the_first_draft_right(engine_for, make_requests, model):
    """With the target as block draft model, d1 is the target's own next token - if and only if the
    draft cache holds exactly the committed context (placeholders, padding and, for the hybrid, the
    recurrent state all rolled back) after every step, whatever was accepted."""
    engine = engine_for(
        model=model, drafter="block", block_size=4, draft_model=model, max_running_requests=3
    )
    reqs = [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=20, ignore_eos=True), return_spec_drafts=True
        )
        for r in make_requests(engine, 5, 1)
    ]
    for r in engine.generate(reqs):
        out, pos = r.output_ids, 1  # output 0 comes from prefill
        assert len(r.spec_drafts) == r.spec.verify_ct
        for drafts in r.spec_drafts:
            assert drafts[0] == out[pos], (
                f"step at output {pos}: d1 {drafts[0]} != target's {out[pos]}"
            )
            accepted = next(
                (j for j, (d, t) in enumerate(zip(drafts, out[pos:])) if d != t), len(drafts)
            )
            pos += accepted + 1
        assert pos >= len(out)


def test_block_config_validation():
    assert EngineConfig(drafter="block", block_size=16).num_draft_tokens == 15
    assert EngineConfig(drafter="block", num_draft_tokens=6).block_size == 7
    assert EngineConfig(drafter="block", block_size=8).verified_per_step == 8
    assert EngineConfig(drafter="ngram", num_draft_tokens=8).verified_per_step == 9
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        EngineConfig(drafter="block", block_size=1)
    with pytest.raises(ValueError, match="block_size is for the block"):
        EngineConfig(drafter="ngram", block_size=4)
