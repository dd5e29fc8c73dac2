"""A metered window of one arm's requests, and the decode-only figures of two: a full window (the
steady state) minus its prefill-only twin (the same prompts' prefill forwards), per loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from pytest_specenergy import metrics
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.document import SampleWindow
from pytest_specenergy.document import StepRecord
from pytest_specenergy.document import WindowFacts
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.measure.checks import MAX_CONCURRENCY_GAP_SHARE
from pytest_specenergy.measure.prefill_groups import Groups
from pytest_specenergy.meters.base import EnergyWindow

#: The ``grouping`` of a prefill-only window priced from the full window's prefill steps rather than
#: run.
PRICED = "priced from the full window's prefill steps"


@dataclass(frozen=True)
class Window:
    """One metered window: the energy reading and every loop's per-prompt counters."""

    energy: EnergyWindow
    loops: int
    #: Per loop, per prompt (pool order).
    loop_counters: tuple[tuple[RequestCounters, ...], ...]
    loop_outputs: tuple[tuple[tuple[int, ...], ...], ...]
    #: What the engine ran during the window (its step record between two ``/server_info``).
    concurrency: StepRecord
    #: Pool indices of the requested prompts, in window order (the prefill window's subset).
    indices: tuple[int, ...] = ()
    #: A replay engine's verify steps in this window that had no recorded draft to replay.
    replay_misses: int = 0
    #: First loop, per position: when its request was sent (monotonic seconds; None: unsent).
    sent: tuple[float | None, ...] = ()
    #: Wall seconds of the first loop, on the client's clock.
    wall_s: float = 0.0
    #: A prefill-only window's replayed groups (positions) and where the grouping came from.
    groups: Groups = ()
    grouping: str = ""

    @property
    def counters(self) -> tuple[RequestCounters, ...]:
        """The first loop's counters (request timing, finish reasons)."""
        return self.loop_counters[0]

    @property
    def tokens_per_loop(self) -> float:
        """Completion tokens per loop, averaged over every loop like the energy is."""
        return (
            sum(sum(c.completion_tokens for c in loop) for loop in self.loop_counters) / self.loops
        )

    @property
    def decode_tokens_per_loop(self) -> float:
        """Tokens after each request's first (which prefill makes), per loop, over every loop."""
        return (
            sum(sum(max(c.completion_tokens - 1, 0) for c in loop) for loop in self.loop_counters)
            / self.loops
        )

    def prefilled(self, loop: int = 0) -> tuple[int, ...]:
        """Positions whose request was prefilled in ``loop`` (a request aborted in the queue was
        not)."""
        return tuple(i for i, c in enumerate(self.loop_counters[loop]) if c.completion_tokens >= 1)

    def aborted(self, loop: int = 0) -> tuple[int, ...]:
        """Positions whose request the window's end cut short in ``loop``."""
        return tuple(i for i, c in enumerate(self.loop_counters[loop]) if c.finish_type == "abort")

    @property
    def loops_agree(self) -> bool:
        """Whether every loop made the same output for every prompt it completed."""
        first = self.loop_outputs[0]
        cut = [set(self.aborted(n)) for n in range(self.loops)]
        return all(
            out == first[i]
            for n, loop in enumerate(self.loop_outputs)
            for i, out in enumerate(loop)
            if i not in cut[n] and i not in cut[0]
        )

    def request_seconds(self, index: int) -> float | None:
        """Active seconds of prompt ``index`` in the first loop (meter's clock if it has one)."""
        known = self.energy.request_seconds
        return (
            known.get(self.counters[index].rid)
            if known is not None
            else self.counters[index].e2e_latency
        )


def disturbed_mean(concurrency: StepRecord) -> float | None:
    """A full window's mean rows per decode step when it fell more than
    ``MAX_CONCURRENCY_GAP_SHARE`` of its own peak below that peak, else None (also for a window
    without a step record).

    A window's edges are where a loaded host shows: on 2 shared cores a real SGLang A/A window of
    188 decode steps, every one at 4 rows when quiet, ran 14 steps at 1 row and 4 at 3 (mean 3.76),
    enough to fail ``concurrency-differs`` against the other arm although nothing differed but the
    host. Such a window is run again (the arm measurer decides how often, and which it keeps). The
    rule compares the window with its own peak, not with the batch: an engine that admits fewer
    than the batch keeps its own lower peak, is not run again, and the checks still see it."""
    mean, peak = concurrency.mean_running, concurrency.max_running
    return (
        None
        if mean is None or not peak or mean >= (1 - MAX_CONCURRENCY_GAP_SHARE) * peak
        else float(mean)
    )


def decode_sample(prefill: Window, full: Window) -> RepeatSample:
    """Decode-only figures: the full window minus the prefill-only window, per loop."""
    joules = full.energy.joules / full.loops - prefill.energy.joules / prefill.loops
    seconds = full.energy.seconds / full.loops - prefill.energy.seconds / prefill.loops
    tokens = full.decode_tokens_per_loop
    tbts = []
    decode_known = full.energy.request_decode_seconds
    for at_prefill, index in enumerate(full.prefilled()):
        counter = full.counters[index]
        if decode_known is not None:  # the meter timed the request's decode steps themselves
            decode_s = decode_known.get(counter.rid)
        elif counter.decode_seconds is not None:
            # The engine timed them (the reference server's meta_info.decode_seconds): the request's
            # own decode, whatever the twin's prefill cost (issue 21 item 5).
            decode_s = counter.decode_seconds
        else:  # the request's time minus its prefill-only twin's (e2e latency under a board meter)
            full_s, prefill_s = full.request_seconds(index), prefill.request_seconds(at_prefill)
            decode_s = None if full_s is None or prefill_s is None else full_s - prefill_s
        # A decode time that is not positive was not measured (a prefill-only twin that queued
        # longer than the request itself): left out, never reported as a figure.
        tbts.append(
            metrics.request_tbt_ms(decode_s, counter.completion_tokens)
            if decode_s is not None and decode_s > 0
            else None
        )
    return RepeatSample(
        decode_joules=joules,
        decode_seconds=seconds,
        decode_tokens=int(tokens) if tokens == int(tokens) else tokens,
        tbt_ms=metrics.mean_tbt_ms(tbts),
        verify_steps=per_loop_total(full, "spec_verify_ct"),
        correct_drafts=per_loop_total(full, "spec_num_correct_drafts"),
        proposed_drafts=per_loop_total(full, "spec_num_proposed_drafts"),
        loops=full.loops,
        window=SampleWindow(full=window_facts(full), prefill=window_facts(prefill)),
        accept_lengths=request_accept_lengths(full.counters),
    )


def request_accept_lengths(counters: Sequence[RequestCounters]) -> tuple[float, ...] | None:
    """Per request that verified, committed decode tokens per verify step (its first token is the
    prefill's); None when no request carries speculative counters (a baseline arm). The first loop
    only: later loops repeat the same prompts, so they add no independent samples."""
    if all(c.spec_verify_ct is None for c in counters):
        return None
    return tuple(
        (c.completion_tokens - 1) / c.spec_verify_ct
        for c in counters
        if c.spec_verify_ct is not None and c.spec_verify_ct > 0
    )


def per_loop_total(window: Window, field_name: str) -> int | float | None:
    """A speculative counter's total per loop (mean over loops, like the energy); None, never a
    silent 0, if a request that decoded lacks it (one that finished in its prefill has none in
    SGLang and adds nothing)."""
    totals = []
    for loop in window.loop_counters:
        values = [
            getattr(c, field_name)
            for c in loop
            if c.completion_tokens > 1 or getattr(c, field_name) is not None
        ]
        if not loop or None in values:
            return None
        totals.append(sum(int(v) for v in values))
    mean = sum(totals) / len(totals)
    return int(mean) if mean == int(mean) else mean


def window_facts(window: Window) -> WindowFacts:
    """What the run document keeps of one window: its reading, loops, requests and how they ran
    (only the reading for a priced twin, which ran no requests)."""
    energy = window.energy
    facts = WindowFacts(
        joules=energy.joules,
        seconds=energy.seconds,
        loops=window.loops,
        requests=len(window.indices),
        source=energy.source,
        details=dict(energy.details),
    )
    if window.grouping == PRICED:  # no run: no requests' counters, only the priced steps
        return dataclasses.replace(facts, grouping=PRICED)
    return dataclasses.replace(
        facts,
        tokens_per_loop=window.tokens_per_loop,
        prefilled=tuple(len(window.prefilled(n)) for n in range(window.loops)),
        aborted=tuple(len(window.aborted(n)) for n in range(window.loops)),
        concurrency=window.concurrency,
        groups=tuple(len(g) for g in window.groups) if window.grouping else None,
        grouping=window.grouping or None,
    )
