"""False-discovery-rate control across a suite's gated comparisons (Benjamini-Hochberg).

The default, and its expected false alarms
------------------------------------------
Off. Each gated comparison (case x per-repeat metric) tests H0 "the change is within the
limit" and fails at the plan's level: P(REGRESSED) <= alpha = 5% for a true change exactly
*at* the limit, whatever the repeat count (``sequential.py``). Unchanged code sits well
inside a non-zero limit, so the measured rate there is far lower: 0 to 0.02 false failures
per 200 unchanged cases at 3% per-repeat noise with a 5% limit, under 0.6 at 5% noise
(``results.txt``). The bound for a suite is ``alpha x`` (the number of comparisons whose
true change sits on the limit). A zero limit ("fail on any significant increase") puts every
unchanged case on its null boundary: about 200 x 5% = 10 false failures per 200-case suite
(measured 10.6). That is what ``--specenergy-fdr=Q`` is for. BH at Q = 0.05 brings it to
P(any false failure) ~ Q (measured 0.12 false failures per suite). It costs power where
true regressions are few (10 of 200 at +10%: 96% -> 42%; 50 of 200: 95% -> 75%). So it is
an option, not the default.

How the plugin applies it (each test's outcome is decided while it runs)
------------------------------------------------------------------------
BH at level Q over N p-values rejects the k smallest, k the largest with p_(k) <= Q k / N.
Two facts make most outcomes final at once, without waiting for the other tests:

* ``p <= Q / N`` (``Q / (N c_N)`` for BY): rejected whatever the other p-values are ->
  the test **fails now**;
* ``p > Q`` (``Q / c_N`` for BY): never rejected -> the test's gate **passes now**.

Only ``Q / N < p <= Q`` is **pending**: the test passes with a "pending FDR" warning and the
session decides it in ``pytest_sessionfinish`` (on the xdist controller, which has every
record). :func:`suite_fdr` runs BH over all p-values; the pending ones that survive are
listed in the terminal summary and the JSON report, and the exit status is set to 1
(``session.exitstatus = pytest.ExitCode.TESTS_FAILED``). N is the number of gated
comparisons collected (after deselection). Comparisons that end up not measured only make
the final BH less strict, so a "fail now" stays right. The p-value of a comparison is its
``p_sequential``, which stays valid when the plan stops early. In FDR mode each case stops with
:func:`fdr_plan`: REGRESSED early only at ``p <= Q / N``, otherwise on to the cap, so that
real regressions collect a p-value small enough for BH.

BH assumes independent or positively dependent (PRDS) p-values. Comparisons of one session
share the machine, but the ratio metric cancels the session offset, and what remains is
positive dependence at most. ``method="by"`` (Benjamini-Yekutieli) holds under any
dependence, at a cost in power.
"""

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


def _clean(pvalues: ArrayLike) -> np.ndarray:
    p = np.asarray(pvalues, dtype=float).ravel()
    defined = ~np.isnan(p)
    if np.any((p[defined] < 0) | (p[defined] > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got {p[defined].tolist()}")
    return p


def bh_adjust(pvalues: ArrayLike, *, method: str = "bh") -> np.ndarray:
    """Benjamini-Hochberg (or -Yekutieli) adjusted p-values, in the input order.

    ``adjusted[i] <= Q`` exactly when comparison i is rejected by the step-up procedure at
    FDR level Q. NaN entries (no p-value) are left out of the family and stay NaN.
    """
    if method not in METHODS:
        raise ValueError(f"unknown FDR method {method!r}; expected one of {METHODS}")
    p = _clean(pvalues)
    out = np.full(p.shape, np.nan)
    defined = np.flatnonzero(~np.isnan(p))
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
    adjusted = bh_adjust(pvalues, method=method)
    return np.nan_to_num(adjusted, nan=np.inf) <= q


def immediate_decision(p_value: float, q: float, n_tests: int, *, method: str = "bh") -> str:
    """What a test can be told while it runs: ``fail-now``, ``pass-now`` or ``pending``.

    ``fail-now`` when BH rejects this p-value whatever the other ``n_tests - 1`` are,
    ``pass-now`` when it can never be rejected, ``pending`` otherwise (decided at session end).
    """
    if method not in METHODS:
        raise ValueError(f"unknown FDR method {method!r}; expected one of {METHODS}")
    if n_tests < 1:
        raise ValueError(f"n_tests must be at least 1, got {n_tests}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"FDR level must lie in (0, 1), got {q!r}")
    if math.isnan(p_value):
        return PASS_NOW
    scale = _harmonic(n_tests) if method == "by" else 1.0
    if p_value <= q / (n_tests * scale):
        return FAIL_NOW
    if p_value > q / scale:
        return PASS_NOW
    return PENDING


def fdr_plan(plan: SequentialPlan, q: float, n_tests: int) -> SequentialPlan:
    """The per-case stopping plan under ``--specenergy-fdr=q``.

    A case stops REGRESSED only when its repeated p-value is at most ``q / n_tests`` - BH
    rejects it whatever the others show, so the test can fail at once. Anything weaker runs
    on to the cap to collect evidence (stopping at the per-case alpha would leave every
    stopped p-value just under alpha, far too large for BH), and BH decides at session end.
    UNCHANGED / IMPROVED stop as usual.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"FDR level must lie in (0, 1), got {q!r}")
    if n_tests < 1:
        raise ValueError(f"n_tests must be at least 1, got {n_tests}")
    return replace(plan, alpha=q / n_tests)


@dataclass(frozen=True)
class SuiteFdr:
    """BH over a suite: which comparisons fail, with every adjusted p-value.

    ``rejected`` lists the ids that fail at level ``q`` (in input order); ``pending_rejected``
    those among ``pending`` (the ids that passed provisionally while running) that the
    session must now fail.
    """

    q: float
    method: str
    n_tests: int
    adjusted: Mapping[str, float]
    rejected: tuple[str, ...]
    pending_rejected: tuple[str, ...]

    def summary(self) -> str:
        """A terminal-summary paragraph."""
        head = (f"specenergy FDR ({self.method.upper()}, q={self.q:g}) over {self.n_tests} gated "
                f"comparisons: {len(self.rejected)} regressed")
        if not self.rejected:
            return head
        lines = [head + ":"]
        for key in self.rejected:
            late = " (decided at session end)" if key in self.pending_rejected else ""
            lines.append(f"  {key}: adjusted p={self.adjusted[key]:.3g}{late}")
        return "\n".join(lines)


def suite_fdr(pvalues: Mapping[str, float | None], q: float, *, method: str = "bh",
              pending: tuple[str, ...] | set[str] = ()) -> SuiteFdr:
    """Run BH at level ``q`` over ``{comparison id: p-value}`` (None/NaN: not tested)."""
    keys = list(pvalues)
    values = [math.nan if (v := pvalues[k]) is None else float(v) for k in keys]
    adjusted = bh_adjust(values, method=method)
    reject = bh_reject(values, q, method=method)
    rejected = tuple(k for k, r in zip(keys, reject, strict=True) if r)
    pending = set(pending)
    return SuiteFdr(q=q, method=method, n_tests=int(np.sum(~np.isnan(values))),
                    adjusted={k: float(a) for k, a in zip(keys, adjusted, strict=True)}, rejected=rejected,
                    pending_rejected=tuple(k for k in rejected if k in pending))


__all__ = ["FAIL_NOW", "METHODS", "PASS_NOW", "PENDING", "SuiteFdr", "bh_adjust", "bh_reject",
           "fdr_plan", "immediate_decision", "suite_fdr"]
