"""Logprob semantics as SGLang's (reference/sglang-api.md section 6)."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_specenergy.refserver.records import GenerationRequest
from pytest_specenergy.refserver.records import SamplingParams


def _tol(engine) -> float:
    # A prefill and a decode step reduce in different orders. On the CPU the tiny models run in
    # float32: the two paths' logits differ by up to ~1e-5 (benchmarks/results/tiny_dtype.txt,
    # "path noise"). On CUDA they run in float64, but transformers computes the RoPE angles in
    # float32 with shape-dependent kernels, so the paths differ by ~1e-7.
    return 1e-4 if engine.target.dtype == torch.float32 else 1e-5


def _req(ids, max_new=6, start=-1, logprob=True):
    return GenerationRequest(
        tuple(ids), SamplingParams(max_new_tokens=max_new, ignore_eos=True), logprob, start
    )


@pytest.fixture(scope="module")
def engine(engine_for):
    return engine_for(model="tiny:dense")


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.tokenizer.encode("The energy per token of speculative decoding")


@pytest.mark.parametrize("start", [0, 1, 5, -1, "len"])
def test_input_logprobs_alignment(engine, prompt, start):
    s = len(prompt) if start == "len" else start
    (r,) = engine.generate([_req(prompt, start=s)])
    effective = len(prompt) - 1 if s == -1 else s
    entries = r.input_token_logprobs
    assert len(entries) == len(prompt) - effective  # == prompt_tokens - S
    if entries:
        assert entries[0] == (None, prompt[effective])  # entry 0 is always null
        assert [tid for _, tid in entries] == prompt[effective:]
        assert all(lp is not None and lp <= 0 for lp, _ in entries[1:])


def test_scoring_only_and_rescore_matches_decode(engine, prompt):
    (gen,) = engine.generate([_req(prompt, max_new=8)])
    assert len(gen.output_token_logprobs) == 8
    assert [t for _, t in gen.output_token_logprobs] == list(gen.output_ids)
    full = list(prompt) + list(gen.output_ids)
    (score,) = engine.generate([_req(full, max_new=0, start=len(prompt) - 1)])
    assert score.output_ids == ()
    assert score.finish_reason.type == "length" and score.finish_reason.length == 0
    rescored = [lp for lp, _ in score.input_token_logprobs[1:]]
    decoded = [lp for lp, _ in gen.output_token_logprobs]
    assert len(rescored) == len(decoded)
    for a, b in zip(rescored, decoded):
        assert math.isclose(a, b, abs_tol=_tol(engine))


def test_speculative_output_logprobs_match_plain(engine_for, engine, prompt):
    spec = engine_for(model="tiny:dense", drafter="draft_model", num_draft_tokens=4)
    (a,) = engine.generate([_req(prompt, max_new=20)])
    (b,) = spec.generate([_req(prompt, max_new=20)])
    assert a.output_ids == b.output_ids
    for (x, tx), (y, ty) in zip(a.output_token_logprobs, b.output_token_logprobs):
        assert tx == ty and math.isclose(x, y, abs_tol=_tol(engine))


def test_no_logprobs_unless_asked(engine, prompt):
    (r,) = engine.generate([_req(prompt, logprob=False)])
    assert r.input_token_logprobs is None and r.output_token_logprobs is None


def test_logprob_start_beyond_prompt_is_rejected(prompt):
    with pytest.raises(ValueError, match="larger than the prompt"):
        _req(prompt, start=len(prompt) + 1)
