"""Draft removal: replaying recorded drafts repeats the verify steps with no draft passes at all."""

from __future__ import annotations

import pytest

from pytest_specenergy.refserver.protocol import parse_generate
from pytest_specenergy.refserver.records import GenerationRequest
from pytest_specenergy.refserver.records import SamplingParams


def _reqs(engine, make_requests, drafts=None, record=True):
    out = []
    for i, r in enumerate(make_requests(engine, 5, 1)):
        sp = SamplingParams(
            max_new_tokens=8 + 4 * i, ignore_eos=i != 2, replay_drafts=drafts[i] if drafts else None
        )
        out.append(GenerationRequest(r.input_ids, sp, rid=f"r{i}", return_spec_drafts=record))
    return out


def _verify_contexts(steps):
    """Per request: the (context length, query tokens) of each verify step it took part in."""
    out: dict[str, list[tuple[int, int]]] = {}
    for s in steps:
        if s.phase == "verify":
            for rid, c, q in zip(s.rids, s.context_lens, s.query_tokens):
                out.setdefault(rid, []).append((c, q))
    return out


@pytest.mark.parametrize(
    ("spec_kw", "replay_kw"),
    [
        ({"drafter": "ngram", "num_draft_tokens": 4}, {"num_draft_tokens": 4}),
        ({"drafter": "draft_model", "num_draft_tokens": 3}, {"num_draft_tokens": 3}),
        ({"drafter": "block", "block_size": 4}, {"block_size": 4}),
    ],
)
def test_replay_repeats_the_verify_steps_without_draft_passes(
    engine_for, make_requests, spec_kw, replay_kw
):
    spec = engine_for(model="tiny:dense", max_running_requests=3, **spec_kw)
    replay = engine_for(model="tiny:dense", drafter="replay", max_running_requests=2, **replay_kw)
    start = len(spec.trace)
    recorded = spec.generate(_reqs(spec, make_requests))
    spec_steps = spec.trace.read(start)[1]
    start = len(replay.trace)
    again = replay.generate(
        _reqs(replay, make_requests, drafts=[r.spec_drafts for r in recorded], record=False)
    )
    replay_steps = replay.trace.read(start)[1]
    for a, b in zip(recorded, again):
        assert a.output_ids == b.output_ids and a.spec == b.spec  # same steps, same acceptance
    assert {s.model for s in replay_steps} == {"target"}  # no draft forward, no draft prefill
    assert {s.phase for s in replay_steps} == {"prefill", "verify"}
    # the same verification work over the same contexts, request by request
    assert _verify_contexts(replay_steps) == _verify_contexts(spec_steps)
    state = replay.server_info()["internal_states"][0]
    assert (
        state["spec_replay_misses"] == 0
        and replay.server_info()["speculative_algorithm"] == "REPLAY"
    )


def test_replay_without_drafts_is_counted_and_stays_exact(engine_for, make_requests):
    plain = engine_for(model="tiny:dense")
    replay = engine_for(model="tiny:dense", drafter="replay", num_draft_tokens=4)
    before = replay.server_info()["internal_states"][0]["spec_replay_misses"]
    reqs = _reqs(replay, make_requests, record=False)[:2]
    got = replay.generate(reqs)
    assert [r.output_ids for r in got] == [r.output_ids for r in plain.generate(reqs)]
    misses = replay.server_info()["internal_states"][0]["spec_replay_misses"] - before
    assert misses == sum(r.spec.verify_ct for r in got) > 0


def test_spec_drafts_round_trip_through_the_protocol(engine_for):
    engine = engine_for(model="tiny:dense", drafter="ngram", num_draft_tokens=2)
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 5, "spec_replay_drafts": [[8, 9], [10]]},
    }
    (req,) = parse_generate(body, engine.tokenizer).requests
    assert req.sampling.replay_drafts == ((8, 9), (10,))
    (req,) = parse_generate(
        {"input_ids": [5, 6], "return_spec_drafts": True}, engine.tokenizer
    ).requests
    assert req.return_spec_drafts
