"""The measurement protocol for one arm.

Per arm: warm-up runs are discarded; then, per repeat, the cache (and the n-gram table) is
flushed, a prefill-only run (``max_new_tokens=1``) and the full run are each measured in
their own meter window, and decode energy is their difference - so prefill never sits in
the energy window (paper s.10). A window shorter than the meter can resolve is filled by
repeating the same requests (``loops``), never reported as zero. Token counts come from the
engine's counters over exactly the measured requests.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.engines.meta_info import concurrency_between
from pytest_specenergy.engines.meta_info import parse_meta_info
from pytest_specenergy.measure import metrics
from pytest_specenergy.measure.checks import counter_problems
from pytest_specenergy.measure.results import RepeatSample
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.meters.base import EnergyWindow
from pytest_specenergy.meters.base import Meter

_rid_counter = itertools.count()


@dataclass(frozen=True)
class _Window:
    """One metered window: the energy reading and the first loop's per-prompt counters."""

    energy: EnergyWindow
    loops: int
    counters: tuple[RequestCounters, ...]
    outputs: tuple[tuple[int, ...], ...]
    concurrency: dict[str, Any]

    def request_seconds(self, index: int) -> float | None:
        """Active seconds of prompt ``index`` in the first loop (meter's clock if it has one)."""
        known = self.energy.request_seconds
        if known is not None:
            return known.get(self.counters[index].rid)
        return self.counters[index].e2e_latency


class ArmMeasurer:
    """Runs the protocol for one arm of one case on a running server."""

    def __init__(self, server: ServerProcess, meter: Meter, case: Case,
                 repeats: int, warmup: int) -> None:
        self.server = server
        self.meter = meter
        self.case = case
        self.repeats = repeats
        self.warmup = warmup
        gen = case.generation
        self.prompts = case.corpus.take(gen.prompt_count(case.batch))
        self.full = {"max_new_tokens": gen.max_new_tokens, "temperature": 0.0,
                     "ignore_eos": gen.ignore_eos}
        # One token: the prompt's prefill and the first token, nothing else.
        self.prefill = {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}

    def _run(self, sampling: dict[str, Any], prompts: Sequence[str]) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = []
        batch = self.case.batch
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            rids = [f"se-{next(_rid_counter)}" for _ in chunk]
            answers += self.server.client.generate(text=chunk, sampling_params=sampling, rids=rids)
        return answers

    def _window(self, sampling: dict[str, Any]) -> _Window:
        client = self.server.client
        client.flush_cache()
        before = client.server_info()
        token = self.meter.start(self.server)
        first = self._run(sampling, self.prompts)
        loops = 1
        # A board counter updates every few ms and is noisy: extend short windows with
        # identical work rather than report a number the meter cannot resolve.
        started = time.monotonic()
        while self.meter.min_window_s and time.monotonic() - started < self.meter.min_window_s:
            self._run(sampling, self.prompts)
            loops += 1
        energy = self.meter.stop(token)
        # Requested batch is not actual concurrency (paper s.10): read what really ran.
        concurrency = concurrency_between(before, client.server_info())
        counters = tuple(parse_meta_info(a["meta_info"]) for a in first)
        outputs = tuple(tuple(int(t) for t in a["output_ids"]) for a in first)
        return _Window(energy, loops, counters, outputs, concurrency)

    def measure(self, arm: str) -> RunResult:
        """Warm up, then ``repeats`` flushed prefill/full window pairs."""
        for _ in range(self.warmup):
            self._run(self.full, self.prompts[: self.case.batch])
        samples: list[RepeatSample] = []
        outputs: list[tuple[tuple[int, ...], ...]] = []
        finish: tuple[str, ...] = ()
        concurrency: dict[str, Any] = {}
        problems: list[str] = []
        for _ in range(self.repeats):
            prefill = self._window(self.prefill)
            full = self._window(self.full)
            concurrency = full.concurrency
            samples.append(_sample(prefill, full))
            outputs.append(full.outputs)
            finish = tuple(c.finish_type or "?" for c in full.counters)
            if arm == "speculative":
                problems += counter_problems(full.counters, self.case.drafter.num_draft_tokens)
        drafter = self.case.drafter if arm == "speculative" else None
        return RunResult(
            arm=arm,
            engine=self.server.describe(),
            source=self.meter.label,
            samples=tuple(samples),
            outputs=outputs[0],
            finish_reasons=finish,
            verified_per_step=drafter.num_draft_tokens + 1 if drafter else 1,
            concurrency={"requested": self.case.batch, **concurrency},
            outputs_stable=all(o == outputs[0] for o in outputs),
            counter_problems=tuple(dict.fromkeys(problems)),
        )


def _sample(prefill: _Window, full: _Window) -> RepeatSample:
    """Decode-only figures: the full window minus the prefill-only window, per loop."""
    joules = full.energy.joules / full.loops - prefill.energy.joules / prefill.loops
    seconds = full.energy.seconds / full.loops - prefill.energy.seconds / prefill.loops
    tokens = sum(c.completion_tokens for c in full.counters) - sum(
        c.completion_tokens for c in prefill.counters)
    tbts = []
    for index, counter in enumerate(full.counters):
        full_s, prefill_s = full.request_seconds(index), prefill.request_seconds(index)
        if full_s is None or prefill_s is None:
            tbts.append(None)
            continue
        tbts.append(metrics.request_tbt_ms(full_s - prefill_s, counter.completion_tokens))
    return RepeatSample(
        decode_joules=joules,
        decode_seconds=seconds,
        decode_tokens=tokens,
        tbt_ms=metrics.mean_tbt_ms(tbts),
        verify_steps=_total(full.counters, "spec_verify_ct"),
        correct_drafts=_total(full.counters, "spec_num_correct_drafts"),
        proposed_drafts=_total(full.counters, "spec_num_proposed_drafts"),
        loops=full.loops,
        window={"full": _window_facts(full), "prefill": _window_facts(prefill)},
    )


def _total(counters: Sequence[RequestCounters], field: str) -> int | None:
    """Sum of a speculative counter over requests; None if a request that decoded lacks it.

    A request that finished in its prefill legitimately has no counters (SGLang omits them),
    so it adds nothing; any other gap makes the total unknown, never a silent 0.
    """
    total = 0
    for counter in counters:
        value = getattr(counter, field)
        if value is None:
            if counter.completion_tokens <= 1:
                continue
            return None
        total += int(value)
    return total if counters else None


def _window_facts(window: _Window) -> dict[str, Any]:
    return {"joules": window.energy.joules, "seconds": window.energy.seconds,
            "loops": window.loops, "source": window.energy.source,
            "details": dict(window.energy.details)}
