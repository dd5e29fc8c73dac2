"""The suite's plan: every case's modeled GPU minutes (``plan/cost.py``) in collection order, the
engine order the run will take, the printed table, and the budget check that refuses a suite
which cannot fit, naming the costliest cases and what to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.kv_pools import MIB
from pytest_specenergy.plan.cost import SGLANG_START_S
from pytest_specenergy.plan.cost import CaseCost
from pytest_specenergy.plan.cost import price_case
from pytest_specenergy.plan.cost import schedule
from pytest_specenergy.plan.residency import gpu_residency

#: Memory of each priced GPU (nvidia-smi memory.total): what the residency decision is made from.
GPU_MEMORY = {"h100": 81559 * MIB, "h200": 143771 * MIB}
#: The ``sleep_on_idle``-capable SGLang the plan assumes (the extra's 0.5.23).
_FIELDS = frozenset({"sleep_on_idle", "mem_fraction_static"})


@dataclass(frozen=True)
class SuitePlan:
    """Every planned case's cost, the GPU priced and the engine order assumed."""

    gpu: str
    order: str
    cases: tuple[CaseCost, ...]

    @property
    def first_look_min(self) -> float:
        """Modeled GPU minutes with each case's first-look repeats."""
        return sum(c.first_look_s for c in self.cases) / 60.0

    @property
    def worst_min(self) -> float:
        """Modeled GPU minutes with every repeat the gate may add."""
        return sum(c.worst_s for c in self.cases) / 60.0

    def lines(self) -> list[str]:
        """The printed plan: one row per case, then the totals."""
        rows = [
            f"specenergy plan: modeled GPU minutes on {self.gpu} ({self.order}; an SGLang engine "
            f"start {SGLANG_START_S:.0f} s; every request to max_new_tokens, speculative arms at "
            "one token per step: upper bounds)",
            f"{'case':<60} {'starts':>6} {'start':>6} {'warm-up':>7} {'repeat':>7} "
            f"{'first look':>11} {'worst':>12}",
        ]
        for c in self.cases:
            name = c.nodeid.split("::")[-1] or c.case_id
            rows.append(
                f"{name[-60:]:<60} {c.starts:>6} {c.start_s / 60:>6.1f} "
                f"{c.warmup_s / 60:>7.2f} {c.repeat_s / 60:>7.2f} "
                f"{c.first_look_s / 60:>7.1f} ({c.repeats:>2}) {c.worst_s / 60:>7.1f} ({c.cap:>2})"
            )
        rows.append(
            f"total: {self.first_look_min:.1f} GPU minutes at the first look, {self.worst_min:.1f} "
            f"if every gated case runs to its cap ({len(self.cases)} cases)"
        )
        return rows

    def over_budget(self, minutes: float) -> str | None:
        """Why the suite cannot fit ``minutes`` (its worst case), naming the costliest cases and
        what to change; None when it fits."""
        if self.worst_min <= minutes:
            return None
        costly = sorted(self.cases, key=lambda c: c.worst_s, reverse=True)[:3]
        named = ", ".join(f"{c.nodeid or c.case_id} ({c.worst_s / 60:.1f} min)" for c in costly)
        return (
            f"the suite's modeled GPU time is {self.worst_min:.1f} minutes if every gated case runs "
            f"to its cap ({self.first_look_min:.1f} at the first look), over "
            f"--specenergy-budget={minutes:g}; the costliest cases: {named}. " + _advice(costly[0])
        )


def _advice(case: CaseCost) -> str:
    """What to change for the costliest case, by what dominates its cost."""
    parts = {
        "starts": case.start_s,
        "repeats": (case.cap - 1) * case.repeat_s,
        "window": case.repeat_s + case.warmup_s + case.complete_s,
    }
    worst = max(parts, key=lambda k: parts[k])
    if worst == "starts":
        return (
            "Engine starts dominate: blocked order restarts an engine at every arm switch; let "
            "the arms stay resident (local checkpoints or weights_gb= on the model marker, a GPU "
            "that holds both), or run fewer distinct drafters per job"
        )
    if worst == "repeats":
        return (
            "Repeats dominate: lower --specenergy-max-repeats (the gate's cap) or "
            "--specenergy-save-repeats, or gate fewer cases per job (split the matrix across jobs "
            "or runners)"
        )
    return (
        "The windows dominate: lower max_new_tokens or prompts on the generation marker, drop "
        "the largest batches, or split the matrix across jobs or runners"
    )


def plan_suite(
    items: Sequence[tuple[str, Case]],
    gpu: str,
    *,
    repeats: int,
    cap: int,
    warmup: int,
    gated: bool,
) -> SuitePlan:
    """The plan of ``items`` (nodeid, case) on ``gpu`` (h100, h200): each case at ``repeats``, up to
    ``cap`` where it is gated (``gated``: a stored baseline or goldens compared; in-job A/B cases
    always), the engine order the residency decision takes on that GPU's memory."""
    cases = [case for _, case in items]
    blocked = True
    order = "one engine at a time"
    # The decision the measurer takes on a GPU of this size with these cases.
    residency = gpu_residency(cases, lambda: GPU_MEMORY[gpu], lambda: _FIELDS)
    if residency is not None:
        blocked = not residency.resident
        order = ("resident: " if residency.resident else "blocked: ") + residency.reason
    costs = []
    for (nodeid, case), (starts, shared) in zip(items, schedule(cases, blocked)):
        case_cap = cap if gated or case.reference is not None else repeats
        costs.append(
            price_case(
                case,
                gpu,
                repeats=repeats,
                cap=case_cap,
                warmup=warmup,
                new_engines=starts,
                baseline_shared=shared,
                nodeid=nodeid,
            )
        )
    return SuitePlan(gpu, order, tuple(costs))


def plan_lines(
    items: Sequence[tuple[str, Case]],
    gpu: str,
    *,
    repeats: int,
    cap: int,
    warmup: int,
    gated: bool,
    budget: float | None,
) -> tuple[list[str], str | None]:
    """The plan's printed lines and, when it cannot fit ``budget`` minutes, why (the session's
    collection refuses the suite with it); a case that cannot be priced is a refusal too."""
    from pytest_specenergy.plan.cost import PlanError

    gpu_items = [(n, c) for n, c in items if c.engine == "sglang" or c.device.startswith("cuda")]
    if not gpu_items:
        return ["specenergy plan: no GPU case collected (the reference engine on CPU)"], None
    try:
        plan = plan_suite(gpu_items, gpu, repeats=repeats, cap=cap, warmup=warmup, gated=gated)
    except PlanError as exc:
        return [f"specenergy plan: {exc}"], None if budget is None else str(exc)
    return plan.lines(), None if budget is None else plan.over_budget(budget)
