"""meta_info / server_info parsing across SGLang releases (fixtures in tests/data/sglang)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specenergy.engines.meta_info import MetaInfoError
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.engines.meta_info import concurrency_between
from pytest_specenergy.engines.meta_info import parse_concurrency
from pytest_specenergy.engines.meta_info import parse_meta_info

DATA = Path(__file__).resolve().parents[2] / "data" / "sglang"


def load(name: str):
    return json.loads((DATA / name).read_text())


# 0.5.9 and 0.5.13 are hand-made (no server environment of theirs here: README in tests/data/sglang);
# 0.5.23's is captured live (test_a_live_0_5_23_ngram_capture_parses_with_consistent_counters).
@pytest.mark.parametrize("version", ["0.5.9", "0.5.13"])
def test_every_release_parses_to_the_same_canonical_counters(version):
    responses = load(f"generate_spec_{version}.json")
    spec, prefill_only = [parse_meta_info(r["meta_info"]) for r in responses]
    assert spec == RequestCounters(
        rid="a1",
        prompt_tokens=37,
        completion_tokens=64,
        finish_type="length",
        finish_detail=64,
        e2e_latency=1.84,
        spec_verify_ct=20,
        spec_num_correct_drafts=43,
        spec_num_proposed_drafts=60,
        correct_drafts_histogram=(1, 3, 8, 8),
        cached_tokens=0,
        retractions=0,
    )
    assert spec.problems() == []
    # Finished in its prefill: SGLang sends no spec keys, and absent must stay None, not 0.
    assert prefill_only.completion_tokens == 1
    assert prefill_only.finish_type == "stop" and prefill_only.finish_detail == 151645
    assert (
        prefill_only.spec_verify_ct,
        prefill_only.spec_num_correct_drafts,
        prefill_only.spec_num_proposed_drafts,
        prefill_only.correct_drafts_histogram,
    ) == (None, None, None, None)


def test_a_live_0_5_23_ngram_capture_parses_with_consistent_counters():
    # Captured from a real SGLang 0.5.23 NGRAM engine (dev/sglang_capture_spec.py): four
    # requests of 48 tokens and one finished in its prefill, in one batch.
    answers = load("generate_spec_0.5.23.json")
    *spec, prefill_only = [parse_meta_info(a["meta_info"]) for a in answers]
    assert len(spec) == 4
    for counters, answer in zip(spec, answers):
        assert counters.problems() == []
        assert counters.completion_tokens == 48 == len(answer["output_ids"])
        assert counters.finish_type == "length" and counters.prompt_tokens > 0
        verify, correct = counters.spec_verify_ct, counters.spec_num_correct_drafts
        assert verify > 0 and 0 <= correct <= counters.spec_num_proposed_drafts
        # SGLang books 4 proposed drafts per verify step (the static config's width)
        assert counters.spec_num_proposed_drafts == 4 * verify
        assert len(counters.correct_drafts_histogram) == 5  # 0..4 drafts accepted
        # every step commits its accepted drafts and the bonus token; the last step may run
        # past max_new_tokens, which SGLang cuts
        assert 0 <= 1 + verify + correct - counters.completion_tokens <= 4
    # Finished in its prefill: no verify step ran, and SGLang sends no spec keys (None, never 0).
    assert prefill_only.completion_tokens == 1 and prefill_only.finish_type == "length"
    assert prefill_only.spec_verify_ct is None and prefill_only.correct_drafts_histogram is None


def test_the_twin_answers_the_captured_batch_identically():
    # The NGRAM engine's and its non-speculative twin's greedy outputs, captured on the same
    # batch: exact equivalence on live payloads; the twin sends no speculative key.
    spec = load("generate_spec_0.5.23.json")
    twin = load("live-0.5.23/spec/generate_twin_batch.json")
    assert [a["output_ids"] for a in spec] == [a["output_ids"] for a in twin]
    assert all(parse_meta_info(a["meta_info"]).spec_verify_ct is None for a in twin)


def test_a_live_retraction_parses_on_both_engines():
    # Six long requests at once on a 4096-token pool (dev/sglang_capture_spec.py): SGLang retracted
    # one, and the close aborted the rest, running and queued. Every answer parses; the twin's
    # retracted request, answered from the waiting queue, kept the output it had sent the
    # tokenizer (a 50-token mark), lacks prompt_tokens and counts one retraction.
    for engine in ("spec", "twin"):
        answers = load(f"live-0.5.23/spec/generate_retraction_{engine}.json")
        parsed = [parse_meta_info(a["meta_info"]) for a in answers]
        assert {c.finish_type for c in parsed} == {"length", "abort"}, parsed
        assert any(c.queued_abort for c in parsed)
    twin = [
        parse_meta_info(a["meta_info"])
        for a in load("live-0.5.23/spec/generate_retraction_twin.json")
    ]
    [retracted] = [c for c in twin if c.queued_abort and c.completion_tokens > 0]
    assert retracted.prompt_tokens is None and retracted.retractions == 1
    assert retracted.completion_tokens % 50 == 0


def test_baseline_engine_has_no_spec_counters_never_zero():
    (counters,) = [parse_meta_info(r["meta_info"]) for r in load("generate_baseline_0.5.23.json")]
    assert counters.completion_tokens == 64
    assert counters.spec_verify_ct is None and counters.spec_num_correct_drafts is None


def test_zero_is_kept_as_zero():
    meta = {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "spec_verify_ct": 4,
        "spec_num_correct_drafts": 0,
        "spec_num_proposed_drafts": 12,
    }
    counters = parse_meta_info(meta)
    assert counters.spec_num_correct_drafts == 0 and counters.spec_verify_ct == 4


def test_alias_disagreeing_with_canonical_name_is_an_error():
    meta = {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "spec_num_correct_drafts": 4,
        "spec_accepted_drafts": 5,
    }
    with pytest.raises(MetaInfoError, match="spec_accepted_drafts=5.*must be equal"):
        parse_meta_info(meta)


def test_missing_token_counts_is_an_error_naming_the_key():
    with pytest.raises(MetaInfoError, match="lacks completion_tokens"):
        parse_meta_info({"prompt_tokens": 3, "id": "x"})
    with pytest.raises(MetaInfoError, match="JSON object"):
        parse_meta_info(["not", "a", "dict"])  # type: ignore[arg-type]


def test_finish_reason_shapes():
    abort = parse_meta_info(
        {
            "prompt_tokens": 1,
            "completion_tokens": 0,
            "finish_reason": {"type": "abort", "message": "client gone"},
        }
    )
    assert (abort.finish_type, abort.finish_detail) == ("abort", "client gone")
    streaming = parse_meta_info({"prompt_tokens": 1, "completion_tokens": 0, "finish_reason": None})
    assert streaming.finish_type is None and streaming.finish_detail is None


def test_inconsistent_histogram_is_reported():
    meta = {
        "prompt_tokens": 3,
        "completion_tokens": 40,
        "id": "r",
        "spec_verify_ct": 20,
        "spec_num_correct_drafts": 43,
        "spec_num_proposed_drafts": 60,
        "spec_correct_drafts_histogram": [1, 3, 8, 9],
    }
    problems = parse_meta_info(meta).problems()
    assert any("21 verify steps" in p for p in problems)
    assert any("46 accepted drafts" in p for p in problems)
    too_many = parse_meta_info(
        {
            "prompt_tokens": 1,
            "completion_tokens": 9,
            "spec_verify_ct": 2,
            "spec_num_correct_drafts": 7,
            "spec_num_proposed_drafts": 6,
        }
    )
    assert any("exceed 6 proposed" in p for p in too_many.problems())


def test_concurrency_from_step_time_dict():
    summary = parse_concurrency(load("server_info_0.5.23.json"))
    assert summary["steps_by_running"] == {3: 2, 12: 8, 16: 40}
    assert summary["steps"] == 50
    assert summary["max_running"] == 16
    assert summary["mean_running"] == pytest.approx((16 * 40 + 12 * 8 + 3 * 2) / 50)
    assert summary["max_running_requests"] == 16
    old = parse_concurrency(load("server_info_0.5.9.json"))
    assert old["steps"] == 10 and old["mean_running"] == 16 and old["max_running_requests"] is None


def test_concurrency_absent_is_none():
    summary = parse_concurrency(load("server_info_no_step_time.json"))
    assert summary["steps"] is None and summary["max_running"] is None
    assert summary["mean_running"] is None and summary["steps_by_running"] is None
    assert parse_concurrency({})["steps"] is None


def test_concurrency_merges_dp_ranks_and_differences_reads():
    before = {
        "internal_states": [
            {"step_time_dict": {"4": [0.1] * 3}},
            {"step_time_dict": {"4": [0.1] * 2, "2": [0.1]}},
        ]
    }
    after = {
        "internal_states": [
            {"step_time_dict": {"4": [0.1] * 7, "8": [0.1] * 2}},
            {"step_time_dict": {"4": [0.1] * 2, "2": [0.1]}},
        ]
    }
    assert parse_concurrency(before)["steps_by_running"] == {2: 1, 4: 5}
    delta = concurrency_between(before, after)
    assert delta["steps_by_running"] == {4: 4, 8: 2}
    assert delta["mean_running"] == pytest.approx((4 * 4 + 8 * 2) / 6)
    with pytest.raises(MetaInfoError, match="shrank"):
        concurrency_between(after, before)


def test_concurrency_min_and_merge_over_windows():
    from pytest_specenergy.engines.meta_info import merge_concurrency

    one = concurrency_between(
        {}, {"internal_states": [{"step_time_dict": {"4": [0.1] * 6, "1": [0.1] * 2}}]}
    )
    assert one["min_running"] == 1 and one["max_running"] == 4 and one["mean_running"] == 26 / 8
    two = concurrency_between({}, {"internal_states": [{"step_time_dict": {"4": [0.1] * 8}}]})
    merged = merge_concurrency([one, two])
    assert merged["steps_by_running"] == {1: 2, 4: 14} and merged["min_running"] == 1
    assert merged["mean_running"] == (2 + 56) / 16
    # A window without a step record makes the whole unknown, not a mean over the rest.
    assert merge_concurrency([one, concurrency_between({}, {})])["mean_running"] is None
