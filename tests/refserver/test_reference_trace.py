"""The work trace: one record per forward pass, numbers from the actual step."""

from __future__ import annotations

from pytest_specenergy.refserver.records import GenerationRequest
from pytest_specenergy.refserver.records import SamplingParams


def _steps(engine, fn):
    start = len(engine.trace)
    fn()
    nxt, steps = engine.trace.read(start)
    assert nxt == start + len(steps)
    return steps


def test_step_cost_scales_with_rows_and_tokens(engine_for):
    shape = engine_for(model="tiny:dense").runner.shape
    one = shape.step_cost([1], [10], logit_rows=1, distinct_tokens=1)
    eight = shape.step_cost([1] * 8, [10] * 8, logit_rows=8, distinct_tokens=1)
    assert eight.weight_bytes == one.weight_bytes  # weights are read once per step, not per row
    assert eight.flops == 8 * one.flops
    assert eight.kv_bytes == 8 * one.kv_bytes
    longer = shape.step_cost([1], [100], logit_rows=1, distinct_tokens=1)
    assert longer.kv_bytes > one.kv_bytes and longer.flops > one.flops
    assert longer.weight_bytes == one.weight_bytes
    # no logits, no lm_head read
    nolog = shape.step_cost([1], [10], logit_rows=0, distinct_tokens=1)
    assert one.weight_bytes - nolog.weight_bytes == 2 * shape.lm_head_params


def test_plain_decode_trace(engine_for, make_requests):
    engine = engine_for(model="tiny:dense")
    shape = engine.runner.shape
    reqs = make_requests(engine, 4, 10)
    steps = _steps(engine, lambda: engine.generate(reqs))
    prefill, decode = steps[0], steps[1:]
    assert prefill.phase == "prefill"
    assert list(prefill.query_tokens) == [len(r.input_ids) for r in reqs]
    assert list(prefill.context_lens) == [0, 0, 0, 0]
    assert len(decode) == 9 and all(s.phase == "decode" and s.model == "target" for s in decode)
    dense = shape.num_params - shape.embed_params
    for s in decode:
        assert s.query_tokens == (1, 1, 1, 1)
        rows = (s.weight_bytes // 2 - dense) // shape.hidden_size
        assert 1 <= rows <= 4 and (s.weight_bytes // 2 - dense) % shape.hidden_size == 0
    for a, b in zip(decode, decode[1:]):
        assert [c + 1 for c in a.context_lens] == list(b.context_lens)
        pair_flops = sum(layer.attn_flops_per_pair for layer in shape.layers)
        assert b.flops - a.flops == pair_flops * 4  # one more context token per row
        assert b.kv_bytes > a.kv_bytes
        assert b.wall_s > 0


def test_rows_leave_the_batch_when_they_finish(engine_for, make_requests):
    engine = engine_for(model="tiny:dense", drafter="ngram", num_draft_tokens=3)
    engine.flush_cache()
    reqs = [
        GenerationRequest(r.input_ids, SamplingParams(max_new_tokens=2 + 6 * i, ignore_eos=True))
        for i, r in enumerate(make_requests(engine, 4, 1))
    ]
    steps = _steps(engine, lambda: engine.generate(reqs))
    verify = [s for s in steps if s.phase == "verify"]
    rows = [len(s.rids) for s in verify]
    assert rows[0] == 4 and rows[-1] == 1 and rows == sorted(rows, reverse=True)
    assert all(q == 4 for s in verify for q in s.query_tokens)  # K + 1 verified per row
    timing = engine.server_info()["internal_states"][0]["step_time_dict"]
    assert sorted(int(k) for k in timing) == sorted(set(rows))
    assert sum(len(v) for v in timing.values()) == len(verify)
    engine.flush_cache()
    assert engine.server_info()["internal_states"][0]["step_time_dict"] == {}
    assert len(engine.trace) >= len(steps)  # the trace survives a flush


def test_draft_model_trace(engine_for, make_requests):
    k = 4
    engine = engine_for(model="tiny:dense", drafter="draft_model", num_draft_tokens=k)
    steps = _steps(engine, lambda: engine.generate(make_requests(engine, 3, 12)))
    assert [s.phase for s in steps[:2]] == ["prefill", "prefill"]
    assert [s.model for s in steps[:2]] == ["target", "draft"]
    draft = [s for s in steps if s.phase == "draft"]
    assert draft and all(s.model == "draft" and set(s.query_tokens) == {1} for s in draft)
    dshape = engine.draft_runner.shape
    tshape = engine.runner.shape
    assert max(s.weight_bytes for s in draft) < min(
        s.weight_bytes for s in steps if s.phase == "verify"
    )
    assert dshape.num_layers < tshape.num_layers
    verify = [s for s in steps if s.phase == "verify"]
    # every verify is preceded by at least K draft forwards
    assert len(draft) >= k * len(verify)


def test_verify_flops_grow_with_k(engine_for, make_requests):
    reqs = None
    per_token = {}
    for k in (1, 8):
        engine = engine_for(model="tiny:dense", drafter="ngram", num_draft_tokens=k)
        reqs = reqs or make_requests(engine, 2, 10)
        steps = [
            s for s in _steps(engine, lambda e=engine, r=reqs: e.generate(r)) if s.phase == "verify"
        ]
        per_token[k] = max(s.flops for s in steps)
    assert per_token[8] > 4 * per_token[1]


def test_moe_charges_only_touched_experts(engine_for, make_requests):
    plain = engine_for(model="tiny:moe")
    spec = engine_for(model="tiny:moe", drafter="ngram", num_draft_tokens=8)
    shape = plain.runner.shape
    moe_layers = [layer for layer in shape.layers if layer.num_experts]
    assert moe_layers and shape.is_moe
    reqs = make_requests(plain, 2, 12)
    decode = [s for s in _steps(plain, lambda: plain.generate(reqs)) if s.phase == "decode"]
    verify = [s for s in _steps(spec, lambda: spec.generate(reqs)) if s.phase == "verify"]
    for s in decode + verify:
        tokens = sum(s.query_tokens)
        assert len(s.experts_touched) == shape.num_layers
        for layer, touched in zip(shape.layers, s.experts_touched):
            assert (
                layer.experts_per_token
                <= touched
                <= min(layer.num_experts, tokens * layer.experts_per_token)
            )
    mean = lambda steps: sum(sum(s.experts_touched) for s in steps) / len(steps)  # noqa: E731
    assert mean(verify) > mean(decode)  # more drafted tokens touch more experts
    assert max(s.weight_bytes for s in verify) > max(s.weight_bytes for s in decode)
    full = 2 * shape.num_params
    assert max(s.weight_bytes for s in decode) < full  # never all experts for 2 tokens


def test_hybrid_state_bytes(engine_for, make_requests):
    engine = engine_for(model="tiny:hybrid")
    shape = engine.runner.shape
    steps = [
        s
        for s in _steps(engine, lambda: engine.generate(make_requests(engine, 2, 4)))
        if s.phase == "decode"
    ]
    linear = [layer for layer in shape.layers if layer.kind == "linear_attention"]
    assert linear  # the hybrid keeps a recurrent (linear attention) state
    full = [layer for layer in shape.layers if layer.kind == "full_attention"]
    for s in steps:
        kv_tokens = sum(c + q for c, q in zip(s.context_lens, s.query_tokens))
        expect = sum(layer.kv_elems_per_token for layer in full) * kv_tokens
        # read + write
        expect += sum(layer.state_elems_per_row for layer in linear) * 2 * len(s.rids)
        assert s.kv_bytes == 2 * expect


def test_trace_json_shape(engine_for, make_requests):
    engine = engine_for(model="tiny:dense")
    start = len(engine.trace)
    engine.generate(make_requests(engine, 1, 2))
    nxt, steps = engine.trace.read(start)
    record = steps[0].to_json()
    assert set(record) == {
        "phase",
        "model",
        "rids",
        "query_tokens",
        "context_lens",
        "weight_bytes",
        "kv_bytes",
        "flops",
        "wall_s",
    }
    assert nxt == start + 2
    assert engine.trace.read(nxt) == (nxt, [])


def test_a_request_for_no_token_and_no_logprob_runs_no_forward(engine_for):
    """Coherence tokenises the diverged prompts with ``max_new_tokens=0`` and no logprobs: the
    answer is the prompt's ids, so no prefill runs for it. With logprobs asked, or one token, a
    prefill runs as before."""
    engine = engine_for(model="tiny:dense")
    prompt = tuple(engine.tokenizer.encode("def add(a, b):"))
    finished = engine.stats.lifetime.num_requests_finished

    def ask(max_new_tokens, return_logprob=False):
        request = GenerationRequest(
            prompt,
            SamplingParams(max_new_tokens=max_new_tokens),
            return_logprob=return_logprob,
            logprob_start_len=0,
        )
        return _steps(engine, lambda: answers.extend(engine.generate([request, request])))

    answers = []
    assert ask(0) == []
    assert [a.input_ids for a in answers] == [prompt] * 2 and all(
        a.output_ids == () for a in answers
    )
    assert all(a.finish_reason.type == "length" for a in answers)
    assert engine.stats.lifetime.num_requests_finished == finished + 2
    assert [s.phase for s in ask(0, return_logprob=True)] == ["prefill"]
    assert answers[-1].input_token_logprobs is not None and answers[-1].output_ids == ()
    assert [s.phase for s in ask(1)] == ["prefill"]
