"""Latency targets: per workload, the lowest-energy configuration whose time between tokens
meets a target (speculation is a latency choice first; paper s.9), and whether that choice got
costlier than in a reference run, judged by the gate's own comparison."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from dataclasses import field
from typing import Iterable
from typing import Sequence

from pytest_specenergy.document import Arm
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.compare import compare_metric
from pytest_specenergy.gate.limits import FailLimit
from pytest_specenergy.gate.sequential import SequentialPlan
from pytest_specenergy.gate.verdict import Verdict


@dataclass(frozen=True)
class ConfigPoint:
    """A serving configuration: one arm at one batch (the baseline is a drafter-less config)."""

    label: str
    model: str
    corpus: str
    drafter_id: str | None  # None for the non-speculative baseline
    batch: int | None
    tbt_ms: float
    energy_per_token: float
    source: str
    tripped: bool
    failed: bool
    #: The arm's per-repeat J/token, what a latency target's regression is judged on.
    samples: tuple[float, ...] = field(default=(), compare=False)


def _latency(arm: Arm, fallback: float | None) -> float | None:
    """The time between tokens a latency target judges: what a user sees (every engine step from
    a request's first token to its last, other requests' prefills included: issue 41 item 3);
    a record written before it was kept gives its own decode steps' (``fallback``)."""
    return arm.visible_tbt_ms if arm.visible_tbt_ms is not None else fallback


def config_points(records: Iterable[CaseRecord]) -> list[ConfigPoint]:
    """Every speculative arm plus each distinct baseline arm (one per model, corpus, batch), at
    the time between tokens a user sees."""
    points: list[ConfigPoint] = []
    seen: set[tuple[str, str, int | None]] = set()
    for r in records:
        tripped, failed = bool(r.checks), any(c.severity == "fail" for c in r.checks)
        corpus, base = r.corpus_name, r.baseline
        key = (r.model, corpus, r.batch)
        base_ms, spec_ms = _latency(base, base.tbt_ms), _latency(r.speculative, r.tbt_ms)
        if key not in seen and base_ms is not None and base.energy_per_token is not None:
            seen.add(key)
            points.append(
                ConfigPoint(
                    f"baseline b{r.batch}",
                    r.model,
                    corpus,
                    None,
                    r.batch,
                    base_ms,
                    base.energy_per_token,
                    base.source,
                    False,
                    False,
                    _defined(base.values("energy_per_token")),
                )
            )
        if spec_ms is not None and r.energy_per_token is not None:
            points.append(
                ConfigPoint(
                    f"{r.drafter_id} b{r.batch}",
                    r.model,
                    corpus,
                    r.drafter_id,
                    r.batch,
                    spec_ms,
                    r.energy_per_token,
                    r.source,
                    tripped,
                    failed,
                    _defined(r.speculative.values("energy_per_token")),
                )
            )
    return points


def _defined(values: Sequence[float | None]) -> tuple[float, ...]:
    return tuple(v for v in values if v is not None)


def best_under_target(points: Iterable[ConfigPoint], target_ms: float) -> ConfigPoint | None:
    """The lowest-energy configuration whose time between tokens meets ``target_ms``, never one with
    a failed check (its numbers cannot be trusted); ties go to the lower TBT, then the label."""
    eligible = [p for p in points if p.tbt_ms <= target_ms and not p.failed]
    return min(eligible, key=lambda p: (p.energy_per_token, p.tbt_ms, p.label), default=None)


#: The limit a latency target's lowest-energy configuration is judged with against the
#: reference run (the gate's default energy limit, on absolute J/token: the configurations differ).
LATENCY_LIMIT = "energy_per_token:5%"


@dataclass(frozen=True)
class TargetChoice:
    """For one workload and latency target, the configuration to serve (None if none meets it)."""

    model: str
    corpus: str
    target_ms: float
    choice: ConfigPoint | None

    def line(self) -> str:
        """``TBT <= 25 ms on tiny:dense / code: ngram b4, 0.27 J/token, 2.1 ms [source]``."""
        where = f"TBT <= {self.target_ms:g} ms on {self.model} / {self.corpus}"
        if self.choice is None:
            return f"{where}: no tested configuration meets it"
        c = self.choice
        return (
            f"{where}: {c.label}, {c.energy_per_token:.4g} J/token, TBT {c.tbt_ms:.3g} ms "
            f"[{c.source}]"
        )

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready record."""
        c = self.choice
        return {
            "model": self.model,
            "corpus": self.corpus,
            "target_ms": self.target_ms,
            "choice": None
            if c is None
            else {
                "label": c.label,
                "drafter": c.drafter_id,
                "batch": c.batch,
                "energy_per_token": c.energy_per_token,
                "tbt_ms": c.tbt_ms,
                "source": c.source,
            },
        }


def latency_choices(
    records: Iterable[CaseRecord], targets_ms: Sequence[float]
) -> list[TargetChoice]:
    """Per workload (model, corpus) and target, the lowest-energy configuration meeting it;
    workloads are kept apart because energy per token of different text is not comparable."""
    by_workload: dict[tuple[str, str], list[ConfigPoint]] = {}
    for p in config_points(records):
        by_workload.setdefault((p.model, p.corpus), []).append(p)
    return [
        TargetChoice(model, corpus, t, best_under_target(points, t))
        for (model, corpus), points in by_workload.items()
        for t in targets_ms
    ]


def compare_latency(
    reference: Iterable[CaseRecord],
    current: Iterable[CaseRecord],
    targets_ms: Sequence[float],
    limit: FailLimit,
    plan: SequentialPlan,
) -> list[CaseComparison]:
    """Per workload and latency target, the current lowest-energy configuration meeting it against
    the reference run's, by :func:`~pytest_specenergy.gate.compare.compare_metric` (the rules:
    docs/gate.md)."""
    before = {
        (c.model, c.corpus, c.target_ms): c.choice for c in latency_choices(reference, targets_ms)
    }
    found = []
    for now in latency_choices(current, targets_ms):
        ref = before.get((now.model, now.corpus, now.target_ms))
        if ref is None:
            continue
        where = f"TBT <= {now.target_ms:g} ms on {now.model} / {now.corpus}"
        if now.choice is None:
            found.append(
                CaseComparison(
                    where,
                    Verdict.REGRESSED,
                    (),
                    (
                        "no tested configuration meets the target any more (the reference met it "
                        f"with {ref.label} at {ref.energy_per_token:.4g} J/token)",
                    ),
                    plan.alpha,
                )
            )
            continue
        if now.choice.source != ref.source:
            found.append(
                CaseComparison(
                    where,
                    Verdict.INCOMPARABLE,
                    (),
                    (
                        f"the reference's figures are {ref.source}, this run's "
                        f"{now.choice.source}; they cannot be compared",
                    ),
                    plan.alpha,
                )
            )
            continue
        row = compare_metric(limit, ref.samples, now.choice.samples, plan.alpha, plan=plan)
        row = dataclasses.replace(
            row,
            note="; ".join(
                filter(
                    None,
                    (
                        f"lowest-energy configuration {now.choice.label} (reference: {ref.label})",
                        row.note,
                    ),
                )
            ),
        )
        found.append(CaseComparison(where, row.verdict, (row,), (), plan.alpha))
    return found
