"""Retractions: SGLang's retracted-then-queued abort parses (the real payload's shape), every
request's retractions are counted, and two arms' counts give a flag."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pytest_specenergy.engines.meta_info import MetaInfoError
from pytest_specenergy.engines.meta_info import parse_meta_info
from pytest_specenergy.engines.retractions import Retractions
from pytest_specenergy.engines.retractions import arms_differ
from pytest_specenergy.engines.retractions import count

LIVE = Path(__file__).resolve().parents[2] / "data" / "sglang" / "live-0.5.23"


def _answers() -> list[dict]:
    return json.loads((LIVE / "generate_abort_queued.json").read_text())


def _retracted_answer() -> dict:
    """A live 0.5.23 queue-abort answer (captured, ``generate_abort_queued.json``) as a request
    that ran 500 tokens, was retracted and then aborted in the queue answers it: the same keys
    (``tokenizer_manager.py`` ``_handle_abort_req``, lines 3596-3637: no ``prompt_tokens``, no
    ``num_retractions``), ``completion_tokens`` and ``output_ids`` from the output it kept
    (``len(state.output_ids)``, line 3628), as the audit's live repro answered (sglang-audit-3 C2:
    r0-2, ``completion_tokens`` 500)."""
    [queued] = [
        a
        for a in _answers()
        if a["meta_info"]["finish_reason"]["message"] == "Abort in waiting queue"
    ][:1]
    answer = copy.deepcopy(queued)
    answer["output_ids"] = list(range(500))
    answer["meta_info"].update(
        id="r0-2",
        completion_tokens=500,
        weight_versions=[{"version": "default", "start": 0, "end": 500}],
    )
    return answer


def test_the_retracted_then_queued_abort_has_the_real_shape_and_parses():
    meta = _retracted_answer()["meta_info"]
    assert "prompt_tokens" not in meta and "num_retractions" not in meta
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    counters = parse_meta_info(meta, prompt_tokens=12)  # the request the plugin sent: 12 tokens
    assert (counters.prompt_tokens, counters.completion_tokens) == (12, 500)
    assert counters.queued_abort and counters.retractions == 1 and counters.finish_type == "abort"


def test_without_the_callers_prompt_length_it_still_parses_with_the_prompt_unknown():
    counters = parse_meta_info(_retracted_answer()["meta_info"])
    assert counters.prompt_tokens is None and counters.completion_tokens == 500


def test_a_never_admitted_queued_abort_ran_no_prompt_and_was_not_retracted():
    [meta] = [
        a["meta_info"]
        for a in _answers()
        if a["meta_info"]["finish_reason"]["message"] == "Abort in waiting queue"
    ][:1]
    counters = parse_meta_info(meta)
    assert (counters.prompt_tokens, counters.completion_tokens) == (0, 0)
    assert counters.retractions is None and counters.queued_abort
    assert parse_meta_info(meta, prompt_tokens=9).prompt_tokens == 9


def test_a_finished_request_reports_its_own_retractions_and_prompt():
    running = [a for a in _answers() if "prompt_tokens" in a["meta_info"]][0]["meta_info"]
    counters = parse_meta_info({**running, "num_retractions": 2}, prompt_tokens=999)
    assert counters.retractions == 2 and counters.prompt_tokens == running["prompt_tokens"]
    assert not counters.queued_abort


def test_a_finished_payload_without_prompt_tokens_is_still_refused():
    meta = {"id": "x", "finish_reason": {"type": "length", "length": 8}, "completion_tokens": 8}
    with pytest.raises(MetaInfoError, match="lacks prompt_tokens"):
        parse_meta_info(meta, prompt_tokens=5)
    with pytest.raises(MetaInfoError, match="lacks completion_tokens"):
        parse_meta_info({"finish_reason": {"type": "abort"}})


def _counters(*retractions):
    answers = []
    for n in retractions:
        if n == "queued":
            answers.append(parse_meta_info(_retracted_answer()["meta_info"], prompt_tokens=12))
        else:
            meta = {**_answers()[0]["meta_info"]}
            if n is None:
                meta.pop("num_retractions")
            else:
                meta["num_retractions"] = n
            answers.append(parse_meta_info(meta))
    return answers


def test_counts_per_arm_add_up_over_windows():
    window = count(_counters(0, 2, "queued", None))
    assert window == Retractions(requests=4, retracted=2, total=3, unknown=1)
    assert window + count(_counters(1)) == Retractions(5, 3, 4, 1)
    assert "2 of 4 requests retracted (3 retractions), 1 not reported" == window.describe()


def test_the_flag_fails_arms_that_differ_warns_alike_and_is_silent_without_any():
    none = count(_counters(0, 0))
    assert arms_differ(none, none) is None
    assert arms_differ(count(_counters(None)), count(_counters(None))) is None
    flag = arms_differ(none, count(_counters(0, "queued")))
    assert flag.name == "retractions-differ" and flag.severity == "fail"
    assert "baseline 0 of 2 requests retracted" in flag.message
    assert "speculative 1 of 2 requests retracted (1 retractions)" in flag.message
    alike = arms_differ(count(_counters(1, 0)), count(_counters(0, 1)))
    assert alike.severity == "warn" and alike.name == "retractions"
