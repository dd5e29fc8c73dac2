"""One metered window's figures from what the engine answered: a retracted request answered from
SGLang's queue, SGLang's time stats for the time between tokens, fillers weighed out."""

from __future__ import annotations

import pytest

from pytest_specenergy.document import StepRecord
from pytest_specenergy.engines.meta_info import parse_meta_info
from pytest_specenergy.measure.window import Window
from pytest_specenergy.measure.window import counters_of
from pytest_specenergy.measure.window import decode_sample
from pytest_specenergy.meters.base import EnergyWindow


def meta(rid, tokens, verify=None, **more):
    info = {
        "id": rid,
        "prompt_tokens": 10,
        "completion_tokens": tokens,
        "finish_reason": {"type": "length", "length": tokens},
        "num_retractions": 0,
    }
    if verify is not None:
        info.update(
            spec_verify_ct=verify,
            spec_num_correct_drafts=tokens - 1 - verify,
            spec_num_proposed_drafts=verify * 4,
        )
    return {**info, **more}


#: SGLang 0.5.23's answer to a request it retracted (KV pool full) and the close then aborted in
#: its waiting queue: the output it made before, no prompt_tokens, no speculative counters
#: (tests/data/sglang/live-0.5.23/spec/generate_retraction_spec.json).
RETRACTED = {
    "id": "r2",
    "completion_tokens": 50,
    "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
}


def window(metas, joules=10.0, prompts=None, energy=None):
    counters = tuple(parse_meta_info(m) for m in metas)
    outputs = tuple((1,) * c.completion_tokens for c in counters)
    energy = energy or EnergyWindow(joules, 1.0, "measured (nvml)")
    return Window(
        energy, 1, (counters,), (outputs,), StepRecord(), tuple(range(len(metas))), prompts=prompts
    )


def test_a_retracted_request_answered_from_the_queue_voids_nothing_and_commits_nothing():
    """Live SGLang (tests/sglang spec_suite's retraction case): one such answer made the window's
    counters None, so the pair failed missing-counters; and its 50 discarded tokens counted as
    committed decode tokens."""
    full = window([meta("r0", 33, verify=8), meta("r1", 33, verify=8), RETRACTED])
    twin = window([meta("t0", 1), meta("t1", 1)], joules=2.0)
    sample = decode_sample(twin, full)
    assert sample.verify_steps == 16 and sample.correct_drafts == 2 * 24
    assert sample.decode_tokens == 2 * 32  # not 2 * 32 + 49
    assert sample.retractions.retracted == 1 and sample.retractions.total == 1
    assert sample.accept_length == pytest.approx(1 + 48 / 16)


def test_a_queued_abort_counts_its_prompt_from_the_ids_the_engine_echoed():
    answer = {"meta_info": RETRACTED, "output_ids": [1] * 50, "prompt_token_ids": [5] * 12}
    assert counters_of(answer).prompt_tokens == 12
    assert counters_of({"meta_info": RETRACTED, "output_ids": []}).prompt_tokens is None
    # A chat-templated prompt is sent as token ids: counted from them.
    assert counters_of({"meta_info": RETRACTED, "output_ids": []}, (1, 2, 3)).prompt_tokens == 3
    assert counters_of({"meta_info": RETRACTED, "output_ids": []}, "text").prompt_tokens is None


def test_sglang_time_stats_give_the_visible_and_the_own_time_between_tokens():
    """SGLang (with --enable-metrics) stamps each request's prefill forward: r0's first token at
    t=1.0, its last at 2.0; r1's refill forward ran 1.3-1.5 inside it. A user of r0 waited 1.0 s
    for 10 gaps; its own decode steps took 0.8 s. Its latency (4.0 s, with its queue time) says
    neither."""
    r0 = meta(
        "r0",
        11,
        forward_entry_time=0.9,
        prefill_finished_time=1.0,
        request_finished_ts=2.0,
        e2e_latency=4.0,
    )
    r1 = meta("r1", 3, forward_entry_time=1.3, prefill_finished_time=1.5, request_finished_ts=1.9)
    full = window([r0, r1], prompts=1)
    assert full.visible_seconds(0) == pytest.approx(1.0)
    assert full.own_decode_seconds(0) == pytest.approx(0.8)
    assert full.forwards() == ((0.9, 1.0), (1.3, 1.5))
    sample = decode_sample(window([meta("t0", 1), meta("t1", 1)], joules=2.0), full)
    assert sample.visible_tbt_ms == pytest.approx(100.0) and sample.tbt_ms == pytest.approx(80.0)
    # Without the stamps (SGLang without metrics) neither is known: never the latency.
    bare = window([meta("r0", 11, e2e_latency=4.0)])
    assert decode_sample(window([meta("t0", 1)], joules=2.0), bare).tbt_ms is None


def test_fillers_weigh_the_window_by_its_prompts_share_of_the_decode_rows():
    full = window(
        [meta("r0", 9, verify=4), meta("r1", 9, verify=4), meta("f0", 5, verify=2)], prompts=2
    )
    sample = decode_sample(window([meta("t0", 1)] * 3, joules=1.0), full)
    assert sample.work_share == pytest.approx(8 / 10)
    assert sample.decode_joules == pytest.approx((10.0 - 1.0) * 0.8)
    assert sample.decode_tokens == 16  # the prompts' tokens; the filler's 4 are not the window's
