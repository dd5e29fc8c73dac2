"""Prints where a suite's wall time goes, per case and in total: engine starts, warm-up,
draft recording, measured windows (full runs and their prefill-only twins - none under the
modeled meter, which prices the full run's own prefill steps - inside the meter's
start/stop, and the flushes and /server_info reads around them), re-generating the prompts a
window's end cut short, the equivalence and coherence passes, engine stops, and the rest
(pytest, collection, the plugin's own bookkeeping, the report).

It runs the suite in this process (``pytest.main``) with a small plugin that wraps the
measurer's own methods with timers; nothing is simulated and the suite's checks all run. Each
bucket is the union of its intervals, so engines started side by side by several threads
count once, at their wall time. The share of wall time spent inside measured windows is the
figure to raise: everything else is harness.

Usage: .venv/bin/python benchmarks/harness_time.py [SUITE] [PYTEST ARGS...]
       (default SUITE: example_suites/quickstart)
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Buckets in print order: (key, column heading).
BUCKETS = (
    ("start", "engine starts"),
    ("warmup", "warm-up"),
    ("record", "recording drafts"),
    ("full", "full windows (metered)"),
    ("prefill", "prefill twins (metered)"),
    ("window_io", "flush + server_info + pricing"),
    ("complete", "re-generating cut prompts"),
    ("equivalence", "equivalence pass"),
    ("coherence", "coherence pass"),
    ("stop", "engine stops"),
)


class HarnessClock:
    """A pytest plugin timing the measurer's steps, attributed to the running test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: (case, bucket) -> list of (start, end) intervals, perf_counter seconds.
        self.intervals: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        self.case_wall: dict[str, float] = {}
        self.current = "(session)"
        self.local = threading.local()
        self.started = self.finished = 0.0
        self._undo: list[Callable[[], None]] = []

    def add(self, bucket: str, start: float, end: float) -> None:
        with self.lock:
            self.intervals[(self.current, bucket)].append((start, end))

    def wrap(self, owner: Any, name: str, bucket: str | Callable[..., str]) -> None:
        """Replace ``owner.name`` by a timed version (restored when the session ends)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            key = bucket(*args, **kwargs) if callable(bucket) else bucket
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(key, start, time.perf_counter())

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        from pytest_specenergy.engines import launch
        from pytest_specenergy.measure import arm
        from pytest_specenergy.measure import pairs
        from pytest_specenergy.measure import results
        from pytest_specenergy.meters import modeled

        clock = self
        self.wrap(launch.ServerProcess, "start", "start")
        self.wrap(launch.ServerProcess, "stop", "stop")
        self.wrap(arm.ArmMeasurer, "warm_up", "warmup")
        self.wrap(arm.ArmMeasurer, "record_drafts", "record")
        self.wrap(arm.ArmMeasurer, "_complete", "complete")
        self.wrap(results, "compare_outputs", "equivalence")
        self.wrap(pairs, "measure_coherence", "coherence")

        # A window: everything in ArmMeasurer._window is "window_io" except the stretch from
        # the meter's start returning to its stop being called, which is the metered window.
        original_window = arm.ArmMeasurer._window

        def window(
            measurer: Any, sampling: dict[str, Any], indices: Any, steady: bool, **kwargs: Any
        ) -> Any:
            clock.local.kind = "full" if steady else "prefill"
            clock.local.opened = None
            start = time.perf_counter()
            try:
                return original_window(measurer, sampling, indices, steady, **kwargs)
            finally:
                end = time.perf_counter()
                opened, closed = clock.local.opened, getattr(clock.local, "closed", None)
                if opened is not None and closed is not None:
                    clock.add(clock.local.kind, opened, closed)
                    clock.add("window_io", start, opened)
                    clock.add("window_io", closed, end)
                else:
                    clock.add("window_io", start, end)
                clock.local.opened = clock.local.closed = None

        arm.ArmMeasurer._window = window
        self._undo.append(lambda: setattr(arm.ArmMeasurer, "_window", original_window))
        meters = [modeled.ModeledMeter]
        try:
            from pytest_specenergy.meters import nvml

            meters.append(nvml.NvmlMeter)
        except ImportError:
            pass
        for meter in meters:
            self._wrap_meter(meter)

    def _wrap_meter(self, meter: type) -> None:
        clock = self
        start, stop = meter.start, meter.stop

        def timed_start(self_: Any, engine: Any) -> Any:
            token = start(self_, engine)
            clock.local.opened = time.perf_counter()
            return token

        def timed_stop(self_: Any, token: Any) -> Any:
            clock.local.closed = time.perf_counter()
            return stop(self_, token)

        meter.start, meter.stop = timed_start, timed_stop
        self._undo.append(lambda: (setattr(meter, "start", start), setattr(meter, "stop", stop)))

    # -- pytest hooks ------------------------------------------------------------------------
    def pytest_configure(self, config: pytest.Config) -> None:
        self.started = time.perf_counter()
        self.install()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Any:
        self.current = item.nodeid.split("::", 1)[-1]
        start = time.perf_counter()
        yield
        self.case_wall[self.current] = time.perf_counter() - start
        self.current = "(session end)"

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.finished = time.perf_counter()
        for undo in reversed(self._undo):
            undo()


def union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def report(clock: HarnessClock) -> None:
    wall = clock.finished - clock.started
    cases = list(clock.case_wall) + [
        c for c in ("(session)", "(session end)") if any(k[0] == c for k in clock.intervals)
    ]
    head = ["case", "wall"] + [key for key, _ in BUCKETS] + ["other", "in windows"]
    rows = []
    totals = defaultdict(float)
    for case in cases:
        case_wall = clock.case_wall.get(case)
        spent = {key: union(clock.intervals.get((case, key), [])) for key, _ in BUCKETS}
        everything = union(
            [iv for (c, _), ivs in clock.intervals.items() if c == case for iv in ivs]
        )
        for key, value in spent.items():
            totals[key] += value
        row = [case, "-" if case_wall is None else f"{case_wall:.1f}"]
        row += [f"{spent[key]:.1f}" if spent[key] else "." for key, _ in BUCKETS]
        if case_wall is not None:
            row.append(f"{case_wall - everything:.1f}")
            row.append(
                f"{(spent['full'] + spent['prefill']) / case_wall:.0%}" if case_wall else "-"
            )
        else:
            row += ["", ""]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print("per case (seconds; '.' = none):")
    print(
        "  "
        + "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))
        )
    )
    for row in rows:
        print(
            "  "
            + "  ".join(
                str(v).ljust(w) if i == 0 else str(v).rjust(w)
                for i, (v, w) in enumerate(zip(row, widths))
            )
        )
    print()
    every = union([iv for ivs in clock.intervals.values() for iv in ivs])
    print(f"session wall time: {wall:.1f} s ({len(clock.case_wall)} cases)")
    for key, label in BUCKETS:
        print(f"  {label:<32} {totals[key]:7.1f} s  {totals[key] / wall:5.1%}")
    other = wall - every
    print(f"  {'other (pytest, plugin, report)':<32} {other:7.1f} s  {other / wall:5.1%}")
    inside = totals["full"] + totals["prefill"]
    print(
        f"share of wall time inside measured windows: {inside / wall:.1%} (full runs "
        f"{totals['full'] / wall:.1%}, prefill-only twins {totals['prefill'] / wall:.1%})"
    )


def main(argv: list[str]) -> int:
    suite = argv[0] if argv and not argv[0].startswith("-") else "example_suites/quickstart"
    extra = argv[1:] if argv and not argv[0].startswith("-") else argv
    clock = HarnessClock()
    code = pytest.main([suite, "-q", "-p", "no:cacheprovider", *extra], plugins=[clock])
    print()
    report(clock)
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
