"""The pair measurer with a small fake engine pool and meter: no server, no torch.

The fake client answers ``/generate`` the way SGLang does (``output_ids`` and ``meta_info``
with the speculative counters); the fake meter charges a fixed energy per generated token.
They exist only to drive :class:`PairMeasurer` and :class:`ArmMeasurer` without a process.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure.pairs import PairMeasurer
from pytest_specenergy.meters.base import EnergyWindow

CORPUS = load_corpus("code")


class FakeClient:
    def __init__(self, speculative: bool, log: list) -> None:
        self.speculative, self.log = speculative, log

    def flush_cache(self) -> None:
        self.log.append("flush")

    def server_info(self) -> dict:
        return {}

    def generate(self, text, sampling_params, rids):
        n = sampling_params["max_new_tokens"]
        self.log.append(("generate", self.speculative, len(text), n))
        out = []
        for rid in rids:
            meta = {"id": rid, "prompt_tokens": 10, "completion_tokens": n,
                    "finish_reason": {"type": "length", "length": n}}
            if self.speculative and n > 1:
                steps = (n - 1) // 2
                meta.update(spec_verify_ct=steps, spec_num_correct_drafts=n - 1 - steps,
                            spec_num_proposed_drafts=steps * 8)
            out.append({"output_ids": list(range(n)), "meta_info": meta})
        return out


class FakePool:
    def __init__(self) -> None:
        self.starts, self.log = [], []

    def get(self, config):
        self.starts.append(config)
        client = FakeClient(config.drafter is not None, self.log)
        return SimpleNamespace(config=config, client=client, server_info={"device": "cpu"},
                               describe=lambda: {"engine": "fake", "version": "0"})

    def close(self) -> None:
        pass


class TokenMeter:
    kind, label, min_window_s = "modeled:fake", "modeled (fake)", 0.0

    def __init__(self, joules_per_call: float) -> None:
        self.per_call = joules_per_call
        self.calls = 0

    def describe(self):
        return {"kind": self.kind}

    def start(self, engine):
        return engine

    def stop(self, token):
        self.calls += 1
        return EnergyWindow(joules=self.per_call * self.calls, seconds=1.0, source=self.label)

    def close(self):
        pass


def _measurer(pool, meter) -> PairMeasurer:
    return PairMeasurer(log_dir=None, startup_timeout=1.0, meter="auto", repeats=2, warmup=0,
                        meter_factory=lambda kind, server: meter, pool=pool)


def _case(drafter: Drafter) -> Case:
    return Case(engine="reference", model="tiny:dense", drafter=drafter, batch=2, corpus=CORPUS)


def test_one_baseline_serves_every_drafter_and_counters_come_from_meta_info():
    pool, meter = FakePool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    ngram, draft = _case(Drafter("ngram")), _case(Drafter("draft_model", draft_model="tiny:dense-draft"))
    measurer.plan([ngram, draft])
    first, second = measurer.measure(ngram), measurer.measure(draft)
    assert first.baseline is second.baseline  # measured once, shared
    assert measurer.measure(ngram) is first  # cached
    assert first.accept_length is not None and first.accept_length > 1.0
    assert all(s.decode_tokens > 0 for s in first.speculative.samples)
    assert len(first.speculative.samples) == 2


def test_added_repeats_extend_both_arms():
    pool, meter = FakePool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    case = _case(Drafter("ngram"))
    measurer.plan([case])
    pair = measurer.add_repeats(case, 3)
    assert len(pair.speculative.samples) == 5 and len(pair.baseline.samples) == 5
    assert measurer.measure(case) is pair


class FailingDraftPool(FakePool):
    """The draft model's engine dies on every request; every other engine is healthy."""

    def get(self, config):
        server = super().get(config)
        if config.drafter is not None and config.drafter.name == "draft_model":
            def broken(*args, **kwargs):
                raise ConnectionError("engine exited with code -9")
            server.client.generate = broken
        return server


def test_one_cases_failure_never_fails_its_sibling():
    """The first case's speculative engine dies: its sibling still gets the shared baseline,
    measured for it once (not once per sibling), and its own pair."""
    pool, meter = FailingDraftPool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    draft, ngram = _case(Drafter("draft_model", draft_model="tiny:dense-draft")), _case(Drafter("ngram"))
    measurer.plan([draft, ngram])
    with pytest.raises(ConnectionError):
        measurer.measure(draft)
    pair = measurer.measure(ngram)
    assert pair.accept_length is not None and len(pair.baseline.samples) == 2
    with pytest.raises(ConnectionError):  # the failed case fails again on its own, alone
        measurer.measure(draft)
    assert measurer.measure(ngram) is pair


class LongPromptPool(FakePool):
    """A baseline engine that refuses the conversation corpus (a prompt beyond its context)."""

    def get(self, config):
        server = super().get(config)
        generate = server.client.generate

        def refuse_long(text, sampling_params, rids):
            if any(prompt in CONVERSATION.prompts for prompt in text):
                raise ValueError("prompt of 9000 tokens exceeds the context length 4096")
            return generate(text, sampling_params, rids)
        server.client.generate = refuse_long
        return server


CONVERSATION = load_corpus("conversation")


def test_a_siblings_failing_baseline_is_not_this_cases_failure():
    pool, meter = LongPromptPool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    code = _case(Drafter("ngram"))
    chat = Case(engine="reference", model="tiny:dense", drafter=Drafter("ngram"), batch=2, corpus=CONVERSATION)
    measurer.plan([code, chat])
    assert measurer.measure(code).baseline.samples  # the sibling's refusal does not leak here
    with pytest.raises(ValueError, match="exceeds the context"):
        measurer.measure(chat)  # the failing case fails with its own error, measured once more
