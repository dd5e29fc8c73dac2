"""From a :class:`Case` to a :class:`PairResult`: engines, meters, shared baselines, repeats, from
plain values (it knows nothing of pytest, the gate or the session). Interleaved arms, shared
baselines, GPU residency and replay arms:
``docs/methodology.md#interleaved-arms-and-shared-baselines``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Callable

from pytest_specenergy.cases.case import Case
from pytest_specenergy.document import MeterFacts
from pytest_specenergy.document import RepeatEntry
from pytest_specenergy.document import ResidencyFacts
from pytest_specenergy.document import Restart
from pytest_specenergy.document import RunOrder
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.base import Pool
from pytest_specenergy.engines.base import Server
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.kv_pools import capacity_problems
from pytest_specenergy.engines.pool import EnginePool
from pytest_specenergy.engines.sglang_residency import Residency
from pytest_specenergy.engines.sglang_residency import resident_config
from pytest_specenergy.measure.arm import ArmMeasurer
from pytest_specenergy.measure.arm import ArmRepeat
from pytest_specenergy.measure.arm import Drafts
from pytest_specenergy.measure.checks import checked
from pytest_specenergy.measure.checks import with_control
from pytest_specenergy.measure.coherence import Coherence
from pytest_specenergy.measure.coherence import measure_coherence
from pytest_specenergy.measure.cycles import ArmSpec
from pytest_specenergy.measure.cycles import CyclePlan
from pytest_specenergy.measure.cycles import group_engines
from pytest_specenergy.measure.removal import check_mode
from pytest_specenergy.measure.removal import removes_drafts
from pytest_specenergy.measure.removal import replays_proposals
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult
from pytest_specenergy.meters import make_meter
from pytest_specenergy.meters import meter_kind_for
from pytest_specenergy.meters.base import Meter
from pytest_specenergy.meters.nvml import engine_gpu_memory
from pytest_specenergy.plan.residency import engine_configs
from pytest_specenergy.plan.residency import gpu_residency

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
        self._planned_set: frozenset[Case] = frozenset()
        #: How the GPU's engines run (None: no GPU case planned); ``plan`` decides it.
        self.residency: Residency | None = None
        #: The GPU's total memory in bytes (NVML by default) and the installed SGLang's ServerArgs
        #: fields: what residency is decided from (tests pass their own).
        self.gpu_memory = gpu_memory or engine_gpu_memory
        self.server_fields = server_fields or installed_server_fields
        self.meters: dict[str, Meter] = {}
        #: Each engine's ``/server_info`` from its start, by config: a blocked case compares its
        #: arms' KV pools against an engine stopped since (the baseline's).
        self._start_infos: dict[EngineConfig, dict[str, Any]] = {}
        self._baselines: dict[tuple[Any, ...], RunResult] = {}
        #: Each measured case's baseline arm over every prompt it measured (its pair's baseline is
        #: cut to the prompts its arms share): what added repeats extend.
        self._baseline_of: dict[Case, RunResult] = {}
        self._baseline_from: dict[tuple[Any, ...], str] = {}
        self._pairs: dict[Case, PairResult] = {}
        #: The engine process each config last measured on: added repeats on another one ran on an
        #: engine restarted since (T35).
        self._servers: dict[EngineConfig, Server] = {}
        #: Baseline keys whose measurement failed while measuring a sibling's (retried once).
        self._sibling_failed: set[tuple[Any, ...]] = set()
        #: Drafts recorded per (drafter engine, batch, corpus, generation), for replay arms.
        self._recorded: dict[tuple[Any, ...], Drafts] = {}
        #: The cases each case was measured with (its cycles' members, itself included).
        self._group_of: dict[Case, tuple[Case, ...]] = {}
        #: Cases whose arm failed in a group measurement: measured alone when their test comes.
        self._alone: set[Case] = set()
        #: The owner of the arm being started or measured (None: the baseline), for a failure.
        self._failing: Case | None = None

    def plan(self, cases: list[Case]) -> None:
        """Record the collected cases and decide how the GPU's engines run: a case's SGLang engines
        all resident, interleaved, when they fit, else one at a time, blocked (CPU cases keep the
        unbounded pool: no GPU held)."""
        self.planned = cases
        self._planned_set = frozenset(cases)
        self.residency = gpu_residency(cases, self.gpu_memory, self.server_fields)
        if self.residency is not None:
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
            for config in engine_configs(case)
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
            # The pool's other live engines (resident siblings) are the plugin's own processes
            # to the NVML meter's contamination check, not another user's.
            self.meters[kind] = meter or make_meter(kind, own_pids=self.pool.pids)
        return self.meters[kind]

    def _arm(
        self,
        config: EngineConfig,
        case: Case,
        repeats: int,
        warmup: int | None,
        replay: Drafts | None = None,
        twin: EngineConfig | None = None,
        first_repeat: int = 0,
    ) -> ArmMeasurer:
        server = self.pool.get(self.engine_config(config))
        self._start_infos.setdefault(config, dict(server.server_info))
        meter = self.meter_for(server)
        warmup = self._warmup_for(meter) if warmup is None else warmup
        return ArmMeasurer(
            server,
            meter,
            case,
            repeats,
            warmup,
            replay=replay,
            run_twin=self.run_twin,
            twin_server=None if twin is None else self.pool.get(self.engine_config(twin)),
            first_repeat=first_repeat,
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

    def _plan(self, members: tuple[Case, ...], with_baseline: bool) -> CyclePlan:
        """The arms of one measurement of ``members`` (cases sharing one baseline arm) and their
        order (:class:`CyclePlan`); on an unbounded pool their engines are started side by side
        first."""
        case = members[0]
        drafting: list[ArmSpec] = []
        replay: list[ArmSpec] = []
        baseline = (ArmSpec("baseline", case, case.baseline_config()),) if with_baseline else ()
        own = {
            member: _drafting_arms(member) for member in members
        }  # each case's speculative (and reference) arm
        self.pool.start_together(
            [arm.config for arm in baseline] + [a.config for arms in own.values() for a in arms]
        )
        first = case.baseline_config() if with_baseline else case.spec_config()
        for slot, (member, arms) in enumerate(own.items()):
            swapped, replays = self._replay_arms(member, arms, first)
            drafting += [dataclasses.replace(arm, owner=member, slot=slot) for arm in swapped]
            replay += [dataclasses.replace(arm, owner=member, slot=slot) for arm in replays]
        return CyclePlan.decide(
            case, baseline, tuple(drafting), tuple(replay), self.pool.max_live, members
        )

    def _measurer(
        self,
        arm: ArmSpec,
        repeats: int,
        warmup: int | None,
        twin: EngineConfig | None = None,
        first_repeat: int = 0,
    ) -> ArmMeasurer:
        """The arm's measurer on its engine (a replay arm's with its drafting arm's drafts), its
        prefill-only twin on ``twin``'s engine (None: its own)."""
        replay = self._drafts(arm.replays) if arm.replays is not None else None
        return self._arm(
            arm.config,
            arm.case,
            repeats,
            warmup,
            replay=replay,
            twin=twin,
            first_repeat=first_repeat,
        )

    def _twin_for(self, plan: CyclePlan, arm: ArmSpec, with_baseline: bool) -> EngineConfig | None:
        """Where ``arm``'s prefill-only twin runs: a drafting arm's on the non-speculative twin
        engine when the pool holds it beside the arm's (so the target's prefill alone is
        subtracted, and a draft model's prefill of the same prompts stays the speculative arm's,
        issue 41 item 2); else (the baseline, a replay arm, a blocked order) on its own engine."""
        if arm not in plan.drafting or not plan.interleaved:
            return None
        live = len(plan.arms) + (0 if with_baseline else 1)
        if self.pool.max_live and self.pool.max_live < live:
            return None
        return plan.case.baseline_config()

    def _check_pools(self, case: Case, measurers: dict[str, ArmMeasurer]) -> None:
        """Before the first window: the arms' SGLang KV pools, from each engine's ``/server_info``
        at its start (a blocked case's earlier arms' engines may be stopped since), must be equal
        (and the planned size); else the case is refused with the problems, before any warm-up."""
        if case.engine != "sglang":
            return
        infos = {
            name: self._start_infos.get(m.server.config, m.server.server_info)
            for name, m in measurers.items()
        }
        if "baseline" not in infos:  # a shared baseline: its engine's start info
            infos = {"baseline": self._start_infos.get(case.baseline_config(), {}), **infos}
        pools = self.residency.pools if self.residency is not None else None
        problems = capacity_problems(infos, None if pools is None else pools.tokens)
        if problems:
            raise EngineConfigError(f"{case.id}: " + "; ".join(problems))

    def _interleaved(
        self,
        members: tuple[Case, ...],
        repeats: int,
        warmup: int | None,
        with_baseline: bool,
        first_repeat: int = 0,
        added: bool = False,
    ) -> dict[Case, _Measured]:
        """``repeats`` of each arm of ``members`` in cycles (:class:`CyclePlan`), numbered from
        ``first_repeat`` (which picks each window's prompts); per case its arms' results by name
        (the baseline shared), its speculative arm's server, and the order its arms ran in
        (``added``: repeats the gate asked for after the cases' first ones). An arm that fails
        leaves its owner in :attr:`_failing` (None: the baseline) before the error propagates."""
        self._failing = None
        plan = self._plan(members, with_baseline)
        run = _CycleRun(plan.arms, repeats)

        def measurer(arm: ArmSpec) -> ArmMeasurer:
            twin = self._twin_for(plan, arm, with_baseline)
            return self._measurer(arm, repeats, warmup, twin, first_repeat)

        if plan.interleaved:
            for arm in plan.arms:
                self._failing = arm.owner
                run.measurers[arm.key] = measurer(arm)
            self._check_pools(plan.case, run.measurers)
            for arm in plan.arms:
                self._failing = arm.owner
                self._warm_up(run, arm.key, run.measurers[arm.key], added)
            for cycle in range(repeats):
                for arm in plan.cycle(cycle):
                    self._failing = arm.owner
                    self._measure_next(run, arm.key)
        else:
            for arm in plan.arms:  # one engine at a time: each arm's repeats together
                self._failing = arm.owner
                run.measurers[arm.key] = measurer(arm)
                self._check_pools(plan.case, run.measurers)
                self._warm_up(run, arm.key, run.measurers[arm.key], added)
                for _ in range(repeats):
                    self._measure_next(run, arm.key)
                if arm.name == "baseline":
                    self._measure_siblings(plan.case)
        self._failing = None
        residency = self.residency
        results = run.results()
        measured: dict[Case, _Measured] = {}
        for member in plan.members:
            arms = plan.arms_of(member)
            names = {arm.key: arm.name for arm in arms}
            entries = run.entries(names)
            order = RunOrder(
                interleaved=plan.interleaved,
                cooldown_s=self.cooldown_s,
                order=tuple(str(entry.arm) for entry in entries),
                repeats=entries,
                restarts=tuple(
                    dataclasses.replace(r, arm=names[str(r.arm)])
                    for r in run.restarts
                    if str(r.arm) in names
                ),
                residency=None
                if residency is None
                else ResidencyFacts.from_dict(residency.as_dict()),
                cycled_with=tuple(other.id for other in plan.members if other != member),
            )
            spec = next(arm.key for arm in arms if arm.name == "speculative")
            measured[member] = _Measured(
                {arm.name: results[arm.key] for arm in arms}, run.measurers[spec].server, order
            )
        return measured

    def _warm_up(self, run: _CycleRun, key: str, measurer: ArmMeasurer, added: bool) -> None:
        """An arm's warm-up before its repeats. Among added repeats, an engine that is not the
        process the arm's earlier repeats ran on (it died and was restarted since) is warmed up as
        the session's warm-up says and recorded, as a restart between repeats is (T35); the added
        repeats' own warm-up is none, their engine being warm."""
        config = measurer.server.config
        before = self._servers.get(config)
        self._servers[config] = measurer.server
        if added and before is not None and before is not measurer.server:
            measurer.warm_up(max(measurer.warmup, self._warmup_for(measurer.meter)))
            run.restarts.append(Restart(arm=key, before_repeat=0))
        else:
            measurer.warm_up()

    def _measure_next(self, run: _CycleRun, key: str) -> None:
        """The arm's next repeat on the pool's engine for it: one that died and was restarted is
        warmed up again first, and the run records the restart (the case is flagged)."""
        measurer, index = run.measurers[key], len(run.repeats[key])
        server = self.pool.get(measurer.server.config)
        if server is not measurer.server:
            measurer.server = self._servers[server.config] = server
            # The session's warm-up, not the measurer's: the gate's added repeats start with none
            # (their engine was warm), and a restarted engine among them was measured cold (T35).
            measurer.warm_up(max(measurer.warmup, self._warmup_for(measurer.meter)))
            run.restarts.append(Restart(arm=key, before_repeat=index))
        run.repeats[key].append(self._timed(measurer, run.names[key], index, run.total))

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

    def _group(self, case: Case) -> tuple[Case, ...]:
        """The cases measured with ``case`` in the same cycles, ``case`` first: the planned cases
        sharing its baseline arm not measured yet (nor left to measure alone after their arm
        failed in a group), as many as the pool holds at once (the rest get cycles of their own,
        with the baseline again, when their tests come). The grouping depends on the planned cases
        alone, never on which of them a worker runs first, so under xdist a case's cycles are the
        same on any worker."""
        key = case.baseline_key()
        group = [case]
        for other in dict.fromkeys(self.planned):
            if (
                other == case
                or other.baseline_key() != key
                or other in self._pairs
                or other in self._alone
            ):
                continue
            if self.pool.max_live and group_engines((*group, other)) > self.pool.max_live:
                break
            group.append(other)
        return tuple(group)

    def _shares_baseline(self, case: Case) -> bool:
        """Whether ``case`` is judged against a baseline measured before it (unpaired): only a case
        the plan did not hold (the cycles of its siblings already ran), or on a pool of one engine
        at a time, where no case is paired and a baseline measured ahead saves a restart."""
        if case.baseline_key() not in self._baselines:
            return False
        return case not in self._planned_set or self.pool.max_live == 1

    def _measure_group(self, members: tuple[Case, ...], shared: bool) -> dict[Case, _Measured]:
        """One measurement of ``members``; an arm of another member that fails (an engine that
        will not start, a request refused) leaves that member out, to fail on its own when its
        test measures it, and the rest are measured again without it."""
        while True:
            try:
                return self._interleaved(members, self.repeats, None, with_baseline=not shared)
            except Exception:
                culprit = self._failing
                if len(members) < 2 or culprit is None or culprit == members[0]:
                    raise
                self._alone.add(culprit)
                members = tuple(m for m in members if m != culprit)

    def measure(self, case: Case) -> PairResult:
        """The pair for ``case``, measured once per session in the same interleaved cycles as
        every planned case that shares its baseline arm (their pairs are kept for their tests)."""
        if case not in self._pairs:
            key = case.baseline_key()
            shared = self._shares_baseline(case)
            members = (case,) if shared else self._group(case)
            measured = self._measure_group(members, shared)
            if not shared and key not in self._baselines:
                self._baselines[key] = measured[case].arms["baseline"]
                self._baseline_from[key] = case.id
            for member, share in measured.items():
                order, baseline = share.order, share.arms.get("baseline")
                if shared:
                    order = dataclasses.replace(order, baseline_from=self._baseline_from[key])
                    baseline = self._baselines[key]
                self._group_of[member] = tuple(measured)
                assert baseline is not None  # measured unless shared
                self._baseline_of[member] = baseline
                self._pairs[member] = self._pair(member, share, order, baseline)
            self._check_against_control(tuple(measured))
        return self._pairs[case]

    def _control_of(self, case: Case) -> Case | None:
        """The A/A control (drafter ``none``) measured in ``case``'s cycles, the first if several;
        None for a control itself, or where none was measured with it (a control measured in
        other cycles saw other windows, so it is no control of this case's outputs)."""
        if case.drafter.name == "none":
            return None
        return next(
            (
                other
                for other in self._group_of.get(case, ())
                if other.drafter.name == "none"
                and other.baseline_key() == case.baseline_key()
                and other in self._pairs
            ),
            None,
        )

    def _check_against_control(self, members: tuple[Case, ...]) -> None:
        """Each of ``members`` (just paired) checked against the A/A control of its cycles, where
        one was measured (:func:`~.checks.control_checks`); once every member is paired, as the
        control may come after the case in the group."""
        for member in members:
            control = self._control_of(member)
            if control is not None:
                self._pairs[member] = with_control(self._pairs[member], self._pairs[control])

    def _pair(
        self, case: Case, share: _Measured, order: RunOrder, baseline: RunResult
    ) -> PairResult:
        """``case``'s checked pair from its share of a measurement, its text scored: outputs
        compared on the prompts every arm measured (a shared baseline may have measured more
        repeats, so more prompts)."""
        server = share.server
        arms = {name: run for name, run in share.arms.items() if name != "baseline"}
        common = set(baseline.by_prompt())
        for run in arms.values():
            common &= set(run.by_prompt())
        prompts = tuple(sorted(common))
        baseline = baseline.on_prompts(prompts)
        arms = {name: run.on_prompts(prompts) for name, run in arms.items()}
        pool = case.pool()

        # Scoring is a prefill (max_new_tokens=0) on the engine already running; it never
        # speculates, so the speculative engine scores as its twin would. Prompt ids are asked
        # for where the engine has them.
        def scored(run: RunResult) -> Coherence:
            return measure_coherence(
                server.client,
                [pool[i] for i in prompts],
                baseline.outputs,
                run.outputs,
                server.special_token_ids,
                server.backend.returns_prompt_token_ids,
                tie_margins=True,
            )

        # The reference drafter's divergences are classified too: an A/B compares match
        # fractions, ties counting as matches on both sides.
        reference = arms.get("reference")
        return checked(
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

    def add_repeats(self, case: Case, extra: int) -> PairResult:
        """``extra`` more interleaved repeats of every arm (asked by an INCONCLUSIVE verdict), in
        cycles with the cases ``case`` was measured with, so each stays paired; the baseline
        grows, and so do their pairs."""
        done = len(self.measure(case).speculative.samples)
        members = tuple(m for m in self._group_of.get(case, (case,)) if m in self._pairs)
        members = (case, *(m for m in members if m != case))
        more = self._interleaved(
            members, extra, 0, with_baseline=True, first_repeat=done, added=True
        )
        key = case.baseline_key()
        # The group's own baseline (every prompt it measured, not a pair's cut to the prompts its
        # arms share) grows; it stays the session's shared baseline if it was.
        grown_baseline = self._baseline_of[case].extended(more[case].arms["baseline"])
        if self._baselines[key] is self._baseline_of[case]:
            self._baselines[key] = grown_baseline
        for member, share in more.items():
            self._baseline_of[member] = grown_baseline
            pair = self._pairs[member]
            grown = {
                name: run.extended(share.arms[name])
                for name, run in pair.arms.items()
                if name != "baseline" and name in share.arms
            }
            merged = _added(pair.order, share.order)
            self._pairs[member] = self._pair(
                member, _Measured(grown, share.server, merged), merged, grown_baseline
            )
        self._check_against_control(tuple(more))
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
    """What one measurement has run so far: each arm's measurer and repeats (by
    :attr:`ArmSpec.key`), and the engines restarted between them."""

    def __init__(self, arms: tuple[ArmSpec, ...], total: int) -> None:
        self.total = total
        self.names = {arm.key: arm.name for arm in arms}
        self.measurers: dict[str, ArmMeasurer] = {}
        self.repeats: dict[str, list[ArmRepeat]] = {arm.key: [] for arm in arms}
        self.restarts: list[Restart] = []

    def results(self) -> dict[str, RunResult]:
        """Each arm's result over its repeats, by key."""
        return {
            key: self.measurers[key].result(self.names[key], rs) for key, rs in self.repeats.items()
        }

    def entries(self, names: dict[str, str]) -> tuple[RepeatEntry, ...]:
        """The repeats of the arms ``names`` maps (key -> name in the record) in the order they
        started: arm, index, wall-clock start and finish."""
        entries = (
            RepeatEntry(arm=names[key], repeat=i, started=r.started, finished=r.finished)
            for key, repeats in self.repeats.items()
            if key in names
            for i, r in enumerate(repeats)
        )
        return tuple(sorted(entries, key=lambda e: e.started or 0.0))


@dataclass(frozen=True)
class _Measured:
    """One case's share of a measurement: its arms by name, its speculative server, its order."""

    arms: dict[str, RunResult]
    server: Server
    order: RunOrder


def _drafting_arms(case: Case) -> tuple[ArmSpec, ...]:
    """``case``'s drafting arms: its drafter's and, in-job A/B, its reference drafter's."""
    drafting = [ArmSpec("speculative", case, case.spec_config())]
    if case.reference is not None:
        reference = dataclasses.replace(case, spec=case.reference_config(), reference=None)
        drafting.append(ArmSpec("reference", reference, reference.spec_config()))
    return tuple(drafting)


#: Reference engines :meth:`PairMeasurer.start_planned` starts at once (a tiny model's takes about
#: 0.4 GB; a checkpoint's more).
PRESTART_MAX = 6


def installed_server_fields() -> frozenset[str] | None:
    """The installed SGLang's ``ServerArgs`` fields (None: no SGLang)."""
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
