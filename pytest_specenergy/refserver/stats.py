"""Engine counters for ``/server_info``: what SGLang reports, plus cumulative concurrency counters.

Which counters ``flush_cache`` resets and which never are, and why: its section of
``docs/reference-server.md#engine-counters``."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field
from typing import Any


@dataclass
class SinceFlush:
    """Counters that ``flush_cache`` resets (SGLang's ``internal_states``)."""

    step_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    accept_tokens: int = 0  # tokens committed by verify steps, summed over rows
    verify_row_steps: int = 0  # verify steps, summed over rows
    min_running: int | None = None
    max_running: int | None = None


@dataclass
class Lifetime:
    """Counters since the engine started (never reset), named and ordered as in
    ``internal_states[0]``."""

    decode_steps: int = 0
    decode_row_steps: int = 0
    decode_steps_by_running: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    prefill_steps: int = 0
    prefill_rows: int = 0
    num_requests_finished: int = 0


class EngineStats:
    """Both counter sets; the scheduler thread writes them, HTTP threads read them (hence the lock)."""

    def __init__(self) -> None:
        self.flushable = SinceFlush()
        self.lifetime = Lifetime()
        self._lock = threading.Lock()

    def flush(self) -> None:
        """Reset what SGLang's ``flush_cache`` resets."""
        with self._lock:
            self.flushable = SinceFlush()

    def prefill(self, rows: int) -> None:
        """One prefill forward of ``rows`` joining requests."""
        with self._lock:
            self.lifetime.prefill_steps += 1
            self.lifetime.prefill_rows += rows

    def finished(self, rows: int) -> None:
        """``rows`` requests finished."""
        with self._lock:
            self.lifetime.num_requests_finished += rows

    def decode_step(self, running: int, seconds: float) -> None:
        """One decode or verify step over ``running`` rows."""
        with self._lock:
            f, life = self.flushable, self.lifetime
            f.step_times[str(running)].append(seconds)
            f.min_running = running if f.min_running is None else min(f.min_running, running)
            f.max_running = running if f.max_running is None else max(f.max_running, running)
            life.decode_steps += 1
            life.decode_row_steps += running
            life.decode_steps_by_running[running] += 1

    def verified(self, committed: int) -> None:
        """One row's verify step committed ``committed`` tokens."""
        with self._lock:
            self.flushable.accept_tokens += committed
            self.flushable.verify_row_steps += 1

    def avg_spec_accept_length(self) -> float | None:
        """Committed tokens per request per verify step since the last flush (None before any)."""
        f = self.flushable
        return f.accept_tokens / f.verify_row_steps if f.verify_row_steps else None

    def to_json(self) -> dict[str, Any]:
        """The counters' part of ``internal_states[0]``."""
        with self._lock:
            f, life = self.flushable, self.lifetime
            out: dict[str, Any] = {
                "step_time_dict": {key: list(v) for key, v in f.step_times.items()},
                "min_running": f.min_running,
                "max_running": f.max_running,
                **vars(life),
            }
            out["decode_steps_by_running"] = {
                str(k): v for k, v in sorted(life.decode_steps_by_running.items())
            }
            avg = self.avg_spec_accept_length()
        if avg is not None:
            out["avg_spec_accept_length"] = avg
        return out
