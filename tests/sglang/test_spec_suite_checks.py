"""The live session's own checks on SGLang's speculative counters (``spec_suite.py``), on payloads
captured from the live NGRAM engine (``dev/sglang_capture_spec.py``), and on the same payloads
with one number wrong: each check must hold on the real answers and fail on the bad ones."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import spec_suite
from sglang_envs import REPO

DATA = REPO / "tests" / "data" / "sglang"
SPEC = DATA / "live-0.5.23" / "spec"


def load(path: Any) -> Any:
    return json.loads(path.read_text())


def spec_metas() -> list[dict[str, Any]]:
    """Every captured NGRAM answer: the batch (48 tokens, one finished in prefill) and the
    retraction (450 tokens, closed by aborts)."""
    batch = [a["meta_info"] for a in load(DATA / "generate_spec_0.5.23.json")]
    retraction = [a["meta_info"] for a in load(SPEC / "generate_retraction_spec.json")]
    return [(m, 48) for m in batch] + [(m, 450) for m in retraction]


def test_the_identities_hold_on_every_captured_answer():
    checked = 0
    for meta, max_new_tokens in spec_metas():
        assert spec_suite.counter_identities(meta, max_new_tokens) == [], meta
        checked += meta.get("spec_verify_ct") is not None
    assert checked >= 6  # 4 in the batch, the retraction's running and finished ones


@pytest.mark.parametrize(
    "field, change, message",
    [
        ("spec_correct_drafts_histogram", lambda h: [h[0] + 1, *h[1:]], "sums to"),
        ("spec_correct_drafts_histogram", lambda h: [*h[:-2], h[-2] + 1, h[-1] - 1], "weighs"),
        ("spec_num_proposed_drafts", lambda n: n + 1, "proposed drafts"),
        ("completion_tokens", lambda n: n + 5, "committed"),
    ],
)
def test_each_identity_fails_on_a_wrong_counter(field, change, message):
    meta, max_new_tokens = next(
        (m, t)
        for m, t in spec_metas()
        if m.get("spec_verify_ct") and m["spec_correct_drafts_histogram"][-1] > 0
    )
    bad = copy.deepcopy(meta)
    bad[field] = change(bad.get(field))
    problems = spec_suite.counter_identities(bad, max_new_tokens)
    assert any(message in p for p in problems), problems


def test_an_abort_must_count_exactly_what_it_committed():
    aborted = [
        m
        for m, _ in spec_metas()
        if m.get("spec_verify_ct") and m["finish_reason"]["type"] == "abort"
    ]
    assert aborted, "the capture has no aborted speculative answer"
    bad = {**aborted[0], "completion_tokens": aborted[0]["completion_tokens"] - 1}
    assert any("(abort)" in p for p in spec_suite.counter_identities(bad, 450))
    # a retraction's re-prefill makes one token more than the verify steps account for
    retracted = {**aborted[0], "num_retractions": int(aborted[0].get("num_retractions") or 0) + 1}
    assert any("(abort)" in p for p in spec_suite.counter_identities(retracted, 450))


def test_step_records_match_the_counters_of_the_captured_batch():
    # /server_info around the captured batch: every verify step ran each running request once,
    # so the rows it ran add up to the requests' verify steps.
    from pytest_specenergy.engines.meta_info import concurrency_between

    window = {
        "concurrency": concurrency_between(
            load(SPEC / "server_info_spec_before.json"), load(SPEC / "server_info_spec_after.json")
        )
    }
    verify = sum(
        a["meta_info"].get("spec_verify_ct") or 0 for a in load(DATA / "generate_spec_0.5.23.json")
    )
    assert verify > 0
    sample = {"verify_steps": verify, "decode_tokens": None}
    assert spec_suite.steps_match_counters(window, sample, "speculative") == ""
    wrong = {**sample, "verify_steps": verify + 1}
    assert "step_time_dict ran" in spec_suite.steps_match_counters(window, wrong, "speculative")
