"""The baseline's top-2 margin at each divergence, read through coherence's scoring requests."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.measure import coherence
from pytest_specenergy.measure.equivalence import compare_outputs

EOS = 0


def lp(prev: int, token: int) -> float:
    """A toy model: after ``prev`` the best token is ``prev + 1`` (-0.5); ``prev + 2`` is a
    near-tie after odd tokens (-0.52) and far behind after even ones (-2.5); the rest -6."""
    if token == prev + 1:
        return -0.5
    if token == prev + 2:
        return -0.52 if prev % 2 else -2.5
    return -6.0


class ToyEngine:
    """Answers /generate like SGLang: input_token_logprobs and input_top_logprobs from
    ``logprob_start_len`` on, entry 0 None; ``prompt_token_ids`` on request."""

    def __init__(self, break_tops: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.break_tops = break_tops

    def generate(
        self,
        input_ids=None,
        *,
        text=None,
        sampling_params,
        return_logprob=False,
        logprob_start_len=None,
        return_prompt_token_ids=False,
        **extra,
    ):
        self.calls.append({"input_ids": input_ids, "text": text, **extra})
        rows = [[10] for _ in text] if text is not None else [list(r) for r in input_ids]
        out = []
        for row in rows:
            meta: dict[str, Any] = {}
            if return_logprob:
                start = logprob_start_len or 0
                meta["input_token_logprobs"] = [
                    [None if k == start else lp(row[k - 1], t), t, None]
                    for k, t in enumerate(row)
                    if k >= start
                ]
                n = extra.get("top_logprobs_num", 0)
                if n:
                    tops = [None] + [
                        sorted(
                            (
                                [lp(row[k - 1], c), c, None]
                                for c in (row[k - 1] + 1, row[k - 1] + 2, EOS)
                            ),
                            reverse=True,
                        )[:n]
                        for k in range(start + 1, len(row))
                    ]
                    meta["input_top_logprobs"] = [] if self.break_tops else tops
            out.append(
                {
                    "text": "",
                    "output_ids": [],
                    "meta_info": meta,
                    **({"prompt_token_ids": row} if return_prompt_token_ids else {}),
                }
            )
        return out


BASE = [[11, 12, 13, 14, 15, 16], [11, 12, 13, 14, 15, 16]]
# Prompt 0 takes the runner-up after an odd token (13 -> 15 after 13): a near-tie, margin 0.02,
# then follows greedily. Prompt 1 takes it after an even token (12 -> 14): margin 2.0.
SPEC = [[11, 12, 13, 15, 16, 17], [11, 12, 14, 15, 16, 17]]


def measure(engine: ToyEngine, baseline=BASE, speculative=SPEC, **kw):
    return coherence.measure_coherence(
        engine,
        ["p", "q"],
        baseline,
        speculative,  # type: ignore[arg-type]
        return_prompt_token_ids=True,
        **kw,
    )


def test_margins_classify_a_near_tie_and_a_real_divergence():
    engine = ToyEngine()
    result = measure(engine, tie_margins=True)
    tie, real = result.margins
    assert tie.margin == pytest.approx(0.02) and tie.top_ids == (14, 15) and tie.between_top2
    assert tie.later_gap == pytest.approx(0.02)  # the divergence itself; greedy after it
    assert real.margin == pytest.approx(2.0) and real.between_top2
    eq = compare_outputs(BASE, SPEC, result.margins)
    assert [r.kind() for r in eq.requests] == ["tie", "real"]
    asked = [c.get("top_logprobs_num") for c in engine.calls if c["input_ids"]]
    assert asked == [2, 1, 2, 1]  # top-2 on the baseline's scoring, top-1 on the speculative's


def test_a_near_tie_followed_by_non_greedy_text_is_real():
    # Same near-tie at token 3, then 16 -> 18 after an even token: 2 nats below the best.
    spec = [[11, 12, 13, 15, 16, 18], SPEC[1]]
    result = measure(ToyEngine(), speculative=spec, tie_margins=True)
    assert result.margins[0].later_gap == pytest.approx(2.0) and result.margins[0].later_index == 5
    eq = compare_outputs(BASE, spec, result.margins)
    assert eq.requests[0].kind() == "real"
    assert "speculative token 5 is 2.000 nats below the target's best" in eq.requests[0].describe()


def test_when_the_baseline_stopped_at_the_divergence_its_stop_must_be_the_other_top2_token():
    # The baseline ends after 13 (its stop not in output_ids); the speculative arm goes on.
    base, spec = [[11, 12, 13], BASE[1]], [[11, 12, 13, 14], BASE[1]]
    engine = ToyEngine()
    without_stops = measure(engine, baseline=base, speculative=spec, tie_margins=True)
    assert (
        without_stops.margins[0].top_ids == (14, 15) and not without_stops.margins[0].between_top2
    )
    assert without_stops.margins[1] is None  # identical: nothing to classify
    # only the diverged prompt is tokenised (a prefill each)
    assert engine.calls[0]["text"] == ["p"]
    assert engine.calls[-1]["input_ids"] == [[10, 11, 12, 13, 14]]  # the prefix plus the next token


def test_without_tie_margins_nothing_extra_is_asked_and_every_divergence_stays_real():
    engine = ToyEngine()
    result = measure(engine)
    assert result.margins == (None, None)
    assert all("top_logprobs_num" not in c for c in engine.calls)
    assert [r.kind() for r in compare_outputs(BASE, SPEC, result.margins).requests] == [
        "real",
        "real",
    ]


def test_a_malformed_top_logprobs_answer_is_refused_with_the_expected_shape():
    with pytest.raises(
        coherence.CoherenceError, match="input_top_logprobs should have 7 entries, entry 0 None"
    ):
        measure(ToyEngine(break_tops=True), tie_margins=True)


def test_the_client_sends_top_logprobs_num_only_with_return_logprob():
    client = EngineClient("http://127.0.0.1:9")
    with pytest.raises(
        ValueError, match="top_logprobs_num must be an integer >= 0 and needs return_logprob"
    ):
        client.generate([[1]], sampling_params={}, top_logprobs_num=2)
    sent = {}
    client._request = lambda method, path, body: sent.update(body) or [{}]  # type: ignore[method-assign]
    client.generate(
        [[1]], sampling_params={}, return_logprob=True, logprob_start_len=0, top_logprobs_num=2
    )
    assert sent["top_logprobs_num"] == 2
