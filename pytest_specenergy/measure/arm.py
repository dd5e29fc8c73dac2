"""The measurement protocol for one arm: warm-up, then per repeat a flushed steady-state full window
and a prefill-only window of what it prefilled; decode energy is their difference (why the twin
replays prefill groups, how the steady state is kept, what stays unverified:
``docs/methodology.md#the-measurement-window``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from time import perf_counter as _clock
from typing import Any
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.document import Arm
from pytest_specenergy.document import ArmConcurrency
from pytest_specenergy.document import EngineFacts
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.document import StepRecord
from pytest_specenergy.engines.base import Server
from pytest_specenergy.engines.meta_info import adaptive_speculation
from pytest_specenergy.engines.meta_info import concurrency_between
from pytest_specenergy.engines.meta_info import merge_concurrency
from pytest_specenergy.engines.prompts import generate_input
from pytest_specenergy.measure.checks import counter_problems
from pytest_specenergy.measure.load import Answer
from pytest_specenergy.measure.load import SteadyLoad
from pytest_specenergy.measure.load import load_width
from pytest_specenergy.measure.load import next_rid
from pytest_specenergy.measure.prefill_groups import DEFAULT_SEND_GAP_S
from pytest_specenergy.measure.prefill_groups import Groups
from pytest_specenergy.measure.prefill_groups import prefill_groups
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.measure.window import PRICED
from pytest_specenergy.measure.window import Window
from pytest_specenergy.measure.window import counters_of
from pytest_specenergy.measure.window import decode_sample
from pytest_specenergy.measure.window import disturbed_mean
from pytest_specenergy.measure.window import reproduced
from pytest_specenergy.meters.base import Meter
from pytest_specenergy.plan.window import filler_prompts
from pytest_specenergy.plan.window import window_prompts

#: Per pool prompt, the drafts of every verify step (``meta_info.spec_drafts``).
Drafts = tuple[tuple[tuple[int, ...], ...], ...]

# Send times and a window's wall time read ``_clock`` (perf_counter): a test that steps
# ``time.monotonic`` to drive the loop count must not see these reads.


@dataclass(frozen=True)
class ArmRepeat:
    """One measured repeat of one arm, with when it ran (wall clock, seconds since the epoch)."""

    sample: RepeatSample
    #: The window prompts' whole outputs and finish reasons, by ``indices`` (pool indices).
    outputs: tuple[tuple[int, ...], ...]
    finish: tuple[str, ...]
    concurrency: StepRecord
    stable: bool
    problems: tuple[str, ...] = ()
    #: A replay arm's windows that did not replay like for like (missing recorded drafts).
    replay_problems: tuple[str, ...] = ()
    started: float = 0.0
    finished: float = 0.0
    #: The means of this repeat's full windows run again because the host disturbed them.
    rerun_means: tuple[float, ...] = ()
    #: The pool indices of the window's prompts (``plan/window.py``), in window order.
    indices: tuple[int, ...] = ()


class ArmMeasurer:
    """Runs the protocol for one arm of one case on a running server."""

    def __init__(
        self,
        server: Server,
        meter: Meter,
        case: Case,
        repeats: int,
        warmup: int,
        replay: Drafts | None = None,
        run_twin: bool = False,
        twin_server: Server | None = None,
        first_repeat: int = 0,
    ) -> None:
        self.server = server
        #: Where the prefill-only twin runs: the non-speculative twin engine where it is live (the
        #: target's prefill alone is subtracted; a draft model's own prefill stays the speculative
        #: arm's), else the arm's own engine (None).
        self.twin_server = twin_server
        #: The repeat the next :meth:`measure_repeat` measures: it picks the window's prompts
        #: (``plan/window.py``), the same for every arm of a repeat.
        self.next_repeat = first_repeat
        #: Run the prefill-only twin even where the meter priced the full window's own prefill steps
        #: (``benchmarks/window_bias.py`` checks the twin against those steps).
        self.run_twin = run_twin
        self.meter = meter
        self.case = case
        self.repeats = repeats
        self.warmup = warmup
        #: Requests kept in flight (a case of batch 0 runs one at a time).
        self.batch = max(case.batch, 1)
        self.prompts = case.pool()
        #: Per pool prompt, the drafts of each verify step to replay (a replay engine's arm).
        self.replay = replay
        if replay is not None and len(replay) != len(self.prompts):
            raise ValueError(
                f"{len(replay)} recorded draft lists for a pool of {len(self.prompts)} prompts"
            )
        self.full = {
            "max_new_tokens": case.generation.max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": case.generation.ignore_eos,
        }
        #: Per pool prompt, a whole output and its finish reason from an earlier repeat.
        self._whole: dict[int, tuple[tuple[int, ...], str]] = {}
        # One token: the prompt's prefill and the first token, nothing else.
        self.prefill = {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}

    def _run(
        self,
        sampling: dict[str, Any],
        indices: Sequence[int],
        steady: bool = False,
        record: bool = False,
        sent: list[float | None] | None = None,
        prompts: int | None = None,
    ) -> list[Answer]:
        """Every prompt of ``indices`` (into the pool) through a :class:`SteadyLoad` at the case's
        batch (a steady-state window with ``steady``, whose first ``prompts`` are its prompts and
        the rest fillers, sent only while needed). A replay arm's decoding requests carry their
        drafts; ``record`` asks for drafts back; ``sent`` gets each position's send time."""
        # The engine admits the batch before any request is sent.
        cap = self.server.admit_exactly(self.batch)
        replay = self.replay if sampling.get("max_new_tokens", 0) > 1 else None
        asked = {"return_spec_drafts": True} if record else {}
        client = self.server.client

        def params(position: int) -> dict[str, Any]:
            if replay is None:
                return sampling
            drafts = replay[indices[position]]
            return {**sampling, "spec_replay_drafts": [list(d) for d in drafts]}

        def send_wave(positions: list[int], rids: list[str]) -> list[Answer]:
            if sent is not None:
                at = _clock()
                for position in positions:
                    sent[position] = at
            each = [params(p) for p in positions]
            return client.generate(
                **generate_input([self.prompts[indices[p]] for p in positions]),
                sampling_params=each[0] if replay is None or len(each) == 1 else each,
                rids=rids,
                **asked,
            )

        def send(position: int, rid: str) -> Answer:
            return send_wave([position], [rid])[0]

        width = load_width(self.batch, cap, steady, len(indices))
        count = len(indices) if prompts is None or not steady else prompts
        load = SteadyLoad(
            count,
            send,
            client.abort_until_answered,
            batch=self.batch,
            width=width,
            steady=steady,
            fillers=len(indices) - count,
            send_wave=send_wave,
        )
        return load.run()

    def _replay_groups(
        self, sampling: dict[str, Any], indices: Sequence[int], groups: Groups, server: Server
    ) -> list[dict[str, Any]]:
        """The prompts of ``indices``, one batched ``/generate`` per group of positions on
        ``server``, each answered before the next: an idle engine admits a call's requests in one
        iteration, so each group is one prefill forward."""
        server.admit_exactly(self.batch)
        answers: list[dict[str, Any] | None] = [None] * len(indices)
        for group in groups:
            got = server.client.generate(
                **generate_input([self.prompts[indices[p]] for p in group]),
                sampling_params=sampling,
                rids=[next_rid() for _ in group],
            )
            if len(got) != len(group):
                raise RuntimeError(
                    f"a batched /generate of {len(group)} prefill-only prompts got {len(got)} "
                    "answers"
                )
            for position, answer in zip(group, got):
                answers[position] = answer
        missing = [i for i, a in enumerate(answers) if a is None]
        if missing:
            raise RuntimeError(
                f"{len(missing)} of {len(indices)} prefill-only requests were in no group"
            )
        return answers  # type: ignore[return-value]

    def _window(
        self,
        sampling: dict[str, Any],
        indices: Sequence[int],
        steady: bool,
        groups: Groups | None = None,
        grouping: str = "",
        prompts: int | None = None,
        server: Server | None = None,
    ) -> Window:
        """One flushed, metered window of ``indices`` on ``server`` (the arm's own by default):
        refilled ``batch`` at a time (the first ``prompts`` the window's, the rest fillers), or
        replayed by ``groups``."""
        server = server or self.server
        client = server.client
        client.flush_cache()
        before = client.server_info()
        sent: list[float | None] = [None] * len(indices)

        def run(first: bool) -> list[dict[str, Any]]:
            if groups is not None:
                return self._replay_groups(sampling, indices, groups, server)
            return self._run(
                sampling, indices, steady, sent=sent if first else None, prompts=prompts
            )

        token = self.meter.start(server)
        started, began = time.monotonic(), _clock()
        answers = [run(True)]
        wall_s = _clock() - began
        # A board counter updates every few ms and is noisy: extend short windows with identical
        # work rather than report a number the meter cannot resolve.
        while self.meter.min_window_s and time.monotonic() - started < self.meter.min_window_s:
            answers.append(run(False))
        energy = self.meter.stop(token)
        after = client.server_info()
        # Requested batch is not actual concurrency (paper s.10): read what really ran.
        concurrency = StepRecord.of(concurrency_between(before, after))
        counters = tuple(
            tuple(counters_of(a, self.prompts[indices[p]]) for p, a in enumerate(loop))
            for loop in answers
        )
        outputs = tuple(
            tuple(tuple(int(t) for t in a["output_ids"]) for a in loop) for loop in answers
        )
        ran = len(answers[0])  # the fillers the first loop needed are part of its requests
        return Window(
            energy,
            len(answers),
            counters,
            outputs,
            concurrency,
            tuple(indices[:ran]),
            replay_misses=_misses(before, after)
            if self.replay is not None and server is self.server
            else 0,
            sent=tuple(sent[:ran]),
            wall_s=wall_s,
            groups=groups or (),
            grouping=grouping,
            prompts=prompts,
            twin_engine="" if groups is None else ("own" if server is self.server else "baseline"),
        )

    def _prefill_window(self, full: Window) -> Window:
        """The prefill-only window of what ``full`` prefilled: its own prefill forwards where the
        meter priced them, else (or with ``run_twin``) the twin, run.

        Why a priced window may stand in for the twin: a meter that prices the engine's own steps
        (the modeled meter) already holds the prefill-only window. The full window's prefill
        forwards are exactly the forwards the twin replays group for group, so their price is what
        the twin would read (``benchmarks/window_bias.py``, twin run: 0.00 points between the two
        in all 24 rows), and running it would only repeat them (the quickstart's median time fell
        from 106.1 s to 88.9 s, ``benchmarks/quickstart_time.py``). A board meter (NVML) prices
        nothing: there the twin runs, grouped as ``full`` prefilled."""
        priced = full.energy.prefill_only
        prefilled = full.prefilled()
        if (
            priced is not None
            and not self.run_twin
            and full.energy.request_decode_seconds is not None
        ):
            return Window(
                priced,
                full.loops,
                (),
                (),
                StepRecord(),
                tuple(full.indices[p] for p in prefilled),
                grouping=PRICED,
            )
        # The twin, grouped as ``full`` prefilled it; sends within half a decode step (wall clock; a
        # default without steps) are one step's refills: refills of one step group, and refills
        # of the next step do not.
        steps = full.concurrency.steps
        gap_s = 0.5 * full.wall_s / steps if steps and full.wall_s > 0 else DEFAULT_SEND_GAP_S
        groups, source = prefill_groups(full.counters, prefilled, full.sent, gap_s)
        at = {position: i for i, position in enumerate(prefilled)}
        # Twin positions follow full.prefilled(), so the per-request TBT pairs them up.
        twin_groups = tuple(tuple(at[p] for p in group) for group in groups)
        return self._window(
            self.prefill,
            [full.indices[p] for p in prefilled],
            steady=False,
            groups=twin_groups,
            grouping=source,
            server=self.twin_server,
        )

    def _complete(self, full: Window) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
        """Whole outputs and finish reasons for the window's prompts (not its fillers): the
        window's, its cut-short prompts generated again (unmetered) or, where the partial output
        prefixes an earlier repeat's whole one, that one."""
        own = full.prompt_count
        outputs = list(full.loop_outputs[0][:own])
        finish = [c.finish_type or "?" for c in full.counters[:own]]
        cut = set(full.aborted())
        again = []
        for i, output in enumerate(outputs):  # a window's pool indices are distinct
            known = self._whole.get(full.indices[i])
            if i not in cut:
                self._whole.setdefault(full.indices[i], (output, finish[i]))
            elif known is not None and known[0][: len(output)] == output:
                outputs[i], finish[i] = known
            else:
                again.append(i)
        for _ in range(2):  # an answer the engine aborted is asked again once, then refused
            if not again:
                break
            answers = self._run(self.full, [full.indices[i] for i in again])
            for i, answer in zip(again, answers):
                outputs[i] = tuple(int(t) for t in answer["output_ids"])
                finish[i] = counters_of(answer, self.prompts[full.indices[i]]).finish_type or "?"
                if finish[i] != "abort":
                    self._whole[full.indices[i]] = (outputs[i], finish[i])
            again = [i for i in again if finish[i] == "abort"]
        if again:
            # A cut-short answer taken as whole would fail the case blaming the drafter.
            raise RuntimeError(
                f"{self.case.id}: the engine aborted {len(again)} request(s) the plugin generated "
                "again outside the window (prompts "
                f"{', '.join(str(full.indices[i]) for i in again)}), twice: their outputs are "
                "incomplete, so equivalence and coherence cannot be judged; see the engine log"
            )
        return tuple(outputs), tuple(finish)

    def warm_up(self, runs: int | None = None) -> None:
        """Discarded runs that bring the engine to its steady state (``runs``: this many instead
        of the measurer's own)."""
        for _ in range(self.warmup if runs is None else runs):
            self._run(self.full, range(min(self.batch, len(self.prompts))))

    def record_drafts(self) -> Drafts:
        """Per prompt, each verify step's drafts (``meta_info.spec_drafts``) from one unmetered pool
        run: a replay engine given them makes the same verify steps and accepts."""
        answers = self._run(self.full, range(len(self.prompts)), record=True)
        drafts = []
        for index, answer in enumerate(answers):
            recorded = answer["meta_info"].get("spec_drafts")
            if recorded is None:
                raise RuntimeError(
                    f"the engine returned no spec_drafts for prompt {index}; draft removal "
                    f"needs the reference server (return_spec_drafts)"
                )
            drafts.append(tuple(tuple(int(t) for t in step) for step in recorded))
        return tuple(drafts)

    def _steady_window(self, repeat: int) -> tuple[Window, tuple[float, ...]]:
        """One repeat's full window, run again (at most :data:`WINDOW_RERUNS` times) while
        :func:`disturbed_mean` and not :func:`reproduced` by its rerun, and the dropped
        (disturbed) windows' means. An undisturbed window is kept; when every one was disturbed,
        the one that ran the most rows per step (nearest the declared batch; of equals the later)
        is kept all the same: it describes the declared batch best, where keeping the last failed
        an A/A pair on CI (a live SGLang baseline window read 3.76 of 4 and its rerun 3.31).
        Choosing by concurrency does not choose by energy: both arms' windows are chosen by the
        same rule, and the dropped means are recorded (``concurrency.rerun_means``) and named by
        any concurrency check that still fails."""
        pool = len(self.prompts)
        own = window_prompts(self.batch, pool, repeat)
        indices = own + filler_prompts(self.batch, pool, repeat)
        tries = [self._window(self.full, indices, steady=True, prompts=len(own))]
        while (
            len(tries) <= WINDOW_RERUNS
            and disturbed_mean(tries[-1].concurrency) is not None
            and not (len(tries) > 1 and reproduced(tries[-2].concurrency, tries[-1].concurrency))
        ):
            tries.append(self._window(self.full, indices, steady=True, prompts=len(own)))
        calm = disturbed_mean(tries[-1].concurrency) is None  # so only it can lack a mean
        kept = tries[-1] if calm else max(reversed(tries), key=lambda w: w.concurrency.mean_running)
        return kept, tuple(w.concurrency.mean_running for w in tries if w is not kept)

    def measure_repeat(self, arm: str) -> ArmRepeat:
        """A flushed steady-state window, then a flushed prefill-only one of what it prefilled; a
        repeat that timed no decode (a stall) is measured again up to :data:`WINDOW_RERUNS` times,
        the last kept for the checks, which read the decode times of those measured again in the
        sample's ``window.rerun_decode_seconds`` (a failure after them is no one passing stall)."""
        started = time.time()
        repeat, self.next_repeat = self.next_repeat, self.next_repeat + 1
        dropped: list[float] = []
        unlike: list[float] = []
        while True:
            full, disturbed = self._steady_window(repeat)
            dropped += disturbed
            sample = decode_sample(self._prefill_window(full), full)
            if sample.decode_seconds > 0 or len(unlike) >= WINDOW_RERUNS:
                break
            unlike.append(sample.decode_seconds)
        # Only the kept window's cut prompts are generated again (unmetered, after its twin).
        outputs, finish = self._complete(full)
        if unlike:
            sample = dataclasses.replace(
                sample,
                window=dataclasses.replace(sample.window, rerun_decode_seconds=tuple(unlike)),
            )
        # The share of the window prompts' decode tokens (whole outputs less prefill's first
        # token) made inside the window, per loop: with fillers holding the batch it is whole
        # unless they ran out (issue 21 item 3, issue 41 item 4).
        whole = sum(max(len(o) - 1, 0) for o in outputs)
        sample = dataclasses.replace(
            sample, coverage=full.decode_tokens_per_loop / whole if whole else None
        )
        # Every arm but the baseline (the speculative arm, an A/B reference or a replay) has
        # speculative counters.
        problems = (
            []
            if arm == "baseline"
            else [
                p
                for loop in full.loop_counters
                for p in counter_problems(
                    [c for c in loop if not c.queued_abort], self.case.drafter.num_draft_tokens
                )
            ]
        )
        replay_problems = (
            (
                f"{full.replay_misses} verify step(s) had no recorded draft of the drafter's "
                "width to replay: the run is not like for like",
            )
            if full.replay_misses
            else ()
        )
        return ArmRepeat(
            sample=sample,
            outputs=outputs,
            finish=finish,
            started=started,
            concurrency=full.concurrency,
            rerun_means=tuple(dropped),
            stable=full.loops_agree,
            problems=tuple(problems),
            replay_problems=replay_problems,
            finished=time.time(),
            indices=full.indices[: full.prompt_count],
        )

    def result(self, arm: str, repeats: Sequence[ArmRepeat]) -> RunResult:
        """The arm's record over ``repeats``: its outputs are every window prompt's, by pool index
        (repeats walk the pool, so each adds its own prompts)."""
        drafter = self.case.drafter if arm != "baseline" else None
        engine = EngineFacts.from_dict(self.server.describe(), f"{arm}.engine")
        outputs, stable = prompt_outputs(repeats)
        samples = tuple(r.sample for r in repeats)
        counted = [s.retractions for s in samples]
        record = Arm.measured(
            arm,
            engine,
            self.meter.label,
            samples,
            drafter.num_draft_tokens + 1 if drafter else 1,
            finish_reasons=tuple(finish for _, finish in outputs.values()),
            concurrency=arm_concurrency(self.case.batch, repeats, len(self.prompts)),
            outputs_stable=stable and all(r.stable for r in repeats),
            counter_problems=tuple(dict.fromkeys(p for r in repeats for p in r.problems)),
            replay_problems=tuple(dict.fromkeys(p for r in repeats for p in r.replay_problems)),
            # SGLang books proposed drafts from the static config, adaptive or not.
            nominal_proposals=adaptive_speculation(engine.server_info),
            retractions=sum(counted[1:], counted[0])  # type: ignore[arg-type]
            if counted and None not in counted
            else None,
        )
        return RunResult(record, tuple(out for out, _ in outputs.values()), prompts=tuple(outputs))

    def measure(self, arm: str) -> RunResult:
        """Warm up, then ``repeats`` flushed prefill/full window pairs back to back."""
        self.warm_up()
        return self.result(arm, [self.measure_repeat(arm) for _ in range(self.repeats)])


#: Times one repeat's full window is run again when the host disturbed it (:func:`disturbed_mean`),
#: and times a repeat is measured again when it measured no decode (``measure_repeat``). Two: on
#: CI's 2 shared cores a live SGLang A/A baseline window fell to 3.76 of 4 and its one rerun to
#: 3.31, failing an A/A pair on the host alone.
WINDOW_RERUNS = 2


def arm_concurrency(batch: int, repeats: Sequence[ArmRepeat], pool: int) -> ArmConcurrency:
    """What ran over an arm's full windows: the merged step record, each window's mean
    (``window_means``: the worst repeat shows) and the means of windows run again as the host
    disturbed them (``rerun_means``)."""
    windows = [r.concurrency for r in repeats]
    merged = merge_concurrency([w.as_dict() for w in windows]) if windows else {}
    means = [w.mean_running for w in windows]
    return ArmConcurrency.from_dict(
        {
            "requested": batch,
            "pool": pool,
            **merged,
            "window_means": None if any(m is None for m in means) else means,
            "rerun_means": [m for r in repeats for m in r.rerun_means],
        },
        "concurrency",
    )


def prompt_outputs(
    repeats: Sequence[ArmRepeat],
) -> tuple[dict[int, tuple[tuple[int, ...], str]], bool]:
    """Every window prompt's whole output and finish reason by pool index (in pool order), and
    whether the repeats that measured a prompt more than once agree on its output."""
    seen: dict[int, tuple[tuple[int, ...], str]] = {}
    stable = True
    for repeat in repeats:
        for index, output, finish in zip(repeat.indices, repeat.outputs, repeat.finish):
            if index in seen:
                stable = stable and seen[index][0] == output
            else:
                seen[index] = (output, finish)
    return dict(sorted(seen.items())), stable


def _misses(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Replay misses between two ``/server_info`` answers (cumulative
    ``internal_states[0].spec_replay_misses``)."""
    start, end = (
        ((at.get("internal_states") or [{}])[0] or {}).get("spec_replay_misses")
        for at in (before, after)
    )
    if start is None or end is None:
        raise RuntimeError(
            "the replay engine reports no spec_replay_misses in /server_info, so whether it "
            "replayed like for like cannot be known"
        )
    return int(end) - int(start)
