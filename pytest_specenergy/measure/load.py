"""The steady-state load generator: a list of prompts sent to one engine with a fixed number of
requests in flight, each slot refilled as its request answers, until the list runs dry.

It knows nothing of HTTP or of meters: :class:`SteadyLoad` calls ``send(position, rid)`` for each
prompt (the arm builds and sends the request) and, at a steady-state window's end,
``close(pending)`` with the rids still in flight (the arm aborts them). So the taking of prompts,
the refills, the in-flight set, the end rule and the errors are one object with one lock, tested
without an engine (``tests/unit/measure/test_load.py``).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any
from typing import Callable

from pytest_specenergy.plan.window import window_ends

#: One answer of the engine (a ``/generate`` item: ``output_ids`` and ``meta_info``).
Answer = dict[str, Any]
#: ``send(position, rid)``: send the prompt at ``position`` of the list under request id ``rid``
#: and return its answer; it runs in the worker threads, several at once.
Send = Callable[[int, str], Answer]
#: ``send_wave(positions, rids)``: send the prompts at ``positions`` in one batched call, under
#: ``rids``, and return their answers in order.
SendWave = Callable[[list[int], list[str]], list[Answer]]
#: ``close(pending)``: end a steady-state window by cutting every request ``pending()`` still lists
#: (sent, not answered), returning once each has answered.
Close = Callable[[Callable[[], set[str]]], Any]

_rids = itertools.count()
_rids_lock = threading.Lock()


def next_rid() -> str:
    """A request id unique in this process (``se-0``, ``se-1``, ...): the engine's abort by rid
    and the meters' per-request times key on it."""
    with _rids_lock:
        return f"se-{next(_rids)}"


def load_width(batch: int, cap: int | None, steady: bool, prompts: int) -> int:
    """How many requests to keep in flight: the batch, or twice the batch in a steady-state window
    on an engine that admits exactly the batch (``cap == batch``), never more than the prompts.

    Why twice: the extra requests wait in the engine's own queue and are admitted in the very
    iteration a slot frees, where a refill sent on the answer would leave its slot empty for a
    client round trip. The window still closes with nothing queued: it ends when fewer than the
    batch are in flight, queued ones included (:class:`SteadyLoad`)."""
    batch = max(batch, 1)
    return max(1, min(2 * batch if steady and cap == batch else batch, prompts))


@dataclass(frozen=True)
class _Request:
    """A prompt taken from the list, registered in flight under ``rid`` before it is sent."""

    position: int
    rid: str


#: What a worker is told when the list is empty: stop, or end the window first (:meth:`_take`).
_STOP = "stop"
_CLOSE = "close"


class SteadyLoad:
    """Sends ``count`` prompts through ``send``, ``width`` at a time, each worker refilling its
    slot as its request answers.

    With ``steady`` the load is a steady-state window, ended by ``plan/window.py``'s rule
    (:func:`~pytest_specenergy.plan.window.window_ends`): once the ``count`` window prompts are
    sent, up to ``fillers`` more (positions ``count`` on) keep the batch in flight until the last
    window prompt has answered; that answer ends the window, calling ``close`` with the rids still
    in flight (fillers). Where the fillers run out first (or there are none), the first answer
    that leaves fewer than ``batch`` in flight ends it (the rest of the window would be a drain at
    falling concurrency, which the declared batch does not describe). Without ``steady`` every
    prompt runs to its end.

    With ``send_wave``, a steady window that queues requests in the engine (``width`` at least twice
    the batch) sends its first ``batch`` prompts in one batched call, so the engine admits them in
    one iteration: sent one per call, the first to arrive was admitted alone and the window opened
    with a one-row step, a ramp a constant-batch truth does not have (the quickstart's n-gram rows
    read 0.6-0.7 points low against the full workload). The wave's slots are refilled from the
    engine's queue as its rows finish; once it has answered, its worker is ``batch`` workers again.

    The first error (of ``send`` or ``close``) stops the refills; :meth:`run` raises it once every
    worker has returned. A prompt that got no answer is an error too: a window never silently
    measures fewer requests than it sent."""

    def __init__(
        self,
        count: int,
        send: Send,
        close: Close,
        *,
        batch: int,
        width: int,
        steady: bool,
        fillers: int = 0,
        send_wave: SendWave | None = None,
    ) -> None:
        if width < 1:
            raise ValueError(f"a load keeps at least one request in flight, got width={width}")
        if fillers < 0 or (fillers and not steady):
            raise ValueError(
                f"fillers keep a steady window's batch in flight: got fillers={fillers} with "
                f"steady={steady}; expected 0, or a number >= 0 with steady=True"
            )
        self.count = count
        self.fillers = fillers
        self.batch = max(batch, 1)
        self.width = width
        self.steady = steady
        self._send = send
        self._close = close
        self._lock = threading.Lock()
        self._positions = iter(range(count + fillers))
        self._sent = 0
        #: Window prompts (positions below ``count``) not answered yet.
        self._unanswered = count
        #: The rid of every request sent (or about to be) and not answered yet.
        self._in_flight: set[str] = set()
        self._ended = False
        self._errors: list[BaseException] = []
        self._answers: list[Answer | None] = [None] * (count + fillers)
        self._send_wave = send_wave
        queued = steady and width >= 2 * self.batch
        #: Prompts the first wave sends in one call (0: none).
        self.wave = self.batch if send_wave and queued and 1 < self.batch <= count else 0
        self._threads: list[threading.Thread] = []

    def pending(self) -> set[str]:
        """The rids sent and not answered yet (what a close must cut)."""
        with self._lock:
            return set(self._in_flight)

    def run(self) -> list[Answer]:
        """Every sent prompt's answer in position order: the ``count`` window prompts, then the
        fillers sent (the first ones; those never needed were never sent). Raises the first error
        of any worker."""
        width = min(self.width, max(self.count + self.fillers, 1))
        if width == 1:
            self._work()
        else:
            if self.wave:
                self._spawn(self._work_wave)
            for _ in range(width - (self.wave or 1) + (0 if self.wave else 1)):
                self._spawn(self._work)
            joined = 0
            while True:  # a wave's worker spawns more workers once it has answered
                with self._lock:
                    if joined == len(self._threads):
                        break
                    thread = self._threads[joined]
                thread.join()
                joined += 1
        if self._errors:
            raise self._errors[0]
        sent = self._answers[: self._sent]
        missing = sum(1 for answer in sent if answer is None)
        if missing:
            raise RuntimeError(f"{missing} of {self._sent} requests got no answer")
        return sent  # type: ignore[return-value]

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(
            target=target, name=f"specenergy-req-{len(self._threads)}", daemon=True
        )
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _work_wave(self) -> None:
        """The first wave: ``wave`` prompts in one call; then its slots' refills, as workers."""
        with self._lock:
            requests = []
            for _ in range(self.wave):
                position = next(self._positions)
                requests.append(_Request(position, next_rid()))
                self._in_flight.add(requests[-1].rid)
                self._sent += 1
        assert self._send_wave is not None
        try:
            answers = self._send_wave([r.position for r in requests], [r.rid for r in requests])
            if len(answers) != len(requests):
                raise RuntimeError(
                    f"a batched call of {len(requests)} prompts got {len(answers)} answers"
                )
        except BaseException as exc:  # re-raised in the caller's thread by run()
            self._keep(exc)
            return
        finally:
            with self._lock:
                self._in_flight.difference_update(r.rid for r in requests)
        for request, answer in zip(requests, answers):
            self._answers[request.position] = answer
        if any([self._answered(r) == _CLOSE for r in requests]):
            self._close_window()
            return
        for _ in range(self.wave - 1):
            self._spawn(self._work)
        self._work()

    def _take(self) -> _Request | str:
        """The next prompt, registered in flight; or, with the list empty or the window ended,
        :data:`_STOP`."""
        with self._lock:
            if self._errors or self._ended:
                return _STOP
            position = next(self._positions, None)
            if position is None:
                return _STOP
            # Registered before the request is sent, so a close that comes before it reaches
            # the engine still knows to abort it.
            request = _Request(position, next_rid())
            self._in_flight.add(request.rid)
            self._sent += 1
            return request

    def _work(self) -> None:
        """One worker: take a prompt, send it, keep its answer, until told to stop; the worker
        whose answer ends the window closes it."""
        while True:
            step = self._take()
            if not isinstance(step, _Request):
                return
            if not self._send_one(step):
                return
            if self._answered(step) == _CLOSE:
                self._close_window()
                return

    def _answered(self, request: _Request) -> str:
        """After ``request``'s answer: whether it ends the window (:data:`_CLOSE`)."""
        with self._lock:
            if request.position < self.count:
                self._unanswered -= 1
            end_now = (
                self.steady
                and not self._ended
                and bool(self._in_flight)
                and window_ends(
                    self._sent,
                    len(self._in_flight),
                    self.batch,
                    self.count + self.fillers,
                    self._unanswered if self.fillers else None,
                )
            )
            self._ended = self._ended or end_now
            return _CLOSE if end_now else _STOP

    def _send_one(self, request: _Request) -> bool:
        """Send one request and keep its answer; False if it failed (the error is kept)."""
        try:
            answer = self._send(request.position, request.rid)
        except BaseException as exc:  # re-raised in the caller's thread by run()
            self._keep(exc)
            return False
        finally:
            # Answered or failed, it is no longer in flight: a close does not wait for it.
            with self._lock:
                self._in_flight.discard(request.rid)
        self._answers[request.position] = answer
        return True

    def _close_window(self) -> None:
        """End the window: ``close`` cuts what is still in flight (its error is kept)."""
        try:
            self._close(self.pending)
        except BaseException as exc:
            self._keep(exc)

    def _keep(self, exc: BaseException) -> None:
        with self._lock:
            self._errors.append(exc)
