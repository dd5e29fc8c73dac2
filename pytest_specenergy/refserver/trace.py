"""The work trace: one record per forward pass, read by the modeled energy meter.

Why it is append-only, global-indexed and bounded: its section of ``docs/reference-server.md#the-work-trace``."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from dataclasses import field
from typing import Any

MAX_KEPT_STEPS = 500_000
PHASES = ("prefill", "decode", "verify", "draft")


@dataclass(frozen=True)
class TraceStep:
    """One forward pass as a GPU would see it (bytes and FLOPs at bf16)."""

    phase: str  # "prefill" | "decode" | "verify" | "draft"
    model: str  # "target" | "draft"
    rids: tuple[str, ...]
    query_tokens: tuple[int, ...]  # per row: tokens fed in this step
    context_lens: tuple[int, ...]  # per row: valid tokens already in context before this step
    weight_bytes: int
    kv_bytes: int
    flops: int
    wall_s: float
    experts_touched: tuple[int, ...] | None = None  # per layer, MoE models only

    def to_json(self) -> dict[str, Any]:
        """The JSON record served by ``/work_trace``."""
        # every field in declaration order, tuples as lists; experts_touched only for an MoE model.
        # ``vars``, not ``dataclasses.fields``: /work_trace serves up to MAX_KEPT_STEPS of these per
        # read (5x faster).
        return {
            key: list(v) if isinstance(v, tuple) else v
            for key, v in vars(self).items()
            if v is not None or key != "experts_touched"
        }


@dataclass
class WorkTrace:
    """Thread-safe, append-only list of :class:`TraceStep` with a global cursor."""

    _steps: list[TraceStep] = field(default_factory=list)
    _base: int = 0  # global index of _steps[0]
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def append(self, step: TraceStep) -> None:
        """Record one step."""
        if step.phase not in PHASES:
            raise ValueError(f"unknown phase {step.phase!r}; expected one of {PHASES}")
        with self._lock:
            self._steps.append(step)
            if len(self._steps) > MAX_KEPT_STEPS:
                drop = len(self._steps) - MAX_KEPT_STEPS
                del self._steps[:drop]
                self._base += drop

    def __len__(self) -> int:
        """The global index of the next step (not the number kept)."""
        with self._lock:
            return self._base + len(self._steps)

    def read(self, start: int = 0) -> tuple[int, list[TraceStep]]:
        """Steps ``start..next-1`` and ``next``; steps already dropped are silently skipped."""
        with self._lock:
            nxt = self._base + len(self._steps)
            lo = max(0, int(start) - self._base)
            return nxt, list(self._steps[lo:])
