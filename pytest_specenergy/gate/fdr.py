"""False-discovery-rate control across a suite's gated comparisons (Benjamini-Hochberg), off by
default; false alarms, the fail-now / pass-now / pending split and dependence:
docs/gate.md#false-discovery-rate-control."""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace
from typing import Mapping

import numpy as np
from numpy.typing import ArrayLike

from pytest_specenergy.gate.sequential import SequentialPlan

METHODS = ("bh", "by")
FAIL_NOW, PASS_NOW, PENDING = "fail-now", "pass-now", "pending"


def _harmonic(n: int) -> float:
    return float(np.sum(1.0 / np.arange(1, n + 1))) if n > 0 else 1.0


def bh_adjust(pvalues: ArrayLike, *, method: str = "bh") -> np.ndarray:
    """BH (or BY) adjusted p-values in input order: ``adjusted[i] <= Q`` iff step-up at Q rejects i;
    NaN stays NaN."""
    if method not in METHODS:
        raise ValueError(f"unknown FDR method {method!r}; expected one of {METHODS}")
    p = np.asarray(pvalues, dtype=float).ravel()
    defined = np.flatnonzero(~np.isnan(p))
    if np.any((p[defined] < 0) | (p[defined] > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got {p[defined].tolist()}")
    out = np.full(p.shape, np.nan)
    n = defined.size
    if n == 0:
        return out
    scale = _harmonic(n) if method == "by" else 1.0
    order = defined[np.argsort(p[defined], kind="mergesort")]
    ranked = p[order] * n * scale / np.arange(1, n + 1)
    # Step-up: the adjusted value of rank k is the smallest ranked value at rank >= k.
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out[order] = np.minimum(adjusted, 1.0)
    return out


def bh_reject(pvalues: ArrayLike, q: float, *, method: str = "bh") -> np.ndarray:
    """Boolean mask of the comparisons rejected at FDR level ``q`` (NaN never rejected)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"FDR level must lie in (0, 1), got {q!r}")
    return np.nan_to_num(bh_adjust(pvalues, method=method), nan=np.inf) <= q


def immediate_decision(p_value: float, q: float, n_tests: int, *, method: str = "bh") -> str:
    """What a test can be told while it runs: ``fail-now`` (BH rejects it whatever the other
    ``n_tests - 1`` are), ``pass-now`` (never rejected) or ``pending`` (decided at session end)."""
    if method not in METHODS:
        raise ValueError(f"unknown FDR method {method!r}; expected one of {METHODS}")
    if n_tests < 1:
        raise ValueError(f"n_tests must be at least 1, got {n_tests}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"FDR level must lie in (0, 1), got {q!r}")
    if math.isnan(p_value):
        return PASS_NOW
    scale = _harmonic(n_tests) if method == "by" else 1.0
    return (
        FAIL_NOW
        if p_value <= q / (n_tests * scale)
        else PASS_NOW
        if p_value > q / scale
        else PENDING
    )


def fdr_plan(plan: SequentialPlan, q: float, n_tests: int) -> SequentialPlan:
    """The per-case plan under ``--specenergy-fdr=q``: REGRESSED stops only at a repeated p-value <=
    ``q / n_tests``, anything weaker runs on to the cap (why: docs/gate.md#false-discovery-rate-control)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"FDR level must lie in (0, 1), got {q!r}")
    if n_tests < 1:
        raise ValueError(f"n_tests must be at least 1, got {n_tests}")
    return replace(plan, alpha=q / n_tests)


@dataclass(frozen=True)
class SuiteFdr:
    """BH over a suite: the ids that fail at level ``q`` (``rejected``, in input order), those of
    them that passed provisionally while running (``pending_rejected``: the session fails them now),
    and every adjusted p-value."""

    q: float
    method: str
    n_tests: int
    adjusted: Mapping[str, float]
    rejected: tuple[str, ...]
    pending_rejected: tuple[str, ...]

    def summary(self) -> str:
        """A terminal-summary paragraph."""
        head = (
            f"specenergy FDR ({self.method.upper()}, q={self.q:g}) over {self.n_tests} gated "
            f"comparisons: {len(self.rejected)} regressed"
        )
        if not self.rejected:
            return head
        lines = [head + ":"]
        for key in self.rejected:
            late = " (decided at session end)" if key in self.pending_rejected else ""
            lines.append(f"  {key}: adjusted p={self.adjusted[key]:.3g}{late}")
        return "\n".join(lines)


def suite_fdr(
    pvalues: Mapping[str, float | None],
    q: float,
    *,
    method: str = "bh",
    pending: tuple[str, ...] | set[str] = (),
) -> SuiteFdr:
    """Run BH at level ``q`` over ``{comparison id: p-value}`` (None/NaN: not tested)."""
    keys = list(pvalues)
    values = [math.nan if (v := pvalues[k]) is None else float(v) for k in keys]
    adjusted = bh_adjust(values, method=method)
    reject = bh_reject(values, q, method=method)
    rejected = tuple(k for k, r in zip(keys, reject, strict=True) if r)
    pending = set(pending)
    return SuiteFdr(
        q=q,
        method=method,
        n_tests=int(np.sum(~np.isnan(values))),
        rejected=rejected,
        adjusted={k: float(a) for k, a in zip(keys, adjusted, strict=True)},
        pending_rejected=tuple(k for k in rejected if k in pending),
    )


__all__ = [
    "FAIL_NOW",
    "METHODS",
    "PASS_NOW",
    "PENDING",
    "SuiteFdr",
    "bh_adjust",
    "bh_reject",
    "fdr_plan",
    "immediate_decision",
    "suite_fdr",
]
