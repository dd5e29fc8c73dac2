"""Fault ``dead-drafter``: every draft rejected, the output still the target's own; only accept length
shows it (the plugin's ``dead-drafter`` check: tests/integration/test_dead_drafter_e2e.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


@pytest.mark.parametrize("drafter", ("ngram", "draft_model"))
def test_a_dead_drafter_keeps_the_output_and_accepts_nothing(engine_for, make_requests, drafter):
    healthy = engine_for(model="tiny:dense", drafter=drafter, num_draft_tokens=4)
    dead = engine_for(
        model="tiny:dense", drafter=drafter, num_draft_tokens=4, faults=("dead-drafter",)
    )
    requests = make_requests(healthy, 2, 16)
    good, broken = healthy.generate(requests), dead.generate(requests)
    assert [r.output_ids for r in broken] == [r.output_ids for r in good]
    assert sum(r.spec.num_correct_drafts for r in good) > 0  # the healthy drafter accepts
    for r in broken:
        # one token per verify step after the prefill's; the counters agree with each other
        assert r.spec.num_correct_drafts == 0 and r.spec.verify_ct == len(r.output_ids) - 1
        assert r.spec.correct_drafts_histogram[0] == r.spec.verify_ct
        assert sum(r.spec.correct_drafts_histogram) == r.spec.verify_ct
