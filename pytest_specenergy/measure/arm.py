"""The measurement protocol for one arm: warm-up, then per repeat a flushed steady-state full window
and a prefill-only window of what it prefilled; decode energy is their difference (why the twin
replays prefill groups, how the steady state is kept, what stays unverified:
``docs/design/measure.md``, ``pytest_specenergy/measure/arm.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass
from time import perf_counter as _clock
from typing import Any
from typing import Callable
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.launch import ServerProcess
from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.engines.meta_info import concurrency_between
from pytest_specenergy.engines.meta_info import merge_concurrency
from pytest_specenergy.engines.meta_info import parse_meta_info
from pytest_specenergy.engines.prompts import generate_input
from pytest_specenergy.measure import metrics
from pytest_specenergy.measure.checks import MAX_CONCURRENCY_GAP_SHARE
from pytest_specenergy.measure.checks import counter_problems
from pytest_specenergy.measure.prefill_groups import DEFAULT_SEND_GAP_S
from pytest_specenergy.measure.prefill_groups import Groups
from pytest_specenergy.measure.prefill_groups import prefill_groups
from pytest_specenergy.measure.results import RepeatSample
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.meters.base import EnergyWindow
from pytest_specenergy.meters.base import Meter

#: Per pool prompt, the drafts of every verify step (``meta_info.spec_drafts``).
Drafts = tuple[tuple[tuple[int, ...], ...], ...]

# Send times and a window's wall time read ``_clock`` (perf_counter): a test that steps
# ``time.monotonic`` to drive the loop count must not see these reads.

#: The ``grouping`` of a prefill-only window priced from the full window's prefill steps rather than
#: run.
PRICED = "priced from the full window's prefill steps"

_rid_counter = itertools.count()
_rid_lock = threading.Lock()


def _next_rid() -> str:
    with _rid_lock:
        return f"se-{next(_rid_counter)}"


@dataclass(frozen=True)
class _Window:
    """One metered window: the energy reading and every loop's per-prompt counters."""

    energy: EnergyWindow
    loops: int
    #: Per loop, per prompt (pool order).
    loop_counters: tuple[tuple[RequestCounters, ...], ...]
    loop_outputs: tuple[tuple[tuple[int, ...], ...], ...]
    concurrency: dict[str, Any]
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


@dataclass(frozen=True)
class ArmRepeat:
    """One measured repeat of one arm, with when it ran (wall clock, seconds since the epoch)."""

    sample: RepeatSample
    outputs: tuple[tuple[int, ...], ...]
    finish: tuple[str, ...]
    concurrency: dict[str, Any]
    stable: bool
    problems: tuple[str, ...] = ()
    #: A replay arm's windows that did not replay like for like (missing recorded drafts).
    replay_problems: tuple[str, ...] = ()
    started: float = 0.0
    finished: float = 0.0


class ArmMeasurer:
    """Runs the protocol for one arm of one case on a running server."""

    def __init__(
        self,
        server: ServerProcess,
        meter: Meter,
        case: Case,
        repeats: int,
        warmup: int,
        replay: Drafts | None = None,
        run_twin: bool = False,
    ) -> None:
        self.server = server
        #: Run the prefill-only twin even where the meter priced the full window's own prefill steps
        #: (``benchmarks/window_bias.py`` checks the twin against those steps).
        self.run_twin = run_twin
        self.meter = meter
        self.case = case
        self.repeats = repeats
        self.warmup = warmup
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
    ) -> list[dict[str, Any]]:
        """Every prompt of ``indices`` (into the pool) sent, ``batch`` threads each refilling one
        ``/generate`` as its own returns; with ``steady`` the first to find the pool empty under
        ``batch`` in flight aborts the rest (the window's end). The first error stops the refill and
        is raised once every thread has returned. A replay arm's decoding requests carry their
        drafts; ``record`` asks for drafts back; ``sent`` gets send times."""
        cap = self._admission_cap()  # the engine admits the batch before any request is sent
        prompts = [self.prompts[i] for i in indices]
        batch = max(self.case.batch, 1)
        replay = self.replay if sampling.get("max_new_tokens", 0) > 1 else None
        asked = {"return_spec_drafts": True} if record else {}
        answers: list[dict[str, Any] | None] = [None] * len(prompts)
        client = self.server.client
        lock = threading.Lock()
        cursor = iter(range(len(prompts)))
        errors: list[BaseException] = []
        state = {"ended": False}
        #: rid of every request sent (or about to be) and not answered yet.
        in_flight: set[str] = set()

        def pending() -> set[str]:
            with lock:
                return set(in_flight)

        def worker() -> None:
            while True:
                with lock:
                    if errors:
                        return
                    index = next(cursor, None)
                    if index is None:
                        # The window ends when a finish leaves fewer than the batch in flight; with
                        # requests queued beyond the batch, the first workers to find the pool empty
                        # still leave the batch running.
                        end_now = (
                            steady
                            and bool(in_flight)
                            and len(in_flight) < batch
                            and not state["ended"]
                        )
                        state["ended"] = state["ended"] or end_now
                    else:
                        # Registered before the request is sent, so a close that comes before it
                        # reaches the engine still knows to abort it.
                        rid = _next_rid()
                        in_flight.add(rid)
                try:
                    if index is None:
                        if end_now:
                            abort_until_answered(client, pending)
                        return
                    params = (
                        sampling
                        if replay is None
                        else {
                            **sampling,
                            "spec_replay_drafts": [list(d) for d in replay[indices[index]]],
                        }
                    )
                    if sent is not None:
                        sent[index] = _clock()
                    answer = client.generate(
                        **generate_input([prompts[index]]),
                        sampling_params=params,
                        rids=[rid],
                        **asked,
                    )
                except BaseException as exc:  # re-raised in the caller's thread
                    with lock:
                        errors.append(exc)
                    return
                finally:
                    if index is not None:
                        with lock:
                            in_flight.discard(rid)
                answers[index] = answer[0]

        # On an engine that admits exactly the batch, a steady-state window keeps twice the batch in
        # flight: the extra ones wait in the engine's queue and are admitted the iteration slots
        # free, where a refill sent on the answer would leave its slot empty for a client round trip
        # (issue 21 item 4). The window still closes with no request queued: it ends when fewer than
        # the batch are in flight, queued ones included.
        width = max(1, min(2 * batch if steady and cap == batch else batch, len(prompts)))
        if width == 1:
            worker()
        else:
            threads = [
                threading.Thread(target=worker, name=f"specenergy-req-{i}", daemon=True)
                for i in range(width)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if errors:
            raise errors[0]
        missing = [i for i, a in enumerate(answers) if a is None]
        if missing:
            raise RuntimeError(f"{len(missing)} of {len(prompts)} requests got no answer")
        return answers  # type: ignore[return-value]

    def _admission_cap(self) -> int | None:
        """The engine's cap on running requests: one settable at run time whose case declares none
        is set to the batch (both arms alike), so refills queue in the engine rather than travel;
        one engine serves every batch."""
        server, batch = self.server, max(self.case.batch, 1)
        info = getattr(server, "server_info", None)
        info = info if isinstance(info, dict) else {}
        configured = info.get("max_running_requests")
        declared = getattr(getattr(server, "config", None), "max_running_requests", None)
        settable = "max_running_requests" in (info.get("settable_internal_state") or ())
        if (
            declared is not None
            or not settable
            or not isinstance(configured, int)
            or batch > configured
        ):
            return configured
        if getattr(server, "admission_cap", None) != batch:
            server.client.set_internal_state(max_running_requests=batch)
            server.admission_cap = batch
        return batch

    def _replay_groups(
        self, sampling: dict[str, Any], indices: Sequence[int], groups: Groups
    ) -> list[dict[str, Any]]:
        """The prompts of ``indices``, one batched ``/generate`` per group of positions, each
        answered before the next: an idle engine admits a call's requests in one iteration, so each
        group is one prefill forward."""
        self._admission_cap()
        answers: list[dict[str, Any] | None] = [None] * len(indices)
        for group in groups:
            got = self.server.client.generate(
                **generate_input([self.prompts[indices[p]] for p in group]),
                sampling_params=sampling,
                rids=[_next_rid() for _ in group],
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
    ) -> _Window:
        """One flushed, metered window of ``indices``: refilled ``batch`` at a time, or replayed by
        ``groups``."""
        client = self.server.client
        client.flush_cache()
        before = client.server_info()
        sent: list[float | None] = [None] * len(indices)

        def run(first: bool) -> list[dict[str, Any]]:
            if groups is not None:
                return self._replay_groups(sampling, indices, groups)
            return self._run(sampling, indices, steady, sent=sent if first else None)

        token = self.meter.start(self.server)
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
        concurrency = concurrency_between(before, after)
        counters = tuple(tuple(parse_meta_info(a["meta_info"]) for a in loop) for loop in answers)
        outputs = tuple(
            tuple(tuple(int(t) for t in a["output_ids"]) for a in loop) for loop in answers
        )
        return _Window(
            energy,
            len(answers),
            counters,
            outputs,
            concurrency,
            tuple(indices),
            replay_misses=_misses(before, after) if self.replay is not None else 0,
            sent=tuple(sent),
            wall_s=wall_s,
            groups=groups or (),
            grouping=grouping,
        )

    def _prefill_window(self, full: _Window) -> _Window:
        """The prefill-only window of what ``full`` prefilled: its own prefill forwards where the
        meter priced them (the twin's), else or with ``run_twin`` the twin run
        (``docs/design/measure.md``, "Pricing the twin")."""
        priced = full.energy.prefill_only
        prefilled = full.prefilled()
        if (
            priced is not None
            and not self.run_twin
            and full.energy.request_decode_seconds is not None
        ):
            return _Window(
                priced,
                full.loops,
                (),
                (),
                {},
                tuple(full.indices[p] for p in prefilled),
                grouping=PRICED,
            )
        # The twin, grouped as ``full`` prefilled it; sends within half a decode step (wall clock; a
        # default without steps) are one step's refills.
        steps = full.concurrency.get("steps")
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
        )

    def _complete(self, full: _Window) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
        """Whole outputs and finish reasons for the pool: the window's, its cut-short prompts
        generated again (unmetered) or, where the partial output prefixes an earlier repeat's whole
        one, that one."""
        outputs, finish = list(full.loop_outputs[0]), [c.finish_type or "?" for c in full.counters]
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
                finish[i] = parse_meta_info(answer["meta_info"]).finish_type or "?"
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

    def warm_up(self) -> None:
        """Discarded runs that bring the engine to its steady state."""
        for _ in range(self.warmup):
            self._run(self.full, range(min(max(self.case.batch, 1), len(self.prompts))))

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

    def _steady_window(self) -> tuple[_Window, tuple[float, ...]]:
        """One repeat's full window, run again (at most :data:`WINDOW_RERUNS` times) while
        :func:`disturbed_mean`, and the dropped (disturbed) windows' means. An undisturbed window is
        kept; when every one was disturbed, the one that ran the most rows per step (nearest the
        declared batch; of equals the later) is kept all the same."""
        tries = [self._window(self.full, range(len(self.prompts)), steady=True)]
        while len(tries) <= WINDOW_RERUNS and disturbed_mean(tries[-1].concurrency) is not None:
            tries.append(self._window(self.full, range(len(self.prompts)), steady=True))
        calm = disturbed_mean(tries[-1].concurrency) is None  # so only it can lack a mean
        kept = (
            tries[-1] if calm else max(reversed(tries), key=lambda w: w.concurrency["mean_running"])
        )
        return kept, tuple(w.concurrency["mean_running"] for w in tries if w is not kept)

    def measure_repeat(self, arm: str) -> ArmRepeat:
        """A flushed steady-state window, then a flushed prefill-only one of what it prefilled; a
        repeat that timed no decode (a stall) is measured again up to :data:`WINDOW_RERUNS` times,
        the last kept for the checks."""
        started = time.time()
        dropped: list[float] = []
        unlike: list[float] = []
        while True:
            full, disturbed = self._steady_window()
            dropped += disturbed
            sample = _sample(self._prefill_window(full), full)
            if sample.decode_seconds > 0 or len(unlike) >= WINDOW_RERUNS:
                break
            unlike.append(sample.decode_seconds)
        # Only the kept window's cut prompts are generated again (unmetered, after its twin).
        outputs, finish = self._complete(full)
        if unlike:
            sample = dataclasses.replace(
                sample, window={**sample.window, "rerun_decode_seconds": unlike}
            )
        # The share of the pool's decode tokens (whole outputs less prefill's first token) made
        # inside the window, per loop: arms whose windows close at different points cover different
        # requests (issue 21 item 3).
        pool = sum(max(len(o) - 1, 0) for o in outputs)
        sample = dataclasses.replace(
            sample, coverage=full.decode_tokens_per_loop / pool if pool else None
        )
        # Every arm but the baseline (the speculative arm, an A/B reference or a replay) has
        # speculative counters.
        problems = (
            []
            if arm == "baseline"
            else [
                p
                for loop in full.loop_counters
                for p in counter_problems(loop, self.case.drafter.num_draft_tokens)
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
            concurrency={**full.concurrency, "rerun_means": list(dropped)}
            if dropped
            else full.concurrency,
            stable=full.loops_agree,
            problems=tuple(problems),
            replay_problems=replay_problems,
            finished=time.time(),
        )

    def result(self, arm: str, repeats: Sequence[ArmRepeat]) -> RunResult:
        """The arm's record over ``repeats``."""
        drafter = self.case.drafter if arm != "baseline" else None
        first = repeats[0].outputs if repeats else ()
        return RunResult(
            arm=arm,
            engine=self.server.describe(),
            source=self.meter.label,
            samples=tuple(r.sample for r in repeats),
            outputs=first,
            finish_reasons=repeats[-1].finish if repeats else (),
            verified_per_step=drafter.num_draft_tokens + 1 if drafter else 1,
            concurrency=arm_concurrency(
                self.case.batch, [r.concurrency for r in repeats], len(self.prompts)
            ),
            outputs_stable=all(r.stable and r.outputs == first for r in repeats),
            counter_problems=tuple(dict.fromkeys(p for r in repeats for p in r.problems)),
            replay_problems=tuple(dict.fromkeys(p for r in repeats for p in r.replay_problems)),
        )

    def measure(self, arm: str) -> RunResult:
        """Warm up, then ``repeats`` flushed prefill/full window pairs back to back."""
        self.warm_up()
        return self.result(arm, [self.measure_repeat(arm) for _ in range(self.repeats)])


#: Seconds between two rounds of per-rid aborts at a window's close. Shorter than one decode step of
#: any engine here (about 40 ms on a CPU SGLang server), so a request the first round missed runs at
#: most a step or two more; each round is one small HTTP call per request.
ABORT_RETRY_S = 0.02


class AbortError(RuntimeError):
    """A window's close could not cut every request still in flight."""


def abort_until_answered(
    client: Any,
    pending: Callable[[], set[str]],
    *,
    retry_s: float = ABORT_RETRY_S,
    deadline_s: float | None = None,
) -> int:
    """End a steady-state window: one ``abort_all``, then every rid of ``pending()`` (sent, not
    answered) aborted by rid every ``retry_s`` until none is left (why: ``docs/design/measure.md``,
    "Aborting by rid"). Returns the rounds by rid; raises :class:`AbortError` past ``deadline_s``
    (default: the client's request timeout) or when the engine refuses ``/abort_request``."""
    limit = deadline_s if deadline_s is not None else float(getattr(client, "timeout_s", 300.0))
    try:
        client.abort()
    except Exception as exc:
        raise AbortError(
            f"the engine refused /abort_request ({exc}); the steady-state window needs it to end "
            f"without a drain at falling concurrency"
        ) from None
    started, rounds = time.monotonic(), 0
    while True:
        time.sleep(retry_s)
        left = pending()
        if not left:
            return rounds
        if time.monotonic() - started > limit:
            raise AbortError(
                f"{len(left)} request(s) ({', '.join(sorted(left))}) still unanswered {limit:g} s "
                f"after the window closed, through {rounds} round(s) of aborts by rid: the engine "
                "does not honour /abort_request, so the window would include a drain"
            )
        rounds += 1
        for rid in sorted(left):
            try:
                client.abort(rid)
            except Exception as exc:
                raise AbortError(f"/abort_request for rid {rid} failed: {exc}") from None


#: Times one repeat's full window is run again when the host disturbed it (:func:`disturbed_mean`),
#: and times a repeat is measured again when it measured no decode (``measure_repeat``). Two: on
#: CI's 2 shared cores a live SGLang A/A baseline window fell to 3.76 of 4 and its one rerun to
#: 3.31, failing an A/A pair on the host alone.
WINDOW_RERUNS = 2


def disturbed_mean(concurrency: dict[str, Any]) -> float | None:
    """A full window's mean rows per decode step when it fell more than
    ``MAX_CONCURRENCY_GAP_SHARE`` of its own peak below that peak, as a loaded host makes a window's
    edges (``docs/design/measure.md``, "Disturbed windows"), else None (also for a window without a
    step record). An engine's own lower peak is left to the checks."""
    mean, peak = concurrency.get("mean_running"), concurrency.get("max_running")
    return (
        None
        if mean is None or not peak or mean >= (1 - MAX_CONCURRENCY_GAP_SHARE) * peak
        else float(mean)
    )


def arm_concurrency(batch: int, windows: Sequence[dict[str, Any]], pool: int) -> dict[str, Any]:
    """What ran over an arm's full windows: the merged step record, each window's mean
    (``window_means``: the worst repeat shows) and the means of windows run again as the host
    disturbed them (``rerun_means``, only if any)."""
    merged = merge_concurrency(windows) if windows else {}
    means = [w.get("mean_running") for w in windows]
    reruns = [m for w in windows for m in w.get("rerun_means", ())]
    return {
        "requested": batch,
        "pool": pool,
        **merged,
        "window_means": None if any(m is None for m in means) else means,
        **({"rerun_means": reruns} if reruns else {}),
    }


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


def _sample(prefill: _Window, full: _Window) -> RepeatSample:
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
        verify_steps=_per_loop_total(full, "spec_verify_ct"),
        correct_drafts=_per_loop_total(full, "spec_num_correct_drafts"),
        proposed_drafts=_per_loop_total(full, "spec_num_proposed_drafts"),
        loops=full.loops,
        window={"full": _window_facts(full), "prefill": _window_facts(prefill)},
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


def _per_loop_total(window: _Window, field_name: str) -> int | float | None:
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


def _window_facts(window: _Window) -> dict[str, Any]:
    facts = {
        "joules": window.energy.joules,
        "seconds": window.energy.seconds,
        "loops": window.loops,
        "requests": len(window.indices),
        "source": window.energy.source,
        "details": dict(window.energy.details),
    }
    if window.grouping == PRICED:  # no run: no requests' counters, only the priced steps
        return {**facts, "grouping": PRICED}
    return {
        **facts,
        "tokens_per_loop": window.tokens_per_loop,
        "prefilled": [len(window.prefilled(n)) for n in range(window.loops)],
        "aborted": [len(window.aborted(n)) for n in range(window.loops)],
        "concurrency": window.concurrency,
        **(
            {"groups": [len(g) for g in window.groups], "grouping": window.grouping}
            if window.grouping
            else {}
        ),
    }
