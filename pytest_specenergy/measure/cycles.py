"""The arms of one measurement of a case and the order their repeats run in.

A measurement runs in cycles: per cycle one repeat of every arm - the baseline (unless it is
shared from a sibling case), the drafting arms (the candidate and, in-job A/B, the reference),
then the verify-only replay of draft removal. Slow drift (the GPU warming, leakage power
rising) then falls on every arm alike, and repeat ``i`` of one arm pairs with repeat ``i`` of
the others. Where the engines cannot all run at once (one GPU that holds one engine), the arms
run blocked instead: every repeat of one arm, then the next arm's (``interleaved`` false), and
the gate allows for a block drift between them.

:class:`CyclePlan` is that decision, made once from plain values; the pair measurer runs it.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class CyclePlan:
    """A case's arms, in the order of a cycle, and whether the cycles interleave them."""

    case: Case
    baseline: tuple[ArmSpec, ...]
    drafting: tuple[ArmSpec, ...]
    replay: tuple[ArmSpec, ...]
    interleaved: bool

    @classmethod
    def decide(
        cls,
        case: Case,
        baseline: tuple[ArmSpec, ...],
        drafting: tuple[ArmSpec, ...],
        replay: tuple[ArmSpec, ...],
        max_live: int,
    ) -> CyclePlan:
        """The plan for these arms on a pool that keeps ``max_live`` engines running (0:
        unbounded). A lone arm (a drafter whose baseline is shared from a sibling) has nothing to
        alternate with: it is not blocked; its record says where the baseline came from."""
        arms = len(baseline) + len(drafting) + len(replay)
        interleaved = arms < 2 or not max_live or max_live >= arms
        return cls(case, baseline, drafting, replay, interleaved)

    @property
    def arms(self) -> tuple[ArmSpec, ...]:
        """Every arm, in the order the first cycle runs them (and a blocked run runs them)."""
        return self.baseline + self.drafting + self.replay

    def cycle(self, index: int) -> tuple[ArmSpec, ...]:
        """The arms of cycle ``index``: the drafting arms' order alternates between cycles, so
        that neither always runs right after the baseline."""
        drafting = self.drafting if index % 2 == 0 else self.drafting[::-1]
        return self.baseline + drafting + self.replay
