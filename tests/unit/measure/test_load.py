"""The steady-state load generator on its own: prompts taken, refills, the in-flight set, the end
rule and errors, with a scripted engine in place of HTTP."""

from __future__ import annotations

import threading

import pytest

from pytest_specenergy.measure.load import SteadyLoad
from pytest_specenergy.measure.load import load_width
from pytest_specenergy.measure.load import next_rid


class ScriptedEngine:
    """Each request runs until the test finishes it (``finish``) or a close cuts it (``abort``),
    as a continuously batching engine's requests do; it records what was sent and the most
    requests it held at once."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.running: dict[str, int] = {}  # rid -> position
        self.done: dict[str, str] = {}  # rid -> "finished" | "aborted"
        self.sent: list[int] = []
        self.peak = 0

    def send(self, position: int, rid: str) -> dict:
        with self.lock:
            self.sent.append(position)
            self.running[rid] = position
            self.peak = max(self.peak, len(self.running))
            self.lock.notify_all()
            self.lock.wait_for(lambda: rid in self.done, timeout=10)
            how = self.done.get(rid, "timed out")
            self.running.pop(rid, None)
        return {"position": position, "rid": rid, "how": how}

    def send_many(self, positions, rids) -> list:
        """One batched call: its requests run side by side; it answers once all have."""
        with self.lock:
            for position, rid in zip(positions, rids):
                self.sent.append(position)
                self.running[rid] = position
            self.peak = max(self.peak, len(self.running))
            self.lock.notify_all()
            self.lock.wait_for(lambda: all(rid in self.done for rid in rids), timeout=10)
            for rid in rids:
                self.running.pop(rid, None)
        return [
            {"position": p, "rid": rid, "how": self.done.get(rid, "timed out")}
            for p, rid in zip(positions, rids)
        ]

    def wait_running(self, count: int) -> None:
        with self.lock:
            assert self.lock.wait_for(lambda: len(self.running) >= count, timeout=10), self.running

    def finish_one(self) -> None:
        """The oldest running request ends on its own (max_new_tokens or EOS)."""
        with self.lock:
            rid = min(self.running, key=lambda r: self.running[r])
            self.done[rid] = "finished"
            del self.running[rid]  # its slot is free from now: a refill may take it
            self.lock.notify_all()

    def abort(self, pending) -> None:
        """The window's close: every pending rid is cut and answers."""
        with self.lock:
            for rid in pending():
                self.done.setdefault(rid, "aborted")
                self.running.pop(rid, None)
            self.lock.notify_all()


def _run_in_thread(load: SteadyLoad) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target() -> None:
        try:
            out["answers"] = load.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def test_a_steady_window_keeps_the_batch_in_flight_and_ends_at_the_first_slot_it_cannot_refill():
    engine = ScriptedEngine()
    closes = []

    def close(pending):
        closes.append(sorted(pending()))
        engine.abort(pending)

    load = SteadyLoad(6, engine.send, close, batch=3, width=3, steady=True)
    thread, out = _run_in_thread(load)
    engine.wait_running(3)
    assert engine.sent == [0, 1, 2]  # the batch, no more
    for expected in ([0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]):
        engine.finish_one()  # each finish is refilled at once from the list
        engine.wait_running(3)
        assert engine.sent == expected
    engine.finish_one()  # the list is empty: this slot cannot be refilled, the window ends
    thread.join(10)
    assert not thread.is_alive() and "error" not in out
    answers = out["answers"]
    assert [a["position"] for a in answers] == list(range(6))
    assert [a["how"] for a in answers] == ["finished"] * 4 + ["aborted"] * 2
    # One close, told exactly the two requests still in flight.
    assert len(closes) == 1 and len(closes[0]) == 2
    assert engine.peak == 3 and load.pending() == set()


def test_without_steady_every_prompt_runs_to_its_end_and_nothing_is_closed():
    engine = ScriptedEngine()
    closes = []
    load = SteadyLoad(4, engine.send, closes.append, batch=2, width=2, steady=False)
    thread, out = _run_in_thread(load)
    for _ in range(4):
        engine.wait_running(1)
        engine.finish_one()
    thread.join(10)
    assert [a["how"] for a in out["answers"]] == ["finished"] * 4 and closes == []


def test_requests_queued_beyond_the_batch_do_not_end_the_window_early():
    """Twice the batch in flight (an engine capped at the batch queues the rest): the window
    ends only when fewer than the batch remain, queued ones included."""
    engine = ScriptedEngine()
    load = SteadyLoad(4, engine.send, engine.abort, batch=2, width=4, steady=True)
    thread, out = _run_in_thread(load)
    engine.wait_running(4)
    engine.finish_one()  # 3 left in flight, list empty: still the batch running, no close
    engine.wait_running(3)
    engine.finish_one()  # 2 left: still the batch
    engine.wait_running(2)
    engine.finish_one()  # 1 left, below the batch of 2: the close cuts it
    thread.join(10)
    assert [a["how"] for a in out["answers"]] == ["finished"] * 3 + ["aborted"]


def test_the_first_error_stops_the_refills_and_is_raised_after_every_worker_returned():
    sent = []
    lock = threading.Lock()

    def send(position, rid):
        with lock:
            sent.append(position)
        if position == 1:
            raise ConnectionError("engine exited with code -9")
        return {"position": position}

    load = SteadyLoad(50, send, lambda pending: None, batch=1, width=1, steady=False)
    with pytest.raises(ConnectionError, match="code -9"):
        load.run()
    assert sent == [0, 1]  # nothing was taken after the failure
    assert load.pending() == set()  # the failed request left the in-flight set


def test_a_close_that_fails_is_the_loads_error():
    def refuse(pending):
        raise RuntimeError("the engine refused /abort_request")

    engine = ScriptedEngine()
    load = SteadyLoad(2, engine.send, refuse, batch=3, width=2, steady=True)
    thread, out = _run_in_thread(load)
    engine.wait_running(2)
    engine.finish_one()  # one in flight, below the batch, the list empty: the close runs, fails
    thread.join(0.5)
    engine.abort(lambda: set(engine.running))  # the request the refused close left running
    thread.join(10)
    assert isinstance(out.get("error"), RuntimeError)
    assert "refused /abort_request" in str(out["error"])


def test_a_prompt_without_an_answer_is_an_error_not_a_shorter_window():
    load = SteadyLoad(3, lambda p, rid: None, lambda pending: None, batch=1, width=1, steady=False)
    with pytest.raises(RuntimeError, match="3 of 3 requests got no answer"):
        load.run()


def test_width_is_the_batch_or_twice_it_on_an_engine_capped_at_the_batch():
    assert load_width(4, None, steady=True, prompts=20) == 4
    assert load_width(4, 4, steady=True, prompts=20) == 8  # the extra ones queue in the engine
    assert load_width(4, 4, steady=False, prompts=20) == 4  # warm-up, twin, re-runs: the batch
    assert load_width(4, 32, steady=True, prompts=20) == 4  # an uncapped engine would run 8
    assert load_width(4, 4, steady=True, prompts=5) == 5  # never more than the prompts
    assert load_width(0, None, steady=False, prompts=3) == 1
    with pytest.raises(ValueError, match="at least one request in flight"):
        SteadyLoad(1, lambda p, r: {}, lambda pending: None, batch=1, width=0, steady=False)


def test_request_ids_are_unique_across_threads():
    ids: list[str] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(200):
            rid = next_rid()
            with lock:
                ids.append(rid)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 800 and all(rid.startswith("se-") for rid in ids)


def test_a_queued_window_sends_its_first_wave_in_one_call_and_then_refills_one_by_one():
    """Sent one per call, the first request to arrive was admitted alone: the window opened with a
    one-row step (the quickstart's n-gram rows read 0.6-0.7 points low against the full
    workload). In one batched call the engine admits the batch in one iteration."""
    engine = ScriptedEngine()
    waves = []

    def send_wave(positions, rids):
        waves.append(list(positions))
        return engine.send_many(positions, rids)

    load = SteadyLoad(
        6, engine.send, engine.abort, batch=2, width=4, steady=True, send_wave=send_wave
    )
    assert load.wave == 2
    thread, out = _run_in_thread(load)
    engine.wait_running(4)  # the wave and two single requests
    assert waves == [[0, 1]] and sorted(engine.sent) == [0, 1, 2, 3]
    for _ in range(5):
        engine.wait_running(1)
        engine.finish_one()
    thread.join(10)
    assert not thread.is_alive() and "error" not in out, out
    assert [a["position"] for a in out["answers"]] == list(range(6))
    assert sorted(engine.sent) == list(range(6)) and engine.peak == 4
    # Without queueing (width = batch) a wave's early finishers would leave slots empty until the
    # whole call answered: one request per call, as before.
    assert (
        SteadyLoad(
            6, engine.send, engine.abort, batch=2, width=2, steady=True, send_wave=send_wave
        ).wave
        == 0
    )
