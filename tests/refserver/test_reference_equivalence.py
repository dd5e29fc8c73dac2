"""The equivalence proof: greedy speculative output == plain output, token for token.

For every drafter, K and batch size, on varied prompts, through the engine API. Also: a self-draft
(draft model == target) accepts all K drafts on every step, and the per-request counters are
consistent with each other and with the output.
"""

from __future__ import annotations

import pytest

BATCHES = (1, 4, 8, 16)
# Fewer tokens for bigger batches keeps the folder fast on 2 cores; every row still runs many
# verify steps with ragged acceptance, which is what the proof needs.
MAX_NEW = {1: 40, 4: 28, 8: 20, 16: 14}


@pytest.fixture(scope="module")
def baseline(engine_for, make_requests):
    """Plain-engine outputs per batch size."""
    engine = engine_for(model="tiny:dense")
    return {b: engine.generate(make_requests(engine, b, MAX_NEW[b])) for b in BATCHES}


def _first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.parametrize("k", (1, 4, 8))
@pytest.mark.parametrize("drafter", ("ngram", "draft_model"))
def test_speculative_equals_baseline(engine_for, make_requests, baseline, drafter, k):
    engine = engine_for(model="tiny:dense", drafter=drafter, num_draft_tokens=k)
    for batch in BATCHES:
        results = engine.generate(make_requests(engine, batch, MAX_NEW[batch]))
        for i, (spec, base) in enumerate(zip(results, baseline[batch])):
            assert spec.output_ids == base.output_ids, (
                f"{drafter} K={k} batch={batch} row {i}: first divergence at token "
                f"{_first_divergence(spec.output_ids, base.output_ids)}"
            )
            assert spec.finish_reason == base.finish_reason


def test_equivalence_with_eos_and_stop_tokens(engine_for, make_requests):
    """Rows finishing at different steps (EOS honoured, stop ids, ragged max_new_tokens)."""
    from pytest_specenergy.refserver.records import GenerationRequest
    from pytest_specenergy.refserver.records import SamplingParams

    base = engine_for(model="tiny:dense")
    spec = engine_for(model="tiny:dense", drafter="draft_model", num_draft_tokens=4)
    plain = base.generate(make_requests(base, 8, 48, ignore_eos=True))
    # stop on a token that the plain run produced mid-way, so some rows stop early
    stop = plain[0].output_ids[6]
    reqs = [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=20 + 3 * i, stop_token_ids=(stop,))
        )
        for i, r in enumerate(make_requests(base, 8, 1))
    ]
    want = base.generate(reqs)
    got = spec.generate(reqs)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in want]
    assert any(r.finish_reason.type == "stop" for r in want)
    assert any(r.finish_reason.type == "length" for r in want)


@pytest.mark.parametrize("k", (1, 3, 6))
def test_self_draft_accepts_everything(engine_for, make_requests, k):
    engine = engine_for(
        model="tiny:dense", drafter="draft_model", draft_model="tiny:dense", num_draft_tokens=k
    )
    engine.flush_cache()
    results = engine.generate(make_requests(engine, 4, 30))
    for result in results:
        spec = result.spec
        assert spec is not None
        full = [c for c in spec.correct_drafts_histogram[:-1]]
        # every step accepted K drafts, except possibly the last one cut by max_new_tokens
        assert sum(full) <= 1, spec.correct_drafts_histogram
        assert spec.correct_drafts_histogram[k] >= spec.verify_ct - 1
        steps_full = spec.correct_drafts_histogram[k]
        assert spec.num_correct_drafts >= steps_full * k
    # the server-level average: committed tokens per row per verify step (prefill token excluded)
    committed = sum(r.completion_tokens - 1 for r in results)
    assert engine.avg_spec_accept_length() == pytest.approx(
        committed / sum(r.spec.verify_ct for r in results)
    )


def test_self_draft_exact_accept_length(engine_for, make_requests):
    """With max_new_tokens = 1 + n(K+1) no step is cut: accept length is exactly K+1."""
    k = 4
    engine = engine_for(
        model="tiny:dense", drafter="draft_model", draft_model="tiny:dense", num_draft_tokens=k
    )
    results = engine.generate(make_requests(engine, 3, 1 + 6 * (k + 1)))
    for r in results:
        assert r.spec.verify_ct == 6
        assert r.spec.num_correct_drafts == 6 * k
        assert r.spec.correct_drafts_histogram == (0, 0, 0, 0, 6)
        assert (r.completion_tokens - 1) / r.spec.verify_ct == k + 1


@pytest.mark.parametrize("drafter", ("ngram", "draft_model"))
def test_counters_are_consistent(engine_for, make_requests, drafter):
    k = 4
    engine = engine_for(model="tiny:dense", drafter=drafter, num_draft_tokens=k)
    for r in engine.generate(make_requests(engine, 8, 37, ignore_eos=False)):
        if r.completion_tokens <= 1:
            assert r.spec is None  # finished in prefill: no verify step, no spec keys (as SGLang)
            continue
        s = r.spec
        assert sum(s.correct_drafts_histogram) == s.verify_ct
        assert sum(i * n for i, n in enumerate(s.correct_drafts_histogram)) == s.num_correct_drafts
        assert s.num_proposed_drafts == s.verify_ct * k
        assert len(s.correct_drafts_histogram) == k + 1
        # the first token comes from prefill; every verify step commits accepted drafts + 1
        assert r.completion_tokens == 1 + s.verify_ct + s.num_correct_drafts


def test_plain_engine_reports_no_spec_fields(engine_for, make_requests):
    engine = engine_for(model="tiny:dense")
    assert all(r.spec is None for r in engine.generate(make_requests(engine, 2, 5)))


def test_max_running_requests_waves(engine_for, make_requests):
    """More requests than max_running_requests run in waves with the same outputs."""
    small = engine_for(model="tiny:dense", drafter="ngram", max_running_requests=3)
    big = engine_for(model="tiny:dense")
    reqs = make_requests(big, 7, 12)
    assert [r.output_ids for r in small.generate(reqs)] == [
        r.output_ids for r in big.generate(reqs)
    ]
    running = {int(k) for k in small.server_info()["internal_states"][0]["step_time_dict"]}
    assert max(running) <= 3


def test_compaction_every_step_changes_nothing(engine_for, make_requests, baseline, monkeypatch):
    """Squeezing the holes out of both caches after every step gives the same tokens."""
    import pytest_specenergy.refserver.draft_model as draft_model
    import pytest_specenergy.refserver.scheduler as scheduler

    monkeypatch.setattr(scheduler, "COMPACT_SLACK", 0)
    monkeypatch.setattr(draft_model, "COMPACT_SLACK", 0)
    engine = engine_for(model="tiny:dense", drafter="draft_model", num_draft_tokens=6)
    got = engine.generate(make_requests(engine, 8, MAX_NEW[8]))
    assert [r.output_ids for r in got] == [r.output_ids for r in baseline[8]]


def test_batch_invariance_of_prefill_padding(baseline):
    """A prompt gives the same tokens alone and left-padded inside a batch."""
    assert baseline[8][0].output_ids[: MAX_NEW[16]] == baseline[16][0].output_ids
    assert baseline[1][0].output_ids[: MAX_NEW[8]] == baseline[8][0].output_ids
