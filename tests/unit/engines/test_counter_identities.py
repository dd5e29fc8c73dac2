"""Issue 38 item 4: SGLang's per-request counters checked against each other on every request (the
histogram identities on the live 0.5.23 captures), per-step statistics read where a release sends
them, and adaptive or ragged speculation flagged where ``spec_num_proposed_drafts`` is nominal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specenergy.engines.meta_info import MetaInfoError
from pytest_specenergy.engines.meta_info import adaptive_speculation
from pytest_specenergy.engines.meta_info import parse_meta_info
from pytest_specenergy.measure.checks import counter_problems

DATA = Path(__file__).resolve().parents[2] / "data" / "sglang"
#: Every live capture of a speculative engine (dev/sglang_capture_spec.py, SGLang 0.5.23 NGRAM).
LIVE_SPEC = ("generate_spec_0.5.23.json", "live-0.5.23/spec/generate_retraction_spec.json")


def live_requests() -> list[dict]:
    """meta_info of every live speculative answer that ran a verify step."""
    metas = [a["meta_info"] for name in LIVE_SPEC for a in json.loads((DATA / name).read_text())]
    return [m for m in metas if m.get("spec_verify_ct")]


def test_the_histogram_identities_hold_on_every_live_request():
    requests = live_requests()
    assert len(requests) == 7  # 4 of the batch capture, 3 of the retraction capture
    for meta in requests:
        c = parse_meta_info(meta)
        hist = c.correct_drafts_histogram
        assert sum(hist) == c.spec_verify_ct, meta["id"]
        assert sum(i * n for i, n in enumerate(hist)) == c.spec_num_correct_drafts, meta["id"]
        assert c.problems() == [] and counter_problems([c], drafted_per_step=4) == [], meta["id"]
        # SGLang's own accept length counts the prefill's token: completion / verify steps, not
        # the plugin's 1 + accepted / verify steps (one token per request apart)
        assert meta["spec_accept_length"] == pytest.approx(c.completion_tokens / c.spec_verify_ct)
        # and its proposed count is nominal: verify steps x (num_draft_tokens - 1), 4 here
        assert c.spec_num_proposed_drafts == 4 * c.spec_verify_ct and c.ragged is None


def test_a_broken_identity_is_a_problem_naming_the_request():
    meta = dict(live_requests()[0])  # spec-0: histogram [18, 2, 2, 0, 4], 26 steps, 22 accepted
    off_count = {**meta, "spec_correct_drafts_histogram": [17, 2, 2, 0, 4]}
    assert counter_problems([parse_meta_info(off_count)], 4)[0] == (
        "request spec-0: histogram counts 25 verify steps, spec_verify_ct says 26"
    )
    shifted = {**meta, "spec_correct_drafts_histogram": [18, 2, 2, 1, 3]}
    assert counter_problems([parse_meta_info(shifted)], 4)[0] == (
        "request spec-0: histogram sums to 21 accepted drafts, spec_num_correct_drafts says 22"
    )
    anonymous = {k: v for k, v in shifted.items() if k != "id"}
    assert counter_problems([parse_meta_info(anonymous)], 4)[0].startswith("request 0: histogram")


def test_per_step_statistics_are_read_where_present_and_checked():
    meta = dict(live_requests()[0])
    # 26 steps of 5 verified tokens; accepted drafts per step from the histogram [18, 2, 2, 0, 4]
    accepts = [0] * 18 + [1, 1, 2, 2, 4, 4, 4, 4]
    stats = {"verify_lengths": [5] * 26, "accept_lengths": accepts}
    c = parse_meta_info({**meta, "speculative_decoding_stats": stats})
    assert c.verify_lengths == (5,) * 26 and c.accept_lengths == tuple(accepts)
    assert c.problems() == [] and c.ragged is None
    # a release that counts the bonus token per step agrees too
    bonus = {**stats, "accept_lengths": [a + 1 for a in accepts]}
    assert parse_meta_info({**meta, "speculative_decoding_stats": bonus}).problems() == []
    short = {**stats, "accept_lengths": accepts[:-1]}
    problems = parse_meta_info({**meta, "speculative_decoding_stats": short}).problems()
    assert (
        "request spec-0: accept_lengths lists 25 verify steps, spec_verify_ct says 26" in problems
    )
    assert any("accept_lengths sum to 18, neither" in p for p in problems)
    with pytest.raises(MetaInfoError, match="accept_lengths must list one whole number >= 0"):
        parse_meta_info({**meta, "speculative_decoding_stats": {"accept_lengths": "many"}})
    with pytest.raises(MetaInfoError, match="speculative_decoding_stats must be a JSON object"):
        parse_meta_info({**meta, "speculative_decoding_stats": [1]})
    # absent (every 0.5.23 answer): nothing required
    assert parse_meta_info(meta).verify_lengths is None


def test_ragged_speculation_makes_the_proposed_count_nominal():
    meta = dict(live_requests()[0])
    varied = {"verify_lengths": [5, 3] * 13, "accept_lengths": [0] * 18 + [1, 1, 2, 2] + [4] * 4}
    ragged = parse_meta_info({**meta, "speculative_decoding_stats": varied})
    assert ragged.ragged == "verify lengths varied per step (3 to 5 tokens)"
    assert ragged.spec_num_proposed_drafts is None and ragged.nominal_proposed_drafts == 104
    cap = parse_meta_info({**meta, "spec_cap_length": 2.5, "spec_num_cap_tokens": 60})
    assert cap.ragged == "ragged-verify mode (spec_cap_length, spec_num_cap_tokens present)"
    # accepted drafts may exceed what a fixed width allows there: no width bound, identities kept
    inflated = parse_meta_info({**meta, "spec_cap_length": 2.5, "completion_tokens": 30})
    assert counter_problems([inflated], 4) == []
    broken = {**meta, "spec_cap_length": 2.5, "spec_correct_drafts_histogram": [1]}
    assert counter_problems([parse_meta_info(broken)], 4)


def test_adaptive_speculation_is_read_from_server_info():
    live = json.loads((DATA / "live-0.5.23/spec/server_info_spec_after.json").read_text())
    assert live["speculative_adaptive"] is False and adaptive_speculation(live) is None
    assert adaptive_speculation({**live, "speculative_adaptive": True}) == (
        "adaptive speculation (/server_info speculative_adaptive is on)"
    )
    assert "speculative_adaptive_config" in adaptive_speculation(
        {**live, "speculative_adaptive_config": {"min": 1}}
    )
