"""Continuous batching, as SGLang's scheduler does it: one running batch that requests join and
leave.

The iteration, aborts and failure handling: its section of ``docs/reference-server.md#continuous-batching``."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import torch

from .drafters import Drafter
from .kv import BatchKV
from .records import FinishReason
from .rows import Row
from .stats import EngineStats

log = logging.getLogger("pytest_specenergy.refserver")

COMPACT_SLACK = 32  # holes per row tolerated before the target cache is compacted


class Stepper(Protocol):
    """The forward passes the scheduler drives, each over the rows it names
    (:class:`.engine.ReferenceEngine` implements them; a test may drive the scheduler with its
    own)."""

    def new_kv(self) -> BatchKV:
        """An empty target cache."""

    def new_drafter(self) -> Drafter | None:
        """A drafter with no rows (None for a plain engine)."""

    def prefill(self, rows: Sequence[Row]) -> BatchKV:
        """Prefill ``rows`` in a fresh cache and commit each row's first output token."""

    def decode(self, rows: Sequence[Row], kv: BatchKV) -> None:
        """One plain decode step over ``rows``."""

    def verify(self, rows: Sequence[Row], kv: BatchKV, drafter: Drafter) -> None:
        """One draft + verify step over ``rows``."""


class Scheduler:
    """The queue, the running batch and the thread that advances it."""

    def __init__(
        self, stepper: Stepper, stats: EngineStats, max_running: int, lock: threading.Lock
    ) -> None:
        self.stepper = stepper
        self.stats = stats
        self.max_running = max_running
        self.lock = lock  # held for a whole iteration; flush_cache takes it between iterations
        self._cv = threading.Condition()
        self._queue: deque[Row] = deque()
        self.running: list[Row] = []
        self.kv = stepper.new_kv()
        self.drafter = stepper.new_drafter()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._admitting: list[Row] = []  # popped from the queue, not yet in the running batch
        self.prefill_forwards = 0  # numbers each admission's prefill (meta_info.prefill_forward)

    # ------------------------------------------------------------------------------ callers
    def submit(self, rows: Sequence[Row]) -> None:
        """Queue ``rows``; they join the running batch at the next iteration (FIFO)."""
        with self._cv:
            if self._stop:
                raise RuntimeError("the engine is closed")
            self._queue.extend(rows)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="refserver-scheduler", daemon=True
                )
                self._thread.start()
            self._cv.notify_all()

    def abort(self, rid: str | None = None) -> None:
        """Abort request ``rid`` (None: every request; an unknown rid is ignored, as SGLang does) at
        the next iteration: rows queued, being admitted or running now get a flag each (why:
        ``docs/reference-server.md#continuous-batching``)."""
        with self._cv:
            for row in [*self.running, *self._admitting, *self._queue]:
                if (rid is None or row.rid == rid) and row.finish is None:
                    row.abort_requested = True
            self._cv.notify_all()

    def set_max_running(self, cap: int) -> None:
        """Admit while fewer than ``cap`` rows run, from the next iteration on; rows already
        running above a lowered cap finish as they are."""
        with self._cv:
            self.max_running = cap
            self._cv.notify_all()

    @property
    def num_waiting(self) -> int:
        """Requests queued, not yet admitted."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """Whether any request is queued or running."""
        return bool(self._queue or self.running)

    def close(self) -> None:
        """Stop the thread after the current iteration; queued requests fail."""
        with self._cv:
            self._stop = True
            waiting = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        self._fail(waiting, RuntimeError("the engine was closed"))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    # ------------------------------------------------------------------------------- thread
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._queue and not self.running:
                    self._cv.wait()
                if self._stop:
                    return
                aborted = self._take_aborted()
                room = self.max_running - len(self.running)
                admit = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
                self._admitting = admit
            with self.lock:
                try:
                    if aborted:
                        self._drop_finished()
                    self._iteration(admit)
                except BaseException as exc:  # noqa: BLE001 - the callers get the error, the engine goes on
                    log.exception(
                        "engine iteration failed; failing %d request(s)",
                        len(self.running) + len(admit),
                    )
                    self._reset(admit, exc)

    def _take_aborted(self) -> bool:
        """Finish the marked rows (caller holds ``_cv``); queued ones go at once. True if any ran."""
        running = [r for r in self.running if r.abort_requested and r.finish is None]
        queued = [r for r in self._queue if r.abort_requested]
        now = time.perf_counter()
        for row in running + queued:
            row.finish = FinishReason("abort", message="Abort requested by /abort_request.")
            row.finish_time = now
        if queued:  # the stats lock is taken only when a row goes (this runs every iteration)
            self._queue = deque(r for r in self._queue if not r.abort_requested)
            self._finished(queued)
        return bool(running)

    @torch.inference_mode()
    def _iteration(self, admit: list[Row]) -> None:
        if admit:
            self.prefill_forwards += 1
            entered = time.perf_counter()
            for row in admit:
                row.prefill_forward = self.prefill_forwards
                row.forward_entry_time = entered
            fresh = self.stepper.prefill(admit)
            self.stats.prefill(len(admit))
            if self.drafter is not None:
                self.drafter.join(admit)
            # After the draft model's prefill too: SGLang runs it inside the same forward batch
            # (its draft extend) and stamps the end of prefill when that batch's result is read.
            prefilled = time.perf_counter()
            for row in admit:
                row.prefill_finished_time = prefilled
            self.kv.merge(fresh)
            self.running.extend(admit)
            self._drop_finished()
        if not self.running:
            return
        t0 = time.perf_counter()
        if self.drafter is None:
            self.stepper.decode(self.running, self.kv)
        else:
            self.stepper.verify(self.running, self.kv, self.drafter)
        spent = time.perf_counter() - t0
        self.stats.decode_step(len(self.running), spent)
        for row in self.running:
            row.decode_s += spent
        self._drop_finished()
        self.kv.compact_if_needed(COMPACT_SLACK)

    def _drop_finished(self) -> None:
        keep = [i for i, r in enumerate(self.running) if r.finish is None]
        if len(keep) == len(self.running):
            return
        done = [r for r in self.running if r.finish is not None]
        self.kv.select_rows(keep)
        if self.drafter is not None:
            self.drafter.select_rows(keep)
        self.running = [self.running[i] for i in keep]
        if not self.running:
            self.kv = self.stepper.new_kv()  # drop the emptied tensors (and any leftover slots)
        self._finished(done)

    def _finished(self, rows: Sequence[Row]) -> None:
        self.stats.finished(len(rows))
        for row in rows:
            if row.ticket is not None:
                row.ticket.row_finished()

    def _reset(self, admit: list[Row], exc: BaseException) -> None:
        failed = self.running + [r for r in admit if r not in self.running]
        self.running = []
        self.kv = self.stepper.new_kv()
        self.drafter = self.stepper.new_drafter()
        tickets = {id(r.ticket) for r in failed if r.ticket is not None}
        with self._cv:  # queued rows of a failed call would run for nobody
            self._queue = deque(r for r in self._queue if id(r.ticket) not in tickets)
        self._fail(failed, exc)

    @staticmethod
    def _fail(rows: Sequence[Row], exc: BaseException) -> None:
        for ticket in {id(r.ticket): r.ticket for r in rows if r.ticket is not None}.values():
            ticket.fail(exc)
