"""The pair measurer with a small fake engine pool and meter: no server, no torch.

The fake client answers ``/generate`` the way SGLang does (``output_ids`` and ``meta_info``
with the speculative counters); the fake meter charges a fixed energy per generated token.
They exist only to drive :class:`PairMeasurer` and :class:`ArmMeasurer` without a process.
"""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_specenergy.cases.case import DEFAULT_PROMPT_POOL
from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.case import Generation
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import StepRecord
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure import arm as arm_module
from pytest_specenergy.measure.arm import ArmMeasurer
from pytest_specenergy.measure.arm import ArmRepeat
from pytest_specenergy.measure.arm import arm_concurrency
from pytest_specenergy.measure.pairs import PRESTART_MAX
from pytest_specenergy.measure.pairs import PairMeasurer
from pytest_specenergy.measure.window import disturbed_mean
from pytest_specenergy.meters.base import EnergyWindow
from tests.fakes import engines as engine_fakes
from tests.fakes.engines import AbortingClient
from tests.fakes.engines import FakeBackend
from tests.fakes.engines import FakeServer
from tests.fakes.engines import fake_config

CORPUS = load_corpus("code")


@pytest.fixture(autouse=True)
def no_reruns(monkeypatch):
    """The fake engines here tally requests, not decode steps, and their meters script
    windows: a loaded host could make a fake window look disturbed and re-run it, changing the
    calls these tests count. The re-run tests turn it back on (``monkeypatch``)."""
    monkeypatch.setattr(arm_module, "WINDOW_RERUNS", 0)


class FakeClient(AbortingClient):
    def __init__(self, speculative: bool, log: list) -> None:
        self.speculative, self.log = speculative, log

    def flush_cache(self) -> None:
        self.log.append("flush")

    def server_info(self) -> dict:
        return {}

    def abort(self, rid=None) -> None:
        """SGLang's /abort_request: requests answered after it are cut (see BatchingClient).
        Logged as ``"abort"`` (abort_all, the close) or ``("abort", rid)`` (a retry by rid, which
        a loaded host may make before a fake request's sleep ends)."""
        self.log.append("abort" if rid is None else ("abort", rid))

    def generate(self, text, sampling_params, rids):
        n = sampling_params["max_new_tokens"]
        self.log.append(("generate", self.speculative, len(text), n))
        out = []
        for rid in rids:
            meta = {
                "id": rid,
                "prompt_tokens": 10,
                "completion_tokens": n,
                "finish_reason": {"type": "length", "length": n},
            }
            if self.speculative and n > 1:
                steps = (n - 1) // 2
                meta.update(
                    spec_verify_ct=steps,
                    spec_num_correct_drafts=n - 1 - steps,
                    spec_num_proposed_drafts=steps * 8,
                )
            out.append({"output_ids": list(range(n)), "meta_info": meta})
        return out


class FakePool(engine_fakes.FakePool):
    """One fake server per config for the session, as the real pool keeps its processes."""

    client_class = FakeClient
    # what a backend declares: here no prompt_token_ids, as older SGLang
    backend = FakeBackend()

    def __init__(self) -> None:
        super().__init__()
        self.log: list = []

    def server(self, config):
        client = self.client_class(config.drafter is not None, self.log)
        return FakeServer(config, client, backend=self.backend)


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
        # Windows close in pairs, the full one first: it takes longer than its prefill-only
        # twin, or the measurer would find no decode timed and measure the repeat again.
        self.calls += 1
        return EnergyWindow(
            joules=self.per_call * self.calls,
            seconds=2.0 if self.calls % 2 else 1.0,
            source=self.label,
        )

    def close(self):
        pass


def _measurer(pool, meter, **options: Any) -> PairMeasurer:
    """A measurer of ``pool``'s engines that reads every window with ``meter``: two repeats, no
    warm-up, unless ``options`` (PairMeasurer's keywords) say otherwise."""
    defaults = dict(log_dir=None, startup_timeout=1.0, meter="auto", repeats=2, warmup=0)
    return PairMeasurer(
        **{**defaults, **options}, meter_factory=lambda kind, server: meter, pool=pool
    )


class InterleavePool(FakePool):
    max_live = 0


class BlockedPool(FakePool):
    max_live = 1  # one engine at a time (one GPU): each arm's repeats run together


def _case(drafter: Drafter) -> Case:
    return Case.of(engine="reference", model="tiny:dense", drafter=drafter, batch=2, corpus=CORPUS)


def test_one_baseline_serves_every_drafter_and_counters_come_from_meta_info():
    pool, meter = FakePool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    ngram, draft = (
        _case(Drafter("ngram")),
        _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
    )
    measurer.plan([ngram, draft])
    first, second = measurer.measure(ngram), measurer.measure(draft)
    assert first.baseline is second.baseline  # measured once, shared
    # Old: the second drafter ran its arm alone against a baseline measured before it
    # (baseline_from set: judged unpaired, with a block-drift allowance). Both drafters now run in
    # the baseline's cycles, each paired with it by index, and each record names the other.
    assert second.order.interleaved is True and second.order.baseline_from is None
    assert second.order.cycled_with == (ngram.id,) and first.order.cycled_with == (draft.id,)
    assert measurer.measure(ngram) is first  # cached
    assert first.accept_length is not None and first.accept_length > 1.0
    assert all(s.decode_tokens > 0 for s in first.speculative.samples)
    assert len(first.speculative.samples) == 2 == len(second.speculative.samples)


def test_a_case_not_planned_with_its_siblings_still_shares_the_baseline_unpaired():
    """A case the plan did not hold (measured through the API after its baseline) cannot join the
    cycles already run: it shares the baseline and its record says from where."""
    pool, meter = FakePool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    ngram, draft = (
        _case(Drafter("ngram")),
        _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
    )
    measurer.plan([ngram])
    first, second = measurer.measure(ngram), measurer.measure(draft)
    assert first.baseline is second.baseline and first.order.cycled_with == ()
    assert (
        second.order.baseline_from == ngram.id and list(second.order.order) == ["speculative"] * 2
    )


def test_added_repeats_extend_both_arms():
    pool, meter = FakePool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    case = _case(Drafter("ngram"))
    measurer.plan([case])
    pair = measurer.add_repeats(case, 3)
    assert len(pair.speculative.samples) == 5 and len(pair.baseline.samples) == 5
    assert measurer.measure(case) is pair
    # Repeats walk the pool (plan/window.py): b2 sends 8 prompts a window, so the first two
    # repeats covered 16 of the pool's prompts and the added three 24 more, both arms alike.
    assert pair.baseline.prompts == pair.speculative.prompts == tuple(range(40))


@pytest.mark.parametrize(
    ("pool_class", "twin"), [(InterleavePool, "baseline"), (BlockedPool, "own")]
)
def test_a_drafting_arms_twin_runs_on_the_non_speculative_twin_where_it_is_live(pool_class, twin):
    """Issue 41 item 2: on its own engine the twin subtracted the draft model's prefill of the
    prompts too, work only speculation does; on the baseline engine it subtracts the target's
    prefill alone. One engine at a time (blocked) it can only run on its own."""
    pool, meter = pool_class(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    case = _case(Drafter("draft_model", draft_model="tiny:dense-draft"))
    measurer.plan([case])
    pair = measurer.measure(case)
    engines = {s.window.prefill.twin_engine for s in pair.speculative.samples}
    assert engines == {twin}
    assert {s.window.prefill.twin_engine for s in pair.baseline.samples} == {"own"}
    on_spec = [e for e in pool.log if e[0] == "generate" and e[1] and e[3] == 1]
    assert bool(on_spec) == (twin == "own")
    assert ("draft-prefill-uncharged" in {c.name for c in pair.failed_checks}) == (twin == "own")


def test_the_meter_counts_the_pools_live_engines_as_its_own(monkeypatch):
    from pytest_specenergy.measure import pairs as pairs_module

    built = {}

    def make_meter(kind, own_pids=None):
        built["own_pids"] = own_pids
        return TokenMeter(1.0)

    monkeypatch.setattr(pairs_module, "make_meter", make_meter)
    pool = FakePool()
    measurer = PairMeasurer(
        log_dir=None, startup_timeout=1.0, meter="nvml", repeats=1, warmup=0, pool=pool
    )
    server = pool.get(fake_config())
    server.pid = 4242
    measurer.meter_for(server)
    assert built["own_pids"]() == [4242]


# -- issue #10: constant concurrency, one prompt pool, interleaved arms, per-loop tokens ------


class BatchingClient(FakeClient):
    """Counts requests in flight and records, per call not cut by the close, how many ran
    beside it (a stand-in for SGLang's ``step_time_dict``, which flush resets)."""

    def __init__(
        self, speculative: bool, log: list, delay: float = 0.01, hold_until: int | None = None
    ) -> None:
        super().__init__(speculative, log)
        self.delay, self.lock = delay, threading.Lock()
        #: Hold each request until this many have been in flight at once (at most 5 s), so a
        #: peak is read as the measurer sends it: on a loaded host starting its threads can
        #: take longer than a short fake request runs (a peak of 7 was read for 8).
        self.hold_until = hold_until
        self.arrived = threading.Condition(self.lock)
        self.in_flight = self.peak = 0
        self.steps: dict[str, list] = {}
        self.texts: list = []
        self.calls: list = []  # (texts, max_new_tokens) per call

    def flush_cache(self) -> None:
        super().flush_cache()
        self.steps = {}
        self.aborts = 0

    def abort(self, rid=None) -> None:
        super().abort(rid)
        with self.lock:
            self.aborts += 1

    def server_info(self) -> dict:
        with self.lock:
            return {
                "internal_states": [{"step_time_dict": {k: list(v) for k, v in self.steps.items()}}]
            }

    def generate(self, text, sampling_params, rids):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if self.hold_until is not None:
                self.arrived.notify_all()
                self.arrived.wait_for(lambda: self.peak >= self.hold_until, timeout=5.0)
            self.texts.append(list(text))
            self.calls.append((list(text), sampling_params["max_new_tokens"]))
            aborts = getattr(self, "aborts", 0)
        time.sleep(self.delay)
        with self.lock:
            cut = getattr(self, "aborts", 0) > aborts
            # A request the close cut stops at the abort (SGLang's does): it ran no steps at
            # the falling concurrency after the close, so it records none.
            if sampling_params["max_new_tokens"] > 1 and not cut:
                self.steps.setdefault(str(self.in_flight), []).append(0.0)
            self.in_flight -= 1
        if not cut:
            return super().generate(text, sampling_params, rids)
        # Aborted mid-run: the tokens made so far, finish_reason abort (as SGLang answers).
        made = max(1, sampling_params["max_new_tokens"] // 2)
        answer = super().generate(text, {**sampling_params, "max_new_tokens": made}, rids)
        for a in answer:
            a["meta_info"]["finish_reason"] = {"type": "abort", "message": "Abort requested"}
        return answer


def _server(client, server_info=None, max_running_requests=None):
    return FakeServer(fake_config(max_running_requests), client, server_info)


def test_arm_keeps_the_batch_in_flight_one_request_per_call():
    # Old: one /generate of 4 prompts per chunk, waited for whole: one call in flight.
    client = BatchingClient(True, [], hold_until=4)
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    run = ArmMeasurer(_server(client), TokenMeter(1.0), case, repeats=1, warmup=0).measure(
        "speculative"
    )
    assert all(len(t) == 1 for t, n in client.calls if n > 1)  # one request per full-run call
    assert client.peak == 4  # the batch, held by refilling
    # The prefill-only twin replays the full window's prefill groups (issue 21): one batched
    # call per group, every request the window prefilled once (its 12 prompts, and the fillers
    # that held the batch while its last prompts ran: copies of the pool's, pool 12 holding one
    # window).
    full = run.samples[0].window.full
    measured = [t for texts, n in client.calls if n == 1 for t in texts]
    assert len(measured) == full.prefilled[0] and set(measured) == set(CORPUS.take(12))
    assert full.prompts == 12 and len(run.outputs) == 12
    c = run.concurrency
    assert c.requested == 4 and c.pool == 12
    assert c.mean_running is not None and c.min_running >= 1 and c.max_running <= 4


class ForwardNumberingClient(BatchingClient):
    """Numbers prefill forwards as the reference server does: the first ``batch`` full-run
    requests share forward 1, every refill gets a forward of its own."""

    def __init__(self, batch: int) -> None:
        super().__init__(True, [], delay=0.005)
        self.batch, self.full_seen = batch, 0

    def flush_cache(self) -> None:
        super().flush_cache()  # a window (first, or run again) opens with its own first group
        self.full_seen = 0

    def generate(self, text, sampling_params, rids):
        answers = super().generate(text, sampling_params, rids)
        if sampling_params["max_new_tokens"] > 1:
            for answer in answers:
                with self.lock:
                    self.full_seen += 1
                    seen = self.full_seen
                answer["meta_info"]["prefill_forward"] = 1 if seen <= self.batch else seen
        return answers


def test_the_prefill_twin_replays_the_full_windows_prefill_forwards_group_for_group():
    # Old: the twin sent its prompts batch at a time (one request per call, 4 in flight), so its
    # prefill forwards held up to 4 rows where the window's refills had been prefilled alone.
    client = ForwardNumberingClient(batch=4)
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=10),
    )
    run = ArmMeasurer(_server(client), TokenMeter(1.0), case, repeats=1, warmup=0).measure(
        "speculative"
    )
    twin = [len(texts) for texts, n in client.calls if n == 1]
    assert twin == [4] + [1] * (len(twin) - 1)  # the opening group, then each refill alone
    assert sum(twin) == sum(run.samples[0].window.full.prefilled)
    facts = run.samples[0].window.prefill
    assert facts.grouping == "engine" and list(facts.groups) == twin


def test_an_engine_capped_at_the_batch_gets_requests_queued_beyond_it():
    # Old: batch requests in flight, so each refill left its slot empty for a round trip; then
    # one queued beyond the batch, which left slots empty when two rows finished in one step.
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    for cap, peak in ((4, 8), (32, 4)):
        client = BatchingClient(True, [], hold_until=peak)
        server = _server(client, {"device": "cpu", "max_running_requests": cap})
        measurer = ArmMeasurer(server, TokenMeter(1.0), case, repeats=1, warmup=0)
        measurer.measure_repeat("speculative")
        assert client.peak == peak, cap


class CapSettingClient(BatchingClient):
    """Records ``/set_internal_state`` calls, as the reference server takes them. Each request
    takes 0.1 s, so that the requests a window keeps in flight overlap even when starting a
    thread takes tens of milliseconds on a loaded machine (10 ms once read a peak of 7 for 8)."""

    def __init__(self) -> None:
        super().__init__(True, [], delay=0.1)
        self.set_calls: list[dict] = []

    def set_internal_state(self, **values):
        self.set_calls.append(values)
        return {"updated": True, **values}


def test_an_engine_that_can_set_its_cap_admits_exactly_the_batch_unless_the_case_declares_one():
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    settable = {
        "device": "cpu",
        "max_running_requests": 32,
        "settable_internal_state": ["max_running_requests"],
    }

    def server(client, info, declared=None):
        return _server(client, info, max_running_requests=declared)

    client = CapSettingClient()
    engine = server(client, settable)
    ArmMeasurer(engine, TokenMeter(1.0), case, repeats=1, warmup=1).measure("speculative")
    # Set once (not per request), then the steady window keeps the batch queued beyond it.
    assert client.set_calls == [{"max_running_requests": 4}] and engine.admission_cap == 4
    assert client.peak == 8
    # The next case's batch on the same engine sets it again.
    b2 = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=2,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    ArmMeasurer(engine, TokenMeter(1.0), b2, repeats=1, warmup=0).measure_repeat("speculative")
    assert client.set_calls[-1] == {"max_running_requests": 2} and engine.admission_cap == 2
    # A declared cap, a batch above the engine's maximum, or an engine that cannot set it:
    # untouched.
    for info, declared in (
        (settable, 8),
        ({**settable, "max_running_requests": 2}, None),
        ({"device": "cpu", "max_running_requests": 32}, None),
    ):
        client = CapSettingClient()
        ArmMeasurer(
            server(client, info, declared), TokenMeter(1.0), case, repeats=1, warmup=0
        ).measure_repeat("speculative")
        assert client.set_calls == [] and client.peak == 4, (info, declared)


class TimedClient(FakeClient):
    """Answers as the reference server does under a board meter: ``e2e_latency`` for every
    request (0.5 s full, 0.1 s prefill-only: batched twin prefills run long) and, for full
    runs, the request's own decode time ``decode_seconds`` (0.7 s over 7 gaps)."""

    def generate(self, text, sampling_params, rids):
        answers = super().generate(text, sampling_params, rids)
        full = sampling_params["max_new_tokens"] > 1
        for answer in answers:
            answer["meta_info"]["e2e_latency"] = 0.5 if full else 0.1
            if full:
                answer["meta_info"]["decode_seconds"] = 0.7
        return answers


def test_tbt_under_a_board_meter_is_the_engines_own_decode_time_per_request():
    # Old: e2e latency minus the prefill-only twin's, (0.5 - 0.1) / 7 gaps = 57 ms, which
    # carries the twin's (differently batched) prefill; the engine timed 0.7 s of decode steps.
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=1,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=3),
    )
    run = ArmMeasurer(_server(TimedClient(False, [])), TokenMeter(1.0), case, 1, 0).measure(
        "baseline"
    )
    assert run.tbt_ms == pytest.approx(100.0)


def test_one_prompt_pool_at_every_batch_and_the_override():
    assert DEFAULT_PROMPT_POOL == 96
    # Old: max(batch, 4) rounded to whole batches -> 4 prompts at batch 1, 16 at batch 16.
    # never cycles by default
    assert Generation().pool_size(100) == 96 and Generation().pool_size(20) == 20
    assert Generation(prompts=10).pool_size(100) == 10  # no rounding to whole batches
    pools = {
        ArmMeasurer(
            _server(FakeClient(False, [])),
            TokenMeter(1.0),
            Case.of(
                engine="reference",
                model="tiny:dense",
                drafter=Drafter("ngram"),
                batch=b,
                corpus=CORPUS,
            ),
            1,
            0,
        ).prompts
        for b in (1, 4, 16)
    }
    assert len(pools) == 1 and len(next(iter(pools))) == 96


def _arm_order(log):
    """The arm of each measured full run (max_new_tokens > 1), collapsed per window."""
    arms = []
    for entry in log:
        if entry == "flush":
            arms.append("flush")
        elif entry[3] > 1 and arms and arms[-1] == "flush":
            arms[-1] = "speculative" if entry[1] else "baseline"
    return [a for a in arms if a != "flush"]


@pytest.mark.parametrize(
    "pool_class", [InterleavePool, BlockedPool], ids=["interleaved", "blocked"]
)
def test_an_engine_that_died_between_repeats_is_warmed_up_again_and_said_so(pool_class):
    # Blocked: the repeats of an arm once ran back to back on whatever the pool held (issue 23
    # item 19, fault-matrix probe N4).
    pool = pool_class()
    measurer = _measurer(pool, TokenMeter(1.0), repeats=3, warmup=1)
    case = _case(Drafter("ngram"))
    measurer.plan([case])
    real_timed = measurer._timed

    def timed(arm_measurer, name, *args):
        result = real_timed(arm_measurer, name, *args)
        if name == "speculative" and len(pool.starts) == 2:
            pool.live.pop(arm_measurer.server.config)  # the process died after its first repeat
        return result

    measurer._timed = timed
    pair = measurer.measure(case)
    assert [r.as_dict() for r in pair.order.restarts] == [
        {"arm": "speculative", "before_repeat": 1}
    ]
    assert len(pool.starts) == 3  # started again once
    [check] = [c for c in pair.checks if c.name == "engine-restarted"]
    assert check.severity == "warn" and "before its repeat 2 (warmed up again)" in check.message
    warm_ups = [e for e in pool.log if e != "flush" and e[1] and e[3] > 1]
    # 3 measured speculative windows and 2 warm-ups (at start, after restart)
    assert len(warm_ups) >= 3 + 2


def test_repeats_interleave_the_arms_and_the_order_is_recorded():
    pool = InterleavePool()
    measurer = _measurer(pool, TokenMeter(1.0), repeats=3, cooldown_s=0.001)
    ngram, draft = (
        _case(Drafter("ngram")),
        _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
    )
    measurer.plan([ngram, draft])
    pair = measurer.measure(ngram)
    # Old: every baseline repeat first, then every speculative repeat (BBBSSS).
    assert list(pair.order.order) == ["baseline", "speculative"] * 3
    assert pair.order.interleaved is True and pair.order.cooldown_s == 0.001
    starts = [e.started for e in pair.order.repeats]
    assert starts == sorted(starts) and all(e.finished >= e.started for e in pair.order.repeats)
    assert pair.as_dict()["order"]["order"] == list(pair.order.order)
    # Old: the sibling drafter ran alone after the pairing, with baseline_from set. It ran in the
    # same cycles (baseline, ngram, draft; baseline, draft, ngram; ...), paired by index.
    assert _arm_order(pool.log) == ["baseline", "speculative", "speculative"] * 3
    second = measurer.measure(draft)
    assert second.baseline is pair.baseline and second.order.baseline_from is None
    assert list(second.order.order) == ["baseline", "speculative"] * 3
    # Each cycle ran the baseline first, then both drafters, their order alternating.
    entries = sorted(pair.order.repeats + second.order.repeats, key=lambda e: e.started)
    starts = {(e.arm, e.repeat, e.started) for e in entries}
    assert len(starts) == 9  # the shared baseline's three repeats once, each drafter's three
    # Added repeats interleave too, extend the numbering, and keep the sibling paired.
    more = measurer.add_repeats(ngram, 2)
    assert list(more.order.order) == ["baseline", "speculative"] * 5
    assert [e.repeat for e in more.order.repeats if e.arm == "baseline"] == [0, 1, 2, 3, 4]
    grown = measurer.measure(draft)
    assert len(grown.speculative.samples) == 5 == len(grown.baseline.samples)
    assert grown.baseline.samples == more.baseline.samples


def test_a_sibling_drafter_whose_engine_fails_is_left_out_of_the_cycles():
    """The second drafter's engine dies during the first case's measurement: the first case is
    measured again without it (its own pair intact), and the second fails on its own."""
    pool, meter = FailingDraftPool(), TokenMeter(1.0)
    measurer = _measurer(pool, meter)
    ngram, draft = (
        _case(Drafter("ngram")),
        _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
    )
    measurer.plan([ngram, draft])
    pair = measurer.measure(ngram)
    assert pair.order.cycled_with == () and len(pair.speculative.samples) == 2
    with pytest.raises(ConnectionError):
        measurer.measure(draft)


def test_one_engine_at_a_time_runs_blocked_and_says_so():
    pool, meter = FakePool(), TokenMeter(1.0)
    pool.max_live = 1
    measurer = _measurer(pool, meter)
    case = _case(Drafter("ngram"))
    pair = measurer.measure(case)
    assert pair.order.interleaved is False
    assert list(pair.order.order) == ["baseline", "baseline", "speculative", "speculative"]


def test_a_pool_of_two_engines_gives_each_drafter_cycles_of_its_own_with_the_baseline():
    """Two resident engines (one GPU): the baseline and one drafter at a time. Old: the second
    drafter shared the first's baseline, unpaired. Each now runs in its own cycles with the
    baseline measured again, paired by index."""
    pool, meter = FakePool(), TokenMeter(1.0)
    pool.max_live = 2
    measurer = _measurer(pool, meter)
    ngram, draft = (
        _case(Drafter("ngram")),
        _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
    )
    measurer.plan([ngram, draft])
    first, second = measurer.measure(ngram), measurer.measure(draft)
    for pair in (first, second):
        assert pair.order.interleaved and pair.order.baseline_from is None
        assert list(pair.order.order) == ["baseline", "speculative"] * 2
    assert first.baseline is not second.baseline


def test_every_repeat_is_told_to_the_progress_callback():
    told: list[tuple[int, str]] = []
    measurer = _measurer(
        FakePool(), TokenMeter(1.0), progress=lambda level, text: told.append((level, text))
    )
    case = _case(Drafter("ngram"))
    measurer.measure(case)
    # At -v (level 1): which case, which arm, which repeat, interleaved as measured.
    assert {level for level, _ in told} == {1}
    assert [re.sub(r" \(\d+\.\d s\)$", "", text) for _, text in told] == [
        f"{case.id} baseline repeat 1/2",
        f"{case.id} speculative repeat 1/2",
        f"{case.id} baseline repeat 2/2",
        f"{case.id} speculative repeat 2/2",
    ]


class ShrinkingClient(FakeClient):
    """Each full run answers fewer tokens than the one before (GPU nondeterminism)."""

    def __init__(self, speculative, log):
        super().__init__(speculative, log)
        self.full_runs = 0

    def generate(self, text, sampling_params, rids):
        if sampling_params["max_new_tokens"] == 1:
            return super().generate(text, sampling_params, rids)
        n = 9 - 2 * self.full_runs
        self.full_runs += 1
        return super().generate(text, {**sampling_params, "max_new_tokens": n}, rids)


class LoopingMeter(TokenMeter):
    min_window_s = 2.5

    def stop(self, token):
        self.calls += 1  # the full window (3 loops) takes longer than its prefill-only twin's
        return EnergyWindow(joules=30.0, seconds=3.0 if self.calls % 2 else 1.5, source=self.label)


def test_tokens_are_counted_over_every_loop_like_the_energy(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(
        arm_module,
        "time",
        SimpleNamespace(monotonic=lambda: float(next(clock)), time=time.time, sleep=time.sleep),
    )
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=1,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=9, prompts=1),
    )
    client = ShrinkingClient(False, [])
    sample = (
        ArmMeasurer(_server(client), LoopingMeter(1.0), case, 1, 0).measure("baseline").samples[0]
    )
    # Three loops per window (clock ticks 1, 2, 3 against 2.5 s): full runs answer 9, 7, 5 tokens.
    assert sample.loops == 3 and client.full_runs == 3
    # Per loop: (9 + 7 + 5) / 3 = 7 completion tokens, minus 1 from the prefill-only run.
    # Old: the first loop's 9 - 1 = 8, against energy averaged over all three loops.
    assert sample.decode_tokens == 6
    assert sample.window.full.tokens_per_loop == 7


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
    draft, ngram = (
        _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
        _case(Drafter("ngram")),
    )
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
    pool.max_live = 1  # one engine at a time: siblings' baselines are measured ahead
    measurer = _measurer(pool, meter)
    code = _case(Drafter("ngram"))
    chat = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=2,
        corpus=CONVERSATION,
    )
    measurer.plan([code, chat])
    assert measurer.measure(code).baseline.samples  # the sibling's refusal does not leak here
    with pytest.raises(ValueError, match="exceeds the context"):
        measurer.measure(chat)  # the failing case fails with its own error, measured once more
    assert chat.baseline_key() in measurer._sibling_failed  # it was tried ahead, with code's engine


def test_one_engine_pool_measures_sibling_baselines_while_the_engine_runs():
    pool, meter = FakePool(), TokenMeter(1.0)
    pool.max_live = 1
    measurer = _measurer(pool, meter)
    b2, b4 = (
        _case(Drafter("ngram")),
        Case.of(
            engine="reference", model="tiny:dense", drafter=Drafter("ngram"), batch=4, corpus=CORPUS
        ),
    )
    measurer.plan([b2, b4])
    measurer.measure(b2)
    starts = len([c for c in pool.starts if c.drafter is None])
    second = measurer.measure(b4)
    assert "measured ahead" in second.order.baseline_from
    # b4's baseline came from the engine b2 started: no baseline engine was asked for again.
    assert len([c for c in pool.starts if c.drafter is None]) == starts


def test_the_window_runs_its_prompts_whole_and_ends_by_aborting_the_fillers_in_flight():
    """Pool of 12 at batch 4: once the window's 12 prompts are sent, fillers hold the batch until
    the last prompt answers; the fillers still in flight are then aborted (issue 41 item 4: the
    old close cut the last 3 prompts, a different share of each arm's work). The window's tokens
    are its prompts' whole outputs; its energy is weighed by their share of the decode rows, and
    the prefill-only window holds every request the full window prefilled."""
    client = BatchingClient(True, [], delay=0.02)
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    measurer = ArmMeasurer(_server(client), TokenMeter(1.0), case, repeats=1, warmup=0)
    repeat = measurer.measure_repeat("speculative")
    full, sample = repeat.sample.window.full, repeat.sample
    fillers = full.requests - 12
    assert client.log.count("abort") == 1  # one close (retries by rid are logged apart)
    assert full.prompts == 12 and fillers >= 3 and full.aborted[0] <= fillers
    assert sample.decode_tokens == 12 * 7 and sample.coverage == 1.0
    # Whole outputs from the window itself: nothing generated again (the cut fillers answered
    # with 4 tokens).
    whole = [e for e in client.log if e[0] == "generate" and e[3] == 8]
    assert len(whole) == full.requests - full.aborted[0]
    assert all(len(o) == 8 for o in repeat.outputs) and "abort" not in repeat.finish
    assert repeat.sample.window.prefill.requests == full.prefilled[0]
    # The prompts' rows (3 verify steps each) over every request's: fillers cut at 4 tokens ran
    # one row each.
    cut = full.aborted[0]
    assert sample.work_share == pytest.approx(36 / (36 + 3 * (fillers - cut) + cut))


def test_a_later_repeat_takes_cut_prompts_whole_outputs_from_an_earlier_one_when_they_agree(
    monkeypatch,
):
    """Greedy outputs: a prompt cut again in repeat 2 whose partial tokens are a prefix of the
    whole output repeat 1 made is not generated again; one that disagrees is. (Windows whose
    fillers ran out close by the old rule and cut their last prompts: here there are none.)"""
    monkeypatch.setattr(arm_module, "filler_prompts", lambda batch, pool, repeat: ())
    client = BatchingClient(True, [], delay=0.02)
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    measurer = ArmMeasurer(_server(client), TokenMeter(1.0), case, repeats=2, warmup=0)
    first = measurer.measure_repeat("speculative")
    # Whole (8-token) generations: the window's 9 uncut requests, then the 3 cut ones again.
    calls = len([e for e in client.log if e[0] == "generate" and e[3] == 8])
    assert calls == 9 + 3
    second = measurer.measure_repeat("speculative")
    assert second.sample.window.full.aborted == (3,)
    assert len([e for e in client.log if e[0] == "generate" and e[3] == 8]) == calls + 9
    assert second.outputs == first.outputs and all(len(o) == 8 for o in second.outputs)
    # A partial output that is not a prefix of the known one: generated again, whole.
    for index in list(measurer._whole):
        measurer._whole[index] = ((99,) * 8, "length")
    third = measurer.measure_repeat("speculative")
    assert len([e for e in client.log if e[0] == "generate" and e[3] == 8]) == calls + 9 + 9 + 3
    assert all(len(o) == 8 for o in third.outputs) and "abort" not in third.finish


class AbortingEverythingClient(BatchingClient):
    """An engine that aborts every request (a stale abort-all, an operator's /abort_request)."""

    def generate(self, text, sampling_params, rids):
        answer = FakeClient.generate(self, text, {**sampling_params, "max_new_tokens": 2}, rids)
        for a in answer:
            a["meta_info"]["finish_reason"] = {"type": "abort", "message": "Abort requested"}
        return answer


def test_a_regenerated_prompt_the_engine_aborts_again_fails_the_case_saying_so():
    """Outputs cut short outside the window are never taken as whole (the case would then fail
    blaming the drafter: incoherent, length blow-up)."""
    client = AbortingEverythingClient(True, [], delay=0.0)
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    measurer = ArmMeasurer(_server(client), TokenMeter(1.0), case, repeats=1, warmup=0)
    with pytest.raises(
        RuntimeError,
        match=r"engine aborted \d+ request\(s\) the plugin generated again outside "
        r"the window .* twice: their outputs are incomplete",
    ):
        measurer.measure_repeat("speculative")


def test_a_batch_of_one_has_nothing_to_abort():
    client = BatchingClient(False, [], delay=0.0)
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=1,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=3),
    )
    repeat = ArmMeasurer(_server(client), TokenMeter(1.0), case, 1, 0).measure_repeat("baseline")
    assert "abort" not in client.log and repeat.sample.window.full.aborted == (0,)


def test_tbt_is_the_decode_steps_time_and_never_negative():
    """A meter that times each request's decode steps gives its TBT directly; a subtraction
    that comes out non-positive (the prefill-only twin queued longer than the request ran) is
    left out, never reported."""
    from pytest_specenergy.engines.meta_info import parse_meta_info
    from pytest_specenergy.measure.window import Window
    from pytest_specenergy.measure.window import decode_sample

    def window(seconds, decode=None, tokens=9):
        meta = {
            "id": "a",
            "prompt_tokens": 5,
            "completion_tokens": tokens,
            "finish_reason": {"type": "length", "length": tokens},
        }
        energy = EnergyWindow(10.0, 1.0, "modeled (fake)", {"a": seconds}, {}, decode)
        return Window(energy, 1, ((parse_meta_info(meta),),), (((1,) * tokens,),), {}, (0,))

    timed = decode_sample(window(0.5, tokens=1), window(2.0, decode={"a": 0.08}))
    assert timed.tbt_ms == pytest.approx(10.0)  # 80 ms over 8 gaps
    assert decode_sample(window(0.5, tokens=1), window(2.0, decode={"a": -0.1})).tbt_ms is None
    # Old: a request's latency minus its twin's, (0.9 - 0.5) s over 8 gaps; on SGLang a queued
    # refill's latency holds its wait in the queue (4-5x the engine's decode time, issue 41).
    assert decode_sample(window(0.5, tokens=1), window(0.9)).tbt_ms is None


# -- issue 22 item 1: one GPU, both engines resident when they fit ------------------------------
def _gpu_case(tmp_path, gib: float, drafter: Drafter, reference: Drafter | None = None) -> Case:
    folder = tmp_path / f"model-{gib:g}"
    if not folder.exists():
        folder.mkdir()
        with open(folder / "model.safetensors", "wb") as handle:
            handle.truncate(int(gib * 1024**3))
        # Qwen3-8B's attention sizes: what the KV pool plan reads (engines/kv_pools.py).
        (folder / "config.json").write_text(
            '{"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, '
            '"head_dim": 128, "hidden_size": 4096}'
        )
    return Case.of(
        engine="sglang",
        model=str(folder),
        device="cuda",
        drafter=drafter,
        batch=2,
        corpus=CORPUS,
        reference=reference,
    )


class GpuPool(FakePool):
    """SGLang engines on a GPU: each reports the KV pool it holds, as SGLang's ``/server_info``
    does (``max_total_num_tokens``), its pinned ``max_total_tokens`` unless ``short`` says
    otherwise for its config."""

    def __init__(self, short: dict | None = None) -> None:
        super().__init__()
        self.short = short or {}

    def server(self, config):
        server = super().server(config)
        tokens = self.short.get(config.drafter is not None, config.option("max_total_tokens"))
        server.server_info = {"device": "cuda", "max_total_num_tokens": tokens}
        return server


def _gpu_measurer(pool, meter, gpu_gib: float | None) -> PairMeasurer:
    return _measurer(
        pool,
        meter,
        gpu_memory=lambda: None if gpu_gib is None else int(gpu_gib * 1024**3),
        server_fields=lambda: None,
    )


def test_on_one_gpu_engines_that_fit_stay_resident_and_the_arms_interleave(tmp_path):
    pool, meter = GpuPool(), TokenMeter(1.0)
    measurer = _gpu_measurer(pool, meter, 141)
    case = _gpu_case(tmp_path, 16.4, Drafter("ngram"))
    measurer.plan([case])
    assert pool.max_live == 2  # both engines at once: no restart per arm switch
    pair = measurer.measure(case)
    assert pair.order.interleaved is True
    assert list(pair.order.order) == ["baseline", "speculative"] * 2
    residency = pair.order.residency
    assert residency.resident is True and residency.mem_fraction_static == 0.80
    # Each engine started once, with the same fraction, the one planned pool and --sleep-on-idle.
    assert len(pool.starts) == 2
    tokens = residency.pools.max_total_tokens
    assert {
        (c.option("mem_fraction_static"), c.option("max_total_tokens"), c.option("sleep_on_idle"))
        for c in pool.starts
    } == {(0.80, tokens, True)}
    more = measurer.add_repeats(case, 2)
    assert more.order.interleaved is True and len(pool.starts) == 2


def test_on_one_gpu_engines_that_do_not_fit_run_blocked_and_say_why(tmp_path):
    pool, meter = GpuPool(), TokenMeter(1.0)
    measurer = _gpu_measurer(pool, meter, 80)
    case = _gpu_case(tmp_path, 28.0, Drafter("ngram"))  # two 28 GiB engines and their reserves
    measurer.plan([case])
    assert pool.max_live == 1
    pair = measurer.measure(case)
    assert pair.order.interleaved is False
    assert list(pair.order.order) == ["baseline", "baseline", "speculative", "speculative"]
    assert pair.order.residency.resident is False and "blocked order" in pair.order.residency.reason
    assert all(c.option("sleep_on_idle") is None for c in pool.starts)
    # Blocked, the arms are still pinned to one pool.
    assert len({c.option("max_total_tokens") for c in pool.starts}) == 1


@pytest.mark.parametrize("fits", [141, 80], ids=["resident", "blocked"])
def test_arms_whose_kv_pools_differ_are_refused_before_warm_up(tmp_path, fits):
    """Issue 37: the arms' KV pools are compared once their engines are up, before any request
    (blocked: against the baseline's /server_info from its start, its engine stopped since)."""
    pool = GpuPool(short={True: 61440})  # the speculative engine found less memory free
    measurer = _gpu_measurer(pool, TokenMeter(1.0), fits)
    case = _gpu_case(tmp_path, 16.4 if fits == 141 else 28.0, Drafter("ngram"))
    measurer.plan([case])
    with pytest.raises(EngineConfigError, match=r"KV pools differ before the first window"):
        measurer.measure(case)
    full_runs = [e for e in pool.log if e[0] == "generate" and e[3] > 1]
    started = [e for e in pool.log if e[0] == "generate" and e[1]]
    assert not started  # the speculative engine ran nothing, warm-up included
    assert bool(full_runs) == (fits == 80)  # blocked: the baseline's block ran first


def test_in_job_ab_keeps_three_engines_resident_or_none(tmp_path):
    pool, meter = GpuPool(), TokenMeter(1.0)
    measurer = _gpu_measurer(pool, meter, 141)
    case = _gpu_case(
        tmp_path, 16.4, Drafter("ngram"), reference=Drafter("ngram", num_draft_tokens=4)
    )
    measurer.plan([case])
    assert pool.max_live == 3
    pair = measurer.measure(case)
    assert pair.order.interleaved is True and pair.order.residency.mem_fraction_static == 0.70
    # Unknown GPU memory: not guessed, blocked.
    blocked = _gpu_measurer(FakePool(), meter, None)
    blocked.plan([case])
    assert blocked.pool.max_live == 1 and "no NVML" in blocked.residency.reason


class PrestartPool(InterleavePool):
    """Records what :meth:`PairMeasurer.start_planned` asks to start side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.together: list[list] = []

    def start_together(self, configs) -> None:
        self.together.append(list(configs))


def test_the_planned_reference_engines_start_side_by_side_before_the_first_case():
    pool = PrestartPool()
    measurer = _measurer(pool, TokenMeter(1.0))
    ngram, draft = (
        _case(Drafter("ngram")),
        _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
    )
    on_sglang = Case.of(
        engine="sglang",
        model="/models/x",
        drafter=Drafter("ngram"),
        batch=2,
        corpus=CORPUS,
        device="cpu",
    )
    many = [_case(Drafter("ngram", num_draft_tokens=k)) for k in range(1, 9)]
    measurer.plan([ngram, draft, on_sglang, *many])
    measurer.start_planned()
    (started,) = pool.together
    # The baseline once, each drafter's engine, in plan order; no SGLang engine; at most
    # PRESTART_MAX.
    assert started[:3] == [ngram.baseline_config(), ngram.spec_config(), draft.spec_config()]
    assert len(started) == PRESTART_MAX == len(set(started))
    assert all(c.engine == "reference" for c in started)
    # A bounded pool (engines on one GPU, one or a few at a time) starts each when its case comes.
    bounded = PrestartPool()
    bounded.max_live = 2
    measurer = _measurer(bounded, TokenMeter(1.0))
    measurer.plan([ngram, draft])
    measurer.start_planned()
    assert bounded.together == []


@pytest.mark.parametrize("worker", [False, True], ids=["controller", "xdist-worker"])
def test_the_session_starts_the_planned_engines_except_on_an_xdist_worker(worker):
    """A worker plans every collected case but runs only those it is sent: it starts none early."""
    from pytest_specenergy.session import SpecEnergySession

    calls = []
    fake = SimpleNamespace(
        plan=lambda cases: calls.append(("plan", len(cases))),
        start_planned=lambda: calls.append(("start_planned",)),
    )
    session = SpecEnergySession(SimpleNamespace(pair_measurer=lambda meter, progress: fake))
    session.planned, session.xdist_worker = [_case(Drafter("ngram"))], worker
    assert session.measurer is fake
    assert calls == [("plan", 1)] + ([] if worker else [("start_planned",)])


def test_a_window_is_disturbed_when_it_ran_well_below_its_own_peak():
    # A real SGLang window on a loaded host: 14 steps at 1 row and 4 at 3 beside 174 at 4.
    loaded = StepRecord(mean_running=(14 + 12 + 174 * 4) / 192, max_running=4)
    assert disturbed_mean(loaded) == pytest.approx(3.76, abs=0.01)
    assert disturbed_mean(StepRecord(mean_running=3.93, max_running=4)) is None  # ordinary edges
    # An engine admitting 2 of a batch of 4 runs at its own peak: the checks judge it, no rerun.
    assert disturbed_mean(StepRecord(mean_running=1.99, max_running=2)) is None
    assert disturbed_mean(StepRecord()) is None  # no step record
    window = StepRecord(steps_by_running={"4": 10}, mean_running=4.0)

    def repeat(*reruns):
        return ArmRepeat(
            sample=None, outputs=(), finish=(), concurrency=window, stable=True, rerun_means=reruns
        )

    merged = arm_concurrency(4, [repeat(2.8), repeat()], 12)
    assert merged.rerun_means == (2.8,) and merged.window_means == (4.0, 4.0)
    assert "rerun_means" not in arm_concurrency(4, [repeat()], 12).as_dict()


#: Two step records of 2.5 rows a step, peak 3, from different steps.
_STEPS = {"steps_by_running": {"2": 4, "3": 4}, "mean_running": 2.5, "max_running": 3}
_OTHER_STEPS = {"steps_by_running": {"1": 1, "2": 2, "3": 5}, "mean_running": 2.5, "max_running": 3}


@pytest.mark.parametrize(
    "means, kept, dropped",
    [
        # the rerun ran the batch: no third window
        ((3.5, 4.0), 4.0, (3.5,)),
        # CI's live A/A baseline: the first ran nearest the batch
        ((3.76, 3.31, 3.5), 3.76, (3.31, 3.5)),
        ((3.76, 3.76, 3.76), 3.76, (3.76, 3.76)),
        # the rerun ran at its own (lower) peak: undisturbed, kept; the checks judge it
        ((3.7, (3.0, 3)), 3.0, (3.7,)),
        # the rerun kept no step record: kept, no None among the dropped
        ((3.7, (None, None)), None, (3.7,)),
        # the rerun ran the same steps, row count for row count: the shortfall is the workload's
        # own (a retraction, an engine admitting fewer as its pool fills), no third window
        ((_STEPS, _STEPS), 2.5, (2.5,)),
        # the same mean from other steps (a host's disturbance lands anywhere): run again
        ((_STEPS, _OTHER_STEPS, _STEPS), 2.5, (2.5, 2.5)),
    ],
    ids=[
        "rerun-undisturbed",
        "first-best",
        "equal",
        "rerun-at-own-peak",
        "rerun-without-record",
        "reproduced",
        "same-mean-other-steps",
    ],
)
def test_of_the_windows_a_disturbed_repeat_ran_the_one_nearest_the_batch_is_kept(
    monkeypatch, means, kept, dropped
):
    monkeypatch.setattr(arm_module, "WINDOW_RERUNS", 2)
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=4,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=12),
    )
    measurer = ArmMeasurer(
        _server(FakeClient(False, [])), TokenMeter(1.0), case, repeats=1, warmup=0
    )
    windows = [
        SimpleNamespace(
            concurrency=StepRecord(**m)
            if isinstance(m, dict)
            else StepRecord(
                **dict(zip(("mean_running", "max_running"), m if isinstance(m, tuple) else (m, 4)))
            )
        )
        for m in means
    ]
    script = iter(windows)
    monkeypatch.setattr(measurer, "_window", lambda *args, **kwargs: next(script))
    full, got = measurer._steady_window(0)
    assert next(script, None) is None  # every scripted window ran, and no more
    assert full.concurrency.mean_running == kept and got == dropped
    if means[0] == means[-1]:
        assert full is windows[-1]  # of equals, the latest


class ScriptedMeter(TokenMeter):
    """Reads each window from a script of (joules, seconds), in the order the windows close."""

    def __init__(self, script) -> None:
        super().__init__(0.0)
        self.script = list(script)

    def stop(self, token):
        joules, seconds = self.script.pop(0)
        return EnergyWindow(joules=joules, seconds=seconds, source=self.label)


def _baseline_arm(meter):
    # Batch 1: no fillers, so the scripted readings are the sample's, unweighed.
    case = Case.of(
        engine="reference",
        model="tiny:dense",
        drafter=Drafter("ngram"),
        batch=1,
        corpus=CORPUS,
        generation=Generation(max_new_tokens=8, prompts=4),
    )
    return ArmMeasurer(_server(FakeClient(False, [])), meter, case, repeats=1, warmup=0).measure(
        "baseline"
    )


def test_a_repeat_whose_prefill_window_stalled_is_measured_again(monkeypatch):
    monkeypatch.setattr(arm_module, "WINDOW_RERUNS", 1)
    # full window, then its prefill-only twin: the first twin stalled past the full window.
    run = _baseline_arm(ScriptedMeter([(10.0, 1.0), (12.0, 1.2), (10.0, 1.0), (2.0, 0.2)]))
    [sample] = run.samples
    assert sample.decode_seconds == pytest.approx(0.8) and sample.decode_joules == pytest.approx(
        8.0
    )
    assert list(sample.window.rerun_decode_seconds) == [pytest.approx(-0.2)]


def test_a_repeat_that_never_measures_decode_is_kept_and_fails_saying_it_was_measured_again(
    monkeypatch,
):
    from pytest_specenergy.measure.checks import _window_checks

    monkeypatch.setattr(arm_module, "WINDOW_RERUNS", 1)

    stalled = _baseline_arm(ScriptedMeter([(10.0, 1.0), (12.0, 1.2), (10.0, 1.0), (11.0, 1.1)]))
    assert stalled.samples[0].decode_seconds == pytest.approx(-0.1)
    [check] = [c for c in _window_checks(stalled, stalled) if c.name == "decode-time-not-positive"][
        :1
    ]
    assert "measured again after repeats whose decode time was -0.2 s" in check.message


class ScoringClient(FakeClient):
    """Answers like the reference server, coherence's scoring calls (``max_new_tokens=0``) included;
    the speculative arm's last token differs from the baseline's, so every prompt is scored. Each
    tokenisation is logged as ``("tokenise", asked for prompt_token_ids)``."""

    def generate(
        self,
        input_ids=None,
        *,
        text=None,
        sampling_params,
        rids=None,
        return_logprob=False,
        logprob_start_len=None,
        return_prompt_token_ids=False,
        top_logprobs_num=0,
    ):
        if sampling_params["max_new_tokens"]:
            answers = super().generate(text, sampling_params, rids)
            for answer in answers if self.speculative else ():
                answer["output_ids"][-1] += 1
            return answers
        if text is not None:
            self.log.append(("tokenise", return_prompt_token_ids))
        rows = (
            [[ord(c) for c in t] for t in text]
            if text is not None
            else [list(ids) for ids in input_ids]
        )
        start = logprob_start_len or 0
        top = [[-0.1, 1, None], [-0.2, 2, None]][:top_logprobs_num]
        return [
            {
                "output_ids": [],
                "prompt_token_ids": row,
                "meta_info": {
                    "input_token_logprobs": [
                        [None if k == start else -0.5, t, None]
                        for k, t in enumerate(row)
                        if k >= start
                    ],
                    "input_top_logprobs": [None] + [top] * (len(row) - start - 1),
                },
            }
            for row in rows
        ]


class ScoringPool(FakePool):
    client_class = ScoringClient


class PromptIdsPool(ScoringPool):
    backend = FakeBackend(returns_prompt_token_ids=True)  # as ReferenceBackend declares


@pytest.mark.parametrize("asks", [True, None])
def test_coherence_asks_for_prompt_ids_where_the_engine_has_them(asks):
    """The reference server answers ``prompt_token_ids`` without a forward; an engine not known to
    have them (older SGLang) is asked for input logprobs instead."""
    pool = PromptIdsPool() if asks else ScoringPool()
    pair = _measurer(pool, TokenMeter(1.0)).measure(_case(Drafter("ngram")))
    assert all(pair.coherence.diverged)
    assert {entry for entry in pool.log if entry[0] == "tokenise"} == {("tokenise", bool(asks))}


def test_the_pair_hook_hears_of_every_pair_once_a_siblings_included():
    """A case measured in a sibling's cycles is measured before its test asks: the hook still
    hears of its pair, once (old: only of pairs measured when their own test asked)."""
    from pytest_specenergy.session import SpecEnergySession

    heard: list = []
    hook = SimpleNamespace(pytest_specenergy_pair_measured=lambda pair: heard.append(pair))
    pairs = {"first": object(), "sibling": object()}
    fake = SimpleNamespace(
        plan=lambda cases: None,
        start_planned=lambda: None,
        measure=lambda case: pairs[case],
        measured=lambda case: True,  # both measured by the first case's cycles
    )
    session = SpecEnergySession(SimpleNamespace(pair_measurer=lambda meter, progress: fake), hook)
    session.xdist_worker = True
    for case in ("first", "sibling", "first"):
        session.measure(case)
    assert heard == [pairs["first"], pairs["sibling"]]
