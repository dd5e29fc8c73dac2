"""From a :class:`Case` to a :class:`PairResult`: engines, meters, shared baselines, repeats, from
plain values (it knows nothing of pytest, the gate or the session). Interleaved arms, shared
baselines, GPU residency and replay arms: ``docs/design/measure.md``, section
``pytest_specenergy/measure/pairs.py``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any
from typing import Callable

from pytest_specenergy.cases.case import Case
from pytest_specenergy.document import MeterFacts
from pytest_specenergy.document import RepeatEntry
from pytest_specenergy.document import ResidencyFacts
from pytest_specenergy.document import Restart
from pytest_specenergy.document import RunOrder
from pytest_specenergy.engines.base import Pool
from pytest_specenergy.engines.base import Server
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.engines.sglang_residency import Residency
from pytest_specenergy.engines.sglang_residency import decide as decide_residency
from pytest_specenergy.engines.sglang_residency import resident_config
from pytest_specenergy.measure.arm import ArmMeasurer
from pytest_specenergy.measure.arm import ArmRepeat
from pytest_specenergy.measure.arm import Drafts
from pytest_specenergy.measure.checks import checked
from pytest_specenergy.measure.coherence import Coherence
from pytest_specenergy.measure.coherence import measure_coherence
from pytest_specenergy.measure.cycles import ArmSpec
from pytest_specenergy.measure.cycles import CyclePlan
from pytest_specenergy.measure.removal import check_mode
from pytest_specenergy.measure.removal import removes_drafts
from pytest_specenergy.measure.removal import replays_proposals
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.meters import make_meter
from pytest_specenergy.meters import meter_kind_for
from pytest_specenergy.meters.base import Meter
from pytest_specenergy.meters.nvml import engine_gpu_memory

#: Builds the meter of a kind for an engine, or returns None for the built-in one (the session
#: passes the ``pytest_specenergy_make_meter`` hook here).
MeterFactory = Callable[[str, Server], "Meter | None"]


class PairMeasurer:
    """Measures pairs on pooled engines; one instance per session (or per xdist worker)."""

    def __init__(
        self,
        *,
        log_dir: Path,
        startup_timeout: float,
        meter: str,
        repeats: int,
        warmup: int | None,
        meter_factory: MeterFactory | None = None,
        pool: Pool | None = None,
        cooldown_s: float = 0.0,
        draft_removal: str = "auto",
        progress: Callable[[int, str], None] | None = None,
        gpu_memory: Callable[[], int | None] | None = None,
        server_fields: Callable[[], frozenset[str] | None] | None = None,
    ) -> None:
        if cooldown_s < 0:
            raise ValueError(f"cooldown must be >= 0 seconds, got {cooldown_s!r}")
        self.draft_removal = check_mode(draft_removal)
        self.pool: Pool = pool or EnginePool(log_dir, startup_timeout)
        self.cooldown_s = cooldown_s
        #: ``progress(level, text)``: told of every measured repeat (level 1, pytest's ``-v``).
        self.progress = progress
        self.meter_choice = meter
        self.repeats = repeats
        self.warmup = warmup  # None: auto
        #: Run every prefill-only twin, even under a meter that prices the prefill steps.
        self.run_twin = False
        self.meter_factory = meter_factory
        self.planned: list[Case] = []
        #: How the GPU's engines run (None: no GPU case planned); ``plan`` decides it.
        self.residency: Residency | None = None
        #: The GPU's total memory in bytes (NVML by default) and the installed SGLang's ServerArgs
        #: fields: what residency is decided from (tests pass their own).
        self.gpu_memory = gpu_memory or engine_gpu_memory
        self.server_fields = server_fields or _installed_server_fields
        self.meters: dict[str, Meter] = {}
        self._baselines: dict[tuple[Any, ...], RunResult] = {}
        self._baseline_from: dict[tuple[Any, ...], str] = {}
        self._pairs: dict[Case, PairResult] = {}
        #: The engine process each config last measured on: added repeats on another one ran on an
        #: engine restarted since (T35).
        self._servers: dict[EngineConfig, Server] = {}
        #: Baseline keys whose measurement failed while measuring a sibling's (retried once).
        self._sibling_failed: set[tuple[Any, ...]] = set()
        #: Drafts recorded per (drafter engine, batch, corpus, generation), for replay arms.
        self._recorded: dict[tuple[Any, ...], Drafts] = {}

    def plan(self, cases: list[Case]) -> None:
        """Record the collected cases and decide how the GPU's engines run: a case's SGLang engines
        all resident, interleaved, when they fit, else one at a time, blocked (CPU cases keep the
        unbounded pool: no GPU held)."""
        self.planned = cases
        gpu = [
            c
            for c in cases
            if (c.engine == "sglang" and c.device != "cpu") or c.device.startswith("cuda")
        ]
        if not gpu:
            return
        engines = max(3 if c.reference is not None else 2 for c in gpu)
        if any(c.engine != "sglang" for c in gpu):
            self.residency = Residency(
                False, 1, None, "a non-SGLang engine on the GPU (no memory split)"
            )
        else:
            configs = [config for c in gpu for config in _engine_configs(c)]
            self.residency = decide_residency(
                configs, engines, self.gpu_memory(), self.server_fields()
            )
        self.pool.max_live = self.residency.engines if self.residency.resident else 1

    def start_planned(self) -> None:
        """On an unbounded pool (where every engine is kept to the session's end anyway), start
        the planned cases' reference engines side by side before the first case measures, at most
        :data:`PRESTART_MAX`, the first cases' first; the rest start when their case comes.

        A start is mostly imports and model building, single-threaded and partly I/O, so starts
        overlap well (the quickstart's five engines: 15.2 s one by one, 12.0 s together, before
        reference engines were forked from the zygote). SGLang engines are not started ahead: a
        CPU one takes a minute and the cores; GPU ones follow :meth:`plan`'s residency."""
        if self.pool.max_live:
            return
        configs = [
            self.engine_config(config)
            for case in self.planned
            for config in _engine_configs(case)
            if config.engine == "reference"
        ]
        self.pool.start_together(list(dict.fromkeys(configs))[:PRESTART_MAX])

    def engine_config(self, config: EngineConfig) -> EngineConfig:
        """``config`` with its share of GPU memory and ``sleep_on_idle`` when engines are resident
        (:meth:`plan`)."""
        return resident_config(config, self.residency) if self.residency is not None else config

    def meter_for(self, server: Server) -> Meter:
        """The meter for an engine, built once per kind (a conftest hook may supply it)."""
        device = str(server.server_info.get("device") or server.config.device)
        kind = meter_kind_for(self.meter_choice, server.config.engine, device)
        if kind not in self.meters:
            meter = self.meter_factory(kind, server) if self.meter_factory else None
            self.meters[kind] = meter or make_meter(kind)
        return self.meters[kind]

    def _arm(
        self,
        config: EngineConfig,
        case: Case,
        repeats: int,
        warmup: int | None,
        replay: Drafts | None = None,
    ) -> ArmMeasurer:
        server = self.pool.get(self.engine_config(config))
        meter = self.meter_for(server)
        warmup = self._warmup_for(meter) if warmup is None else warmup
        return ArmMeasurer(
            server, meter, case, repeats, warmup, replay=replay, run_twin=self.run_twin
        )

    def _warmup_for(self, meter: Any) -> int:
        """The session's warm-up runs for an engine ``meter`` reads: ``--specenergy-warmup``, or
        auto: 1 where a measured window needs the engine warm, 0 under a modeled meter."""
        if self.warmup is not None:
            return self.warmup
        return 0 if meter.kind.startswith("modeled:") else 1

    def _replay_arms(
        self, case: Case, drafting: tuple[ArmSpec, ...], first: EngineConfig
    ) -> tuple[tuple[ArmSpec, ...], tuple[ArmSpec, ...]]:
        """The drafting arms with those measured on replay engines swapped in (a
        controlled-acceptance drafter under a board meter runs on an engine replaying the
        proposals of its controlled run), and the replay arms added after them (draft removal's
        verify-only replay of the speculative arm; ``measure/removal.py``). ``first``, the engine
        the case starts first anyway, decides the meter."""
        kind = self.meter_for(self.pool.get(self.engine_config(first))).kind
        swapped = tuple(
            ArmSpec(arm.name, arm.case, arm.config.replaying("proposals"), replays=arm.case)
            if replays_proposals(arm.case.drafter, arm.case.engine, kind)
            else arm
            for arm in drafting
        )
        if not removes_drafts(self.draft_removal, case, kind):
            return swapped, ()
        if case.engine != "reference":
            raise RuntimeError(
                f"draft removal replays recorded drafts, which only the reference engine can "
                f"(--drafter replay); {case.id} runs on {case.engine}: use "
                f"--specenergy-draft-removal=auto or off for it"
            )
        removal = ArmSpec("removal", case, case.spec_config().replaying("verify"), replays=case)
        return swapped, (removal,)

    def _drafts(self, arm_case: Case) -> Drafts:
        """``arm_case``'s drafts on its pool, recorded once (unmetered) on its own engine for every
        replay to share."""
        key = (arm_case.spec_config(), arm_case.batch, arm_case.corpus_key, arm_case.generation)
        if key not in self._recorded:
            self._recorded[key] = self._arm(arm_case.spec_config(), arm_case, 0, 0).record_drafts()
        return self._recorded[key]

    def _plan(self, case: Case, with_baseline: bool) -> CyclePlan:
        """The arms of one measurement of ``case`` and their order (:class:`CyclePlan`); on an
        unbounded pool their engines are started side by side first."""
        drafting = [ArmSpec("speculative", case, case.spec_config())]
        if case.reference is not None:
            reference = dataclasses.replace(case, spec=case.reference_config(), reference=None)
            drafting.append(ArmSpec("reference", reference, reference.spec_config()))
        baseline = (ArmSpec("baseline", case, case.baseline_config()),) if with_baseline else ()
        self.pool.start_together([arm.config for arm in (*baseline, *drafting)])
        first = case.baseline_config() if with_baseline else case.spec_config()
        swapped, replay = self._replay_arms(case, tuple(drafting), first)
        return CyclePlan.decide(case, baseline, swapped, replay, self.pool.max_live)

    def _measurer(self, arm: ArmSpec, repeats: int, warmup: int | None) -> ArmMeasurer:
        """The arm's measurer on its engine (a replay arm's with its drafting arm's drafts)."""
        replay = self._drafts(arm.replays) if arm.replays is not None else None
        return self._arm(arm.config, arm.case, repeats, warmup, replay=replay)

    def _interleaved(
        self,
        case: Case,
        repeats: int,
        warmup: int | None,
        with_baseline: bool,
        added: bool = False,
    ) -> tuple[dict[str, RunResult], Server, RunOrder]:
        """``repeats`` of each arm of ``case`` in cycles (:class:`CyclePlan`); each arm's result
        by name, the speculative arm's server, and the order they ran in (``added``: repeats the
        gate asked for after the case's first ones)."""
        plan = self._plan(case, with_baseline)
        run = _CycleRun(plan.arms, repeats)
        if plan.interleaved:
            run.measurers.update(
                (arm.name, self._measurer(arm, repeats, warmup)) for arm in plan.arms
            )
            for name, measurer in run.measurers.items():
                self._warm_up(run, name, measurer, added)
            for cycle in range(repeats):
                for arm in plan.cycle(cycle):
                    self._measure_next(run, arm.name)
        else:
            for arm in plan.arms:  # one engine at a time: each arm's repeats together
                run.measurers[arm.name] = self._measurer(arm, repeats, warmup)
                self._warm_up(run, arm.name, run.measurers[arm.name], added)
                for _ in range(repeats):
                    self._measure_next(run, arm.name)
                if arm.name == "baseline":
                    self._measure_siblings(case)
        residency = self.residency
        order = RunOrder(
            interleaved=plan.interleaved,
            cooldown_s=self.cooldown_s,
            order=tuple(str(entry.arm) for entry in run.entries()),
            repeats=run.entries(),
            restarts=tuple(run.restarts),
            residency=None if residency is None else ResidencyFacts.from_dict(residency.as_dict()),
        )
        return run.results(), run.measurers["speculative"].server, order

    def _warm_up(self, run: _CycleRun, name: str, measurer: ArmMeasurer, added: bool) -> None:
        """An arm's warm-up before its repeats. Among added repeats, an engine that is not the
        process the arm's earlier repeats ran on (it died and was restarted since) is warmed up as
        the session's warm-up says and recorded, as a restart between repeats is (T35); the added
        repeats' own warm-up is none, their engine being warm."""
        config = measurer.server.config
        before = self._servers.get(config)
        self._servers[config] = measurer.server
        if added and before is not None and before is not measurer.server:
            measurer.warm_up(max(measurer.warmup, self._warmup_for(measurer.meter)))
            run.restarts.append(Restart(arm=name, before_repeat=0))
        else:
            measurer.warm_up()

    def _measure_next(self, run: _CycleRun, name: str) -> None:
        """The arm's next repeat on the pool's engine for it: one that died and was restarted is
        warmed up again first, and the run records the restart (the case is flagged)."""
        measurer, index = run.measurers[name], len(run.repeats[name])
        server = self.pool.get(measurer.server.config)
        if server is not measurer.server:
            measurer.server = self._servers[server.config] = server
            # The session's warm-up, not the measurer's: the gate's added repeats start with none
            # (their engine was warm), and a restarted engine among them was measured cold (T35).
            measurer.warm_up(max(measurer.warmup, self._warmup_for(measurer.meter)))
            run.restarts.append(Restart(arm=name, before_repeat=index))
        run.repeats[name].append(self._timed(measurer, name, index, run.total))

    def _measure_siblings(self, case: Case) -> None:
        """On a one-engine pool: every other planned baseline of this engine, while it runs."""
        for other in self.planned:
            key = other.baseline_key()
            if (
                other.baseline_config() != case.baseline_config()
                or key == case.baseline_key()
                or key in self._baselines
                or key in self._sibling_failed
            ):
                continue
            try:
                measurer = self._arm(other.baseline_config(), other, self.repeats, None)
                measurer.warm_up()
                self._baselines[key] = measurer.result(
                    "baseline",
                    [
                        self._timed(measurer, "baseline", i, self.repeats)
                        for i in range(self.repeats)
                    ],
                )
                self._baseline_from[key] = f"{other.id} (measured ahead, with {case.id})"
            except Exception:  # noqa: BLE001 - reported when the sibling itself runs
                self._sibling_failed.add(key)

    def _timed(self, measurer: ArmMeasurer, arm: str, index: int, total: int) -> ArmRepeat:
        if self.cooldown_s:
            time.sleep(self.cooldown_s)
        began = time.monotonic()
        repeat = measurer.measure_repeat(arm)
        if self.progress is not None:
            self.progress(
                1,
                f"{measurer.case.id} {arm} repeat {index + 1}/{total} "
                f"({time.monotonic() - began:.1f} s)",
            )
        return repeat

    def baseline(self, case: Case) -> RunResult:
        """The shared baseline arm for ``case`` (measured with the first pair that needs it)."""
        key = case.baseline_key()
        if key not in self._baselines:
            self.measure(case)
        return self._baselines[key]

    def measured(self, case: Case) -> bool:
        """Whether ``case`` has been measured this session."""
        return case in self._pairs

    def measure(self, case: Case) -> PairResult:
        """The pair for ``case``, measured once per session, its arms interleaved."""
        if case not in self._pairs:
            key = case.baseline_key()
            shared = key in self._baselines
            arms, server, order = self._interleaved(
                case, self.repeats, None, with_baseline=not shared
            )
            if shared:
                order = dataclasses.replace(order, baseline_from=self._baseline_from[key])
            else:
                self._baselines[key], self._baseline_from[key] = arms["baseline"], case.id
            baseline = self._baselines[key]

            # Scoring is a prefill (max_new_tokens=0) on the engine already running; it never
            # speculates, so the speculative engine scores as its twin would. Prompt ids are asked
            # for where the engine has them.
            def scored(run: RunResult) -> Coherence:
                return measure_coherence(
                    server.client,
                    case.pool(),
                    baseline.outputs,
                    run.outputs,
                    server.special_token_ids,
                    server.backend.returns_prompt_token_ids,
                    tie_margins=True,
                )

            # The reference drafter's divergences are classified too: an A/B compares match
            # fractions, ties counting as matches on both sides.
            reference = arms.get("reference")
            self._pairs[case] = checked(
                PairResult(
                    case,
                    case.id,
                    baseline,
                    arms["speculative"],
                    scored(arms["speculative"]),
                    order=order,
                    reference=reference,
                    removal=arms.get("removal"),
                    reference_coherence=None if reference is None else scored(reference),
                )
            )
        return self._pairs[case]

    def add_repeats(self, case: Case, extra: int) -> PairResult:
        """``extra`` more interleaved repeats of every arm (asked by an INCONCLUSIVE verdict); the
        baseline grows."""
        pair = self.measure(case)
        more, _, order = self._interleaved(case, extra, 0, with_baseline=True, added=True)
        grown = {
            name: pair.arms[name].extended(run) for name, run in more.items() if name in pair.arms
        }
        self._baselines[case.baseline_key()] = grown["baseline"]
        merged = _added(pair.order, order)
        self._pairs[case] = checked(dataclasses.replace(pair, order=merged, **grown))
        return self._pairs[case]

    def meter_description(self, label: str) -> MeterFacts | None:
        """The description of the meter whose label is ``label``, if one was used."""
        for meter in self.meters.values():
            description = MeterFacts.from_dict(meter.describe(), f"meter {meter.kind}")
            # One modeled meter prices several engines, each under its own label.
            if label == meter.label or label in (description.labels or ()):
                return dataclasses.replace(description, label=label)
        return None

    def describe_meters(self) -> dict[str, MeterFacts]:
        """Each meter used this session, described."""
        return {
            kind: MeterFacts.from_dict(meter.describe(), f"meter {kind}")
            for kind, meter in self.meters.items()
        }

    def close(self) -> None:
        """Stop every engine and release meters."""
        self.pool.close()
        for meter in self.meters.values():
            meter.close()


class _CycleRun:
    """What one measurement of a case has run so far: each arm's measurer and repeats, and the
    engines restarted between them."""

    def __init__(self, arms: tuple[ArmSpec, ...], total: int) -> None:
        self.total = total
        self.measurers: dict[str, ArmMeasurer] = {}
        self.repeats: dict[str, list[ArmRepeat]] = {arm.name: [] for arm in arms}
        self.restarts: list[Restart] = []

    def results(self) -> dict[str, RunResult]:
        """Each arm's result over its repeats."""
        return {name: self.measurers[name].result(name, rs) for name, rs in self.repeats.items()}

    def entries(self) -> tuple[RepeatEntry, ...]:
        """Every repeat in the order they started: arm, index, wall-clock start and finish."""
        entries = (
            RepeatEntry(arm=name, repeat=i, started=r.started, finished=r.finished)
            for name, repeats in self.repeats.items()
            for i, r in enumerate(repeats)
        )
        return tuple(sorted(entries, key=lambda e: e.started or 0.0))


#: Reference engines :meth:`PairMeasurer.start_planned` starts at once (a tiny model's takes about
#: 0.4 GB; a checkpoint's more).
PRESTART_MAX = 6


def _engine_configs(case: Case) -> list[EngineConfig]:
    reference = case.reference_config()
    return [case.baseline_config(), case.spec_config(), *([reference] if reference else [])]


def _installed_server_fields() -> frozenset[str] | None:
    # imported here: only a plan with a GPU case asks, and the SGLang tables cost a CPU session ~13
    # ms to import
    from pytest_specenergy.engines.sglang_args import installed_server_args_fields

    return installed_server_args_fields()


def _added(order: RunOrder, more: RunOrder) -> RunOrder:
    """``order`` with the repeats of ``more`` (run after it, for the gate) appended: their indices
    continue each arm's, they are marked ``added``, and engines restarted among them are kept."""
    offset = {arm: order.order.count(arm) for arm in set(more.order)}
    return dataclasses.replace(
        order,
        order=order.order + more.order,
        repeats=order.repeats
        + tuple(
            dataclasses.replace(e, repeat=(e.repeat or 0) + offset[str(e.arm)], added=True)
            for e in more.repeats
        ),
        restarts=order.restarts
        + tuple(
            dataclasses.replace(r, before_repeat=(r.before_repeat or 0) + offset[str(r.arm)])
            for r in more.restarts
        ),
        interleaved=order.interleaved and more.interleaved,
    )
