"""Continuous batching: requests join the running batch at any step, finished rows leave at once.

Exactness must survive joins (a joined row's KV is merged with holes, its recurrent state appended),
and the running batch must stay full while requests are waiting.
"""

from __future__ import annotations

import threading
import time

import pytest

from pytest_specenergy.refserver.records import GenerationRequest
from pytest_specenergy.refserver.records import SamplingParams

N_REQ = 9


def _ragged(engine, make_requests, n=N_REQ):
    """Requests of different lengths, some honouring EOS: rows finish (and others join) at many
    steps."""
    return [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=5 + (7 * i) % 19, ignore_eos=i % 3 != 0)
        )
        for i, r in enumerate(make_requests(engine, n, 1))
    ]


def _lifetime(engine):
    state = engine.server_info()["internal_states"][0]
    return state["decode_steps"], state["decode_row_steps"], dict(state["decode_steps_by_running"])


@pytest.fixture(scope="module")
def plain(engine_for, make_requests):
    """Per model: plain outputs of the ragged requests, all in one batch."""
    out = {}
    for model in ("tiny:dense", "tiny:hybrid"):
        engine = engine_for(model=model)
        out[model] = engine.generate(_ragged(engine, make_requests))
    return out


@pytest.mark.parametrize(("drafter", "k"), [("ngram", 8), ("draft_model", 4)])
@pytest.mark.parametrize("model", ("tiny:dense", "tiny:hybrid"))
def test_rows_joining_at_arbitrary_steps_are_exact(
    engine_for, make_requests, plain, model, drafter, k
):
    """3 rows run at a time; the other 6 join whenever a row finishes, mid-way through the others."""
    engine = engine_for(model=model, drafter=drafter, num_draft_tokens=k, max_running_requests=3)
    reqs = _ragged(engine, make_requests)
    start = len(engine.trace)
    got = engine.generate(reqs)
    want = plain[model]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.output_ids == w.output_ids, f"{model} {drafter} row {i} diverged"
        assert g.finish_reason == w.finish_reason
    steps = engine.trace.read(start)[1]
    phases = [s.phase for s in steps if s.model == "target"]
    first_verify = phases.index("verify")
    joins = [i for i, p in enumerate(phases) if p == "prefill" and i > first_verify]
    assert len(joins) >= 3, "requests must have joined a running batch"
    assert max(len(s.rids) for s in steps if s.phase == "verify") == 3
    if model == "tiny:hybrid":
        rejected = sum(r.spec.verify_ct * k - r.spec.num_correct_drafts for r in got)
        assert rejected > 0  # the recurrent-state rollback ran on merged rows


def test_queued_requests_keep_the_batch_full(engine_for, make_requests):
    """A finished row is replaced in the next step: while requests wait, every step runs 4 rows."""
    engine = engine_for(
        model="tiny:dense", drafter="ngram", num_draft_tokens=8, max_running_requests=4
    )
    reqs = [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=6 + (5 * i) % 17, ignore_eos=True)
        )
        for i, r in enumerate(make_requests(engine, 16, 1))
    ]
    start = len(engine.trace)
    engine.generate(reqs)
    steps = engine.trace.read(start)[1]
    target = [s for s in steps if s.model == "target"]
    admitted = 0
    for step in target:
        if step.phase == "prefill":
            admitted += len(step.rids)
        elif admitted < len(reqs):  # someone is still queued: the batch must be full
            assert len(step.rids) == 4, [(s.phase, len(s.rids)) for s in target]
    assert admitted == len(reqs)


def test_staggered_arrivals_from_threads(engine_for, make_requests):
    """Clients keeping 4 requests in flight (one per call) see a full batch and alone-run outputs."""
    batch = 4
    engine = engine_for(
        model="tiny:dense", drafter="ngram", num_draft_tokens=8, max_running_requests=batch
    )
    plain = engine_for(model="tiny:dense")
    pool = [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=8 + (5 * i) % 13, ignore_eos=True)
        )
        for i, r in enumerate(make_requests(engine, 16, 1))
    ]
    want = {r.input_ids: w.output_ids for r, w in zip(pool, plain.generate(pool))}
    got: dict[tuple[int, ...], tuple[int, ...]] = {}
    lock = threading.Lock()
    todo = list(pool)
    window: dict[str, tuple] = {"start": _lifetime(engine)}

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    # the first client to run dry ends it
                    window.setdefault("end", _lifetime(engine))
                    return
                req = todo.pop(0)
            (result,) = engine.generate([req])
            with lock:
                got[req.input_ids] = result.output_ids

    threads = [threading.Thread(target=client) for _ in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == want  # every request equals its own plain run
    (s0, r0, _), (s1, r1, _) = window["start"], window["end"]
    mean = (r1 - r0) / (s1 - s0)
    assert mean >= 0.8 * batch, (
        f"mean running rows per step {mean:.2f} while clients kept {batch} in flight"
    )


def test_prefill_only_run_holds_the_draft_prefill(engine_for, make_requests):
    """max_new_tokens=1 finishes in prefill, and the draft model's prefill is in that window too."""
    engine = engine_for(model="tiny:dense", drafter="draft_model", num_draft_tokens=4)
    reqs = [
        GenerationRequest(r.input_ids, SamplingParams(max_new_tokens=1))
        for r in make_requests(engine, 3, 1)
    ]
    start = len(engine.trace)
    engine.generate(reqs)
    steps = engine.trace.read(start)[1]
    assert [(s.phase, s.model) for s in steps] == [("prefill", "target"), ("prefill", "draft")]
    assert steps[1].query_tokens == tuple(len(r.input_ids) for r in reqs)


def test_concurrency_counters_difference_across_a_flush(engine_for, make_requests):
    """Lifetime counters never reset, so a window's mean and minimum come from two reads."""
    engine = engine_for(model="tiny:dense", max_running_requests=3)
    s0, r0, h0 = _lifetime(engine)
    reqs = [
        GenerationRequest(r.input_ids, SamplingParams(max_new_tokens=3 + 2 * i, ignore_eos=True))
        for i, r in enumerate(make_requests(engine, 4, 1))
    ]
    engine.generate(reqs)
    assert engine.flush_cache()
    state = engine.server_info()["internal_states"][0]
    assert state["step_time_dict"] == {} and state["min_running"] is None
    s1, r1, h1 = _lifetime(engine)
    grown = {int(k): v - h0.get(k, 0) for k, v in h1.items() if v - h0.get(k, 0) > 0}
    assert sum(grown.values()) == s1 - s0
    assert sum(k * v for k, v in grown.items()) == r1 - r0
    assert max(grown) == 3 and min(grown) == 1
    assert state["num_running_reqs"] == 0 and state["num_queue_reqs"] == 0
    assert state["prefill_rows"] >= 4


def test_abort_cuts_running_and_queued_requests_and_keeps_what_they_made(engine_for, make_requests):
    """SGLang's /abort_request: a running row answers with its output so far and finish abort;
    a queued one answers with nothing; the others run on, exact; no mark outlives the abort."""
    engine = engine_for(
        model="tiny:dense", drafter="ngram", num_draft_tokens=4, max_running_requests=2
    )
    reqs = [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=400, ignore_eos=True), rid=f"ab-{i}"
        )
        for i, r in enumerate(make_requests(engine, 3, 1))
    ]
    ticket = engine.submit(reqs)
    while not any(row.output for row in engine.scheduler.running):
        threading.Event().wait(0.01)
    engine.abort("ab-0")
    engine.abort(None)  # ab-1 (running) and ab-2 (queued behind the cap of 2)
    got = ticket.wait(60)
    assert [g.finish_reason.type for g in got] == ["abort"] * 3
    assert 0 < len(got[0].output_ids) < 400 and got[2].output_ids == ()
    assert got[0].finish_reason.to_json() == {
        "type": "abort",
        "message": "Abort requested by /abort_request.",
    }
    # Nothing marked on an idle engine: the next request runs whole.
    engine.abort(None)
    whole = engine.generate(
        [GenerationRequest(reqs[0].input_ids, SamplingParams(max_new_tokens=5))]
    )
    assert whole[0].finish_reason.type != "abort" and len(whole[0].output_ids) == 5


def _until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)


def test_abort_all_never_reaches_a_request_submitted_after_it(engine_for):
    """Issue 21: an abort-all that arrives while the last rows run their final iteration must
    finish with them, not wait on the idle engine and cut the next window's first request.

    The scheduler is paused between iterations, deterministically: it needs ``_cv`` to begin one
    (abort marks are taken there) and the engine lock to run it. A plain row commits two tokens
    in the iteration that admits it (prefill + decode) and one per iteration after that."""
    engine = engine_for(model="tiny:dense", max_running_requests=4)
    sched = engine.scheduler

    def request(max_new: int) -> GenerationRequest:
        return GenerationRequest(
            (5, 6, 7, 8), SamplingParams(max_new_tokens=max_new, ignore_eos=True)
        )

    with engine.lock:
        first = engine.submit([request(3)])
        _until(lambda: sched.num_waiting == 0, "the scheduler admits the first request")
        with sched._cv:
            engine.lock.release()  # iteration 1 runs; the next one cannot begin while we hold _cv
            try:
                _until(lambda: len(first.rows[0].output) == 2, "iteration 1 commits two tokens")
            finally:
                engine.lock.acquire()  # iteration 1 is over; iteration 2 waits for the lock
            second = engine.submit([request(2)])  # admitted in iteration 2 and finishes in it
        _until(lambda: sched.num_waiting == 0, "iteration 2 takes its abort marks and admits")
        engine.abort(None)  # both rows are live now, and both finish in the iteration under way
    assert [r.finish_reason.type for r in first.wait(60) + second.wait(60)] == ["length", "length"]
    (after,) = engine.generate([request(4)], timeout=60)
    assert after.finish_reason.type == "length" and len(after.output_ids) == 4


def test_each_request_names_its_prefill_forward_and_its_own_decode_time(engine_for, make_requests):
    """Rows admitted in one iteration share a prefill forward (the trace's prefill step holds
    exactly them); a row's decode time is the wall time of the steps it ran in (issue 21)."""
    engine = engine_for(model="tiny:dense", max_running_requests=3)
    reqs = [
        GenerationRequest(
            r.input_ids, SamplingParams(max_new_tokens=4 + 3 * (i % 2), ignore_eos=True)
        )
        for i, r in enumerate(make_requests(engine, 6, 1))
    ]
    start = len(engine.trace)
    got = engine.generate(reqs)
    steps = engine.trace.read(start)[1]
    prefills = [set(s.rids) for s in steps if s.phase == "prefill" and s.model == "target"]
    forwards: dict[int, set[str]] = {}
    for result in got:
        assert result.prefill_forward is not None
        forwards.setdefault(result.prefill_forward, set()).add(result.rid)
    assert sorted(map(sorted, forwards.values())) == sorted(map(sorted, prefills))
    assert len(prefills) >= 2  # the later rows joined as refills
    for result in got:
        mine = [s.wall_s for s in steps if s.phase == "decode" and result.rid in s.rids]
        # The step's forward plus its commit (argmax, stop checks): never less than the forwards,
        # and no prefill in it (a loaded host stretches the commit, hence the loose top).
        assert sum(mine) <= result.decode_s <= sum(mine) + 0.05 * len(mine) + 0.05
        assert len(mine) == len(result.output_ids) - 1


def test_close_fails_the_queued_requests_stops_the_thread_and_refuses_new_ones(make_requests):
    """In-process use: ``close()`` stops the scheduler thread after its iteration; queued requests
    fail with the reason, and a submit after it is refused (a fresh engine: closing a shared one
    would break other tests)."""
    from pytest_specenergy.refserver import EngineConfig
    from pytest_specenergy.refserver import ReferenceEngine

    engine = ReferenceEngine(EngineConfig(model="tiny:dense", max_running_requests=1))
    running, queued = (
        [GenerationRequest(r.input_ids, SamplingParams(max_new_tokens=400, ignore_eos=True))]
        for r in make_requests(engine, 2, 1)
    )
    engine.submit(running)
    _until(lambda: any(row.output for row in engine.scheduler.running), "the first request decodes")
    waiting = engine.submit(queued)
    engine.close()
    with pytest.raises(RuntimeError, match="the engine was closed"):
        waiting.wait(30)
    assert not engine.scheduler._thread.is_alive()
    with pytest.raises(RuntimeError, match="the engine is closed"):
        engine.submit(queued)
