"""Latency targets: per workload, the lowest-energy configuration whose time between tokens
meets a target (speculation is a latency choice first; paper s.9)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable
from typing import Sequence

from pytest_specenergy.report.rows import ReportRow


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


def config_points(rows: Iterable[ReportRow]) -> list[ConfigPoint]:
    """Every speculative arm plus each distinct baseline arm (one per model, corpus, batch)."""
    points: list[ConfigPoint] = []
    seen: set[tuple[str, str, int | None]] = set()
    for r in rows:
        key, base_tbt, base_ept = ((r.model, r.corpus, r.batch), r.baseline_tbt_ms,
                                   r.baseline_energy_per_token)
        if key not in seen and base_tbt is not None and base_ept is not None:
            seen.add(key)
            points.append(ConfigPoint(f"baseline b{r.batch}", r.model, r.corpus, None, r.batch,
                                      base_tbt, base_ept, r.baseline_source, False, False))
        if r.tbt_ms is not None and r.energy_per_token is not None:
            points.append(ConfigPoint(f"{r.drafter_id} b{r.batch}", r.model, r.corpus,
                                      r.drafter_id, r.batch, r.tbt_ms, r.energy_per_token,
                                      r.source, r.tripped, r.failed))
    return points


def best_under_target(points: Iterable[ConfigPoint], target_ms: float) -> ConfigPoint | None:
    """The lowest-energy configuration whose time between tokens meets ``target_ms``.

    Configurations with a failed check are never chosen: their numbers cannot be trusted.
    Ties go to the lower time between tokens, then the label, so the choice is stable.
    """
    eligible = [p for p in points if p.tbt_ms <= target_ms and not p.failed]
    return min(eligible, key=lambda p: (p.energy_per_token, p.tbt_ms, p.label), default=None)


#: How much costlier a target's best configuration may get before the session fails (5%, the
#: default energy limit of the gate).
LATENCY_TOLERANCE = 0.05


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
        return f"{where}: {c.label}, {c.energy_per_token:.4g} J/token, TBT {c.tbt_ms:.3g} ms [{c.source}]"

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready record."""
        c = self.choice
        return {"model": self.model, "corpus": self.corpus, "target_ms": self.target_ms,
                "choice": None if c is None else {"label": c.label, "drafter": c.drafter_id, "batch": c.batch,
                                                  "energy_per_token": c.energy_per_token, "tbt_ms": c.tbt_ms,
                                                  "source": c.source}}


def latency_choices(rows: Iterable[ReportRow], targets_ms: Sequence[float]) -> list[TargetChoice]:
    """Per workload (model, corpus) and target, the lowest-energy configuration meeting it;
    workloads are kept apart because energy per token of different text is not comparable."""
    by_workload: dict[tuple[str, str], list[ConfigPoint]] = {}
    for p in config_points(rows):
        by_workload.setdefault((p.model, p.corpus), []).append(p)
    return [TargetChoice(model, corpus, t, best_under_target(points, t))
            for (model, corpus), points in by_workload.items() for t in targets_ms]


@dataclass(frozen=True)
class TargetRegression:
    """A latency target whose best configuration now costs more energy than in the reference run."""

    model: str
    corpus: str
    target_ms: float
    reference: ConfigPoint | None  # None: nothing met the target in the reference run
    current: ConfigPoint | None  # None: nothing meets the target now
    change: float | None  # current / reference energy per token - 1 (None when either is missing)

    def message(self) -> str:
        """``TBT <= 20 ms on model/code: ...``, naming both configurations."""
        where = f"TBT <= {self.target_ms:g} ms on {self.model} / {self.corpus}"
        if self.current is None:
            was = f" (the reference met it with {self.reference.label})" if self.reference else ""
            return f"{where}: no tested configuration meets the target any more{was}"
        assert self.reference is not None and self.change is not None
        return (f"{where}: the lowest-energy configuration is now {self.current.label} at "
                f"{self.current.energy_per_token:.4g} J/token, {self.change:+.1%} against the "
                f"reference's {self.reference.label} at {self.reference.energy_per_token:.4g} J/token "
                f"[{self.current.source}]")


def latency_regressions(current: Iterable[ReportRow], reference: Iterable[ReportRow],
                        targets_ms: Sequence[float], tolerance: float) -> list[TargetRegression]:
    """Targets whose best configuration got more expensive than ``tolerance`` (a fraction,
    0.05 = 5%) against the reference run, or that no configuration meets any more.

    Workloads and targets absent from the reference run are not judged (nothing to compare);
    a target the reference could not meet either is not a regression. Figures from different
    meters are never compared: the reference's choice must carry the current choice's source.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0 (a fraction such as 0.05), got {tolerance!r}")
    before = {(c.model, c.corpus, c.target_ms): c.choice for c in latency_choices(reference, targets_ms)}
    found = []
    for now in latency_choices(current, targets_ms):
        key = (now.model, now.corpus, now.target_ms)
        if key not in before or before[key] is None:
            continue
        ref = before[key]
        assert ref is not None
        if now.choice is None:
            found.append(TargetRegression(now.model, now.corpus, now.target_ms, ref, None, None))
            continue
        if now.choice.source != ref.source:
            raise ValueError(
                f"latency target {now.target_ms:g} ms on {now.model} / {now.corpus}: the reference's "
                f"figures are {ref.source}, this run's {now.choice.source}; they cannot be compared")
        change = now.choice.energy_per_token / ref.energy_per_token - 1
        if change > tolerance:
            found.append(TargetRegression(now.model, now.corpus, now.target_ms, ref, now.choice, change))
    return found
