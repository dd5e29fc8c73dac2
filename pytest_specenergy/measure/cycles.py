"""The arms of one measurement and the order their repeats run in.

A measurement runs in cycles: per cycle one repeat of every arm - the baseline (unless it is
shared from a case measured earlier), the drafting arms (each drafter's and, in-job A/B, its
reference), then the verify-only replays of draft removal. Slow drift (the GPU warming, leakage
power rising) then falls on every arm alike, and repeat ``i`` of one arm pairs with repeat ``i``
of the others. Every planned case that shares a baseline arm (same model, batch, corpus and
generation: :meth:`Case.baseline_key`) is measured in the same cycles - baseline, drafter 1,
drafter 2, baseline, ... - so each drafter is paired with the baseline by index and none is
judged against a baseline measured at another time. Where the engines cannot all run at once
(one GPU that holds one engine), the arms run blocked instead: every repeat of one arm, then the
next arm's (``interleaved`` false), and the gate allows for a block drift between them.

:class:`CyclePlan` is that decision, made once from plain values; the pair measurer runs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.config import EngineConfig


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its name in the record, the case it measures and the engine it runs on."""

    name: str
    case: Case
    config: EngineConfig
    #: A replay arm's drafting arm, whose recorded drafts it replays (None: not a replay).
    replays: Case | None = None
    #: The case whose pair holds this arm (None: the baseline, which every case of the plan shares).
    owner: Case | None = None
    #: The owner's place among the plan's members (two cases of different tests may share an id).
    slot: int = 0

    @property
    def key(self) -> str:
        """The arm's name in one measurement of several cases: the owner's slot and the name (the
        record of each case names its arms without the prefix)."""
        return self.name if self.owner is None else f"{self.slot}|{self.name}"


@dataclass(frozen=True)
class CyclePlan:
    """The arms of the cases measured together, in the order of a cycle, and whether the cycles
    interleave them."""

    case: Case
    baseline: tuple[ArmSpec, ...]
    drafting: tuple[ArmSpec, ...]
    replay: tuple[ArmSpec, ...]
    interleaved: bool
    #: Every case measured in these cycles (the first is ``case``); empty: ``case`` alone.
    members: tuple[Case, ...] = ()

    @classmethod
    def decide(
        cls,
        case: Case,
        baseline: tuple[ArmSpec, ...],
        drafting: tuple[ArmSpec, ...],
        replay: tuple[ArmSpec, ...],
        max_live: int,
        members: tuple[Case, ...] = (),
    ) -> CyclePlan:
        """The plan for these arms on a pool that keeps ``max_live`` engines running (0:
        unbounded). A lone arm (a drafter whose baseline is shared from a case measured earlier)
        has nothing to alternate with: it is not blocked; its record says where the baseline came
        from. Arms on one engine (an A/A control's twin) count once."""
        engines = len({arm.config for arm in baseline + drafting + replay})
        arms = len(baseline) + len(drafting) + len(replay)
        interleaved = arms < 2 or not max_live or max_live >= engines
        return cls(case, baseline, drafting, replay, interleaved, members or (case,))

    @property
    def arms(self) -> tuple[ArmSpec, ...]:
        """Every arm, in the order the first cycle runs them (and a blocked run runs them)."""
        return self.baseline + self.drafting + self.replay

    def cycle(self, index: int) -> tuple[ArmSpec, ...]:
        """The arms of cycle ``index``: the drafting arms' order alternates between cycles, so
        that none always runs right after the baseline."""
        drafting = self.drafting if index % 2 == 0 else self.drafting[::-1]
        return self.baseline + drafting + self.replay

    def arms_of(self, member: Case) -> tuple[ArmSpec, ...]:
        """The arms of ``member``'s pair: the shared baseline and its own."""
        return tuple(arm for arm in self.arms if arm.owner is None or arm.owner == member)


def group_engines(group: Iterable[Case]) -> int:
    """The engines one measurement of ``group`` keeps running together: the shared baseline, and
    each case's drafter and in-job reference (one engine where configs coincide)."""
    configs: set[EngineConfig] = set()
    for case in group:
        configs.add(case.baseline_config())
        configs.add(case.spec_config())
        if (reference := case.reference_config()) is not None:
            configs.add(reference)
    return len(configs)
