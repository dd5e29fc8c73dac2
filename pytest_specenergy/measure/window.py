"""A metered window of one arm's requests, and the decode-only figures of two: a full window (the
steady state) minus its prefill-only twin (the same prompts' prefill forwards), per loop, weighed
to the window's own prompts where fillers kept its batch (``plan/window.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from typing import Sequence

from pytest_specenergy import metrics
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.document import RetractionFacts
from pytest_specenergy.document import SampleWindow
from pytest_specenergy.document import StepRecord
from pytest_specenergy.document import WindowFacts
from pytest_specenergy.engines import retractions
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.engines.meta_info import parse_meta_info
from pytest_specenergy.engines.prompts import Prompt
from pytest_specenergy.measure.checks import MAX_CONCURRENCY_GAP_SHARE
from pytest_specenergy.measure.prefill_groups import Groups
from pytest_specenergy.meters.base import EnergyWindow

#: The ``grouping`` of a prefill-only window priced from the full window's prefill steps rather than
#: run.
PRICED = "priced from the full window's prefill steps"


def counters_of(answer: dict[str, Any], prompt: Prompt | None = None) -> RequestCounters:
    """One answer's counters; SGLang's abort from its waiting queue sends no ``prompt_tokens``, so
    the prompt is counted from the ids sent (``prompt``, a chat-templated prompt's token ids), else
    from those the engine echoed (``prompt_token_ids``), else it stays unknown (text sent)."""
    ids = prompt if isinstance(prompt, tuple) else answer.get("prompt_token_ids")
    return parse_meta_info(answer["meta_info"], prompt_tokens=None if ids is None else len(ids))


def row_steps(counter: RequestCounters) -> int:
    """Decode rows a request ran in: one per verify step where it speculated, else one per token
    after its first (which prefill makes); none for a request answered from SGLang's waiting queue
    (never admitted, or retracted and its output discarded)."""
    if counter.queued_abort:
        return 0
    if counter.spec_verify_ct is not None:
        return int(counter.spec_verify_ct)
    return max(counter.completion_tokens - 1, 0)


def decode_tokens(counter: RequestCounters) -> int:
    """Committed decode tokens of a request (its first is prefill's); none for a request answered
    from SGLang's waiting queue: a retracted request's output there is discarded, not committed."""
    return 0 if counter.queued_abort else max(counter.completion_tokens - 1, 0)


@dataclass(frozen=True)
class Window:
    """One metered window: the energy reading and every loop's per-request counters. A steady
    window's first ``prompts`` requests are its prompts; the rest (if any) were fillers that kept
    the batch in flight until the last prompt finished."""

    energy: EnergyWindow
    loops: int
    #: Per loop, per request sent (window order).
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
    #: The window's prompts (its first requests; None: every request is one).
    prompts: int | None = None
    #: A prefill-only twin's engine (``baseline`` or ``own``); empty for a full window.
    twin_engine: str = ""

    @property
    def counters(self) -> tuple[RequestCounters, ...]:
        """The first loop's counters (request timing, finish reasons)."""
        return self.loop_counters[0]

    @property
    def prompt_count(self) -> int:
        """How many of the first loop's requests are the window's prompts."""
        return len(self.counters) if self.prompts is None else self.prompts

    def _own(self, loop: tuple[RequestCounters, ...]) -> tuple[RequestCounters, ...]:
        return loop if self.prompts is None else loop[: self.prompts]

    @property
    def tokens_per_loop(self) -> float:
        """Completion tokens of every request per loop, averaged over every loop like the energy
        is."""
        return (
            sum(sum(c.completion_tokens for c in loop) for loop in self.loop_counters) / self.loops
        )

    @property
    def decode_tokens_per_loop(self) -> float:
        """The window prompts' decode tokens (:func:`decode_tokens`) per loop, over every loop."""
        return (
            sum(sum(decode_tokens(c) for c in self._own(loop)) for loop in self.loop_counters)
            / self.loops
        )

    @property
    def work_share(self) -> float | None:
        """The window prompts' share of the decode rows every request ran (:func:`row_steps`),
        over every loop; None where no filler ran (the share is 1)."""
        if all(len(loop) == len(self._own(loop)) for loop in self.loop_counters):
            return None
        own = sum(row_steps(c) for loop in self.loop_counters for c in self._own(loop))
        every = sum(row_steps(c) for loop in self.loop_counters for c in loop)
        return own / every if every else None

    def prefilled(self, loop: int = 0) -> tuple[int, ...]:
        """Positions whose request was prefilled in ``loop`` (a request aborted in the queue before
        it was admitted was not)."""
        return tuple(i for i, c in enumerate(self.loop_counters[loop]) if c.completion_tokens >= 1)

    def aborted(self, loop: int = 0) -> tuple[int, ...]:
        """Positions whose request the window's end cut short in ``loop``."""
        return tuple(i for i, c in enumerate(self.loop_counters[loop]) if c.finish_type == "abort")

    @property
    def loops_agree(self) -> bool:
        """Whether every loop made the same output for every window prompt it completed."""
        first = self.loop_outputs[0]
        cut = [set(self.aborted(n)) for n in range(self.loops)]
        return all(
            out == first[i]
            for n, loop in enumerate(self.loop_outputs)
            for i, out in enumerate(loop[: self.prompt_count])
            if i not in cut[n] and i not in cut[0]
        )

    @property
    def retractions(self) -> RetractionFacts:
        """The retractions of every request the window ran, over every loop."""
        counted = retractions.count(c for loop in self.loop_counters for c in loop)
        return RetractionFacts.from_dict(counted.as_dict(), "retractions")

    def own_decode_seconds(self, index: int) -> float | None:
        """Seconds of request ``index``'s own decode steps (first loop): the meter's count, else
        the engine's (the reference server's ``decode_seconds``), else its user-visible time less
        the other prefill forwards SGLang stamped inside it; None when nothing says (a request's
        latency less its twin's would count its wait in the engine's queue as decode)."""
        counter = self.counters[index]
        known = self.energy.request_decode_seconds
        if known is not None:
            return known.get(counter.rid)
        if counter.decode_seconds is not None:
            return counter.decode_seconds
        visible = self.visible_seconds(index)
        if visible is None:
            return None
        start = counter.prefill_finished_time
        stalls = sum(
            end - entry
            for entry, end in self.forwards()
            if entry != counter.forward_entry_time and start <= entry and end <= start + visible
        )
        return visible - stalls

    def visible_seconds(self, index: int) -> float | None:
        """Seconds from request ``index``'s first token to its last (first loop), every step in
        between counted: the meter's clock, else SGLang's stamps; None when neither says."""
        counter = self.counters[index]
        known = self.energy.request_visible_seconds
        if known is not None:
            return known.get(counter.rid)
        if counter.prefill_finished_time is None or counter.finished_time is None:
            return None
        return counter.finished_time - counter.prefill_finished_time

    def forwards(self) -> tuple[tuple[float, float], ...]:
        """The prefill forwards SGLang stamped in the first loop: (start, end), one per forward."""
        spans = {
            c.forward_entry_time: c.prefill_finished_time
            for c in self.counters
            if c.forward_entry_time is not None and c.prefill_finished_time is not None
        }
        return tuple(sorted(spans.items()))  # type: ignore[arg-type]

    @property
    def idle_seconds(self) -> float | None:
        """A prefill-only twin's wall seconds (first loop) outside the forwards its engine stamped:
        the round trips between groups, where a board meter reads idle power; None without stamps."""
        forwards = self.forwards()
        if not forwards or len(forwards) < len(self.groups) or self.wall_s <= 0:
            return None
        return max(self.wall_s - sum(end - entry for entry, end in forwards), 0.0)


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


def reproduced(before: StepRecord, after: StepRecord) -> bool:
    """Whether a window run again ran the same decode steps as the one before it, row count for
    row count (both with a step record). A host's disturbance lands on different steps each time;
    a shortfall that repeats step for step is the workload's own (an engine admitting fewer than
    the batch as its pool fills, a retraction, the prompts' lengths), and running the window once
    more cannot lift it: a live SGLang retraction case ran each window three times at the same
    2.17 rows per step of a peak of 3, a third of its measured time."""
    return bool(before.steps_by_running) and before.steps_by_running == after.steps_by_running


def decode_sample(prefill: Window, full: Window) -> RepeatSample:
    """Decode-only figures: the full window minus the prefill-only window, per loop, times the
    window prompts' share of the decode rows (:attr:`Window.work_share`).

    Why weigh by rows: the fillers that hold the batch after the last window prompt is sent share
    the window's steps, so its decode energy is the prompts' and the fillers'. At the declared batch
    each decode row of a step costs alike (the step's weight read is shared, its rows' work the
    same whatever they accept), so the prompts' part is their share of the rows; their tokens are
    then their whole outputs, the same prompts in every arm of a repeat (issue 41 item 4)."""
    share = full.work_share
    weight = 1.0 if share is None else share
    joules = full.energy.joules / full.loops - prefill.energy.joules / prefill.loops
    seconds = full.energy.seconds / full.loops - prefill.energy.seconds / prefill.loops
    tokens = full.decode_tokens_per_loop
    tbts: list[float | None] = []
    visible: list[float | None] = []
    for index in full.prefilled():
        if index >= full.prompt_count:
            continue  # a filler: its tokens are not the window's
        counter = full.counters[index]
        decode_s, visible_s = full.own_decode_seconds(index), full.visible_seconds(index)
        # A decode time that is not positive was not measured: left out, never reported as a
        # figure.
        tbts.append(_tbt(decode_s, counter.completion_tokens))
        visible.append(_tbt(visible_s, counter.completion_tokens))
    return RepeatSample(
        decode_joules=joules * weight,
        decode_seconds=seconds * weight,
        decode_tokens=int(tokens) if tokens == int(tokens) else tokens,
        tbt_ms=metrics.mean_tbt_ms(tbts),
        verify_steps=per_loop_total(full, "spec_verify_ct"),
        correct_drafts=per_loop_total(full, "spec_num_correct_drafts"),
        proposed_drafts=per_loop_total(full, "spec_num_proposed_drafts"),
        loops=full.loops,
        window=SampleWindow(full=window_facts(full), prefill=window_facts(prefill)),
        accept_lengths=request_accept_lengths(full.counters[: full.prompt_count]),
        visible_tbt_ms=metrics.mean_tbt_ms(visible),
        work_share=share,
        retractions=full.retractions,
    )


def _tbt(seconds: float | None, completion_tokens: int) -> float | None:
    return (
        metrics.request_tbt_ms(seconds, completion_tokens)
        if seconds is not None and seconds > 0
        else None
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
        if c.spec_verify_ct is not None and c.spec_verify_ct > 0 and not c.queued_abort
    )


def per_loop_total(window: Window, field_name: str) -> int | float | None:
    """A speculative counter's total over the window prompts per loop (mean over loops, like the
    energy); None, never a silent 0, if a request that decoded lacks it. A request that finished in
    its prefill has none in SGLang and adds nothing; nor does one answered from SGLang's waiting
    queue (``queued_abort``: retracted, its output discarded, no counters sent)."""
    totals = []
    for loop in window.loop_counters:
        own = [c for c in window._own(loop) if not c.queued_abort]
        values = [
            getattr(c, field_name)
            for c in own
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
        prompts=window.prompts,
        idle_seconds=window.idle_seconds if window.grouping else None,
        twin_engine=window.twin_engine or None,
    )
