"""The between-session term of a comparison with a stored run.

Interleaved arms cancel what a session does to both of them, but not everything: a session may
move the within-session ratio itself (a clock or thermal state that favours one arm's step shape,
a driver update), and that offset is shared by every repeat of the session, so more repeats never
average it away. Judged without it, a change exactly at the limit fails more often than alpha
(issue 40: 11.5% at a 1% sd session effect, 3% arm noise, a stored run of 15). The term is added
in quadrature to every look's standard error (``sequential_arrays``' ``session_sd``).

Each session brings its own effect, the current and the stored one, so the comparison's variance
gains twice the per-session variance (:attr:`SessionTerm.variance`). The per-session sd is

* **estimated** from the stored history: the per-session geometric means of the test's metric
  over the last :data:`HISTORY_RUNS` complete runs of the machine key, their variance less what the
  within-session spread explains (one-way random effects), with ``sessions - 1`` degrees of
  freedom, once :data:`MIN_SESSIONS` sessions hold the test;
* else **declared**: :data:`DECLARED_RATIO_SD` for a within-session ratio on a measured meter (the
  1% sd the issue simulates), none on a modeled meter (it prices the same tokens the same way in
  every session: no session can move its figures).

Absolute J/token or TBT across sessions keeps the whole session offset (2-3% on a GPU, the
machine's temperature and clocks): no declared value is honest there, so such a limit is judged
only with an estimated term and refused (the row is not judged) without one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Stored sessions of a test needed to estimate its between-session term.
MIN_SESSIONS = 3
#: The most recent complete stored runs read for the estimate.
HISTORY_RUNS = 20
#: The between-session sd (log scale) declared for a within-session ratio on a measured meter.
DECLARED_RATIO_SD = 0.01
#: Metrics compared across sessions as absolute values: no declared term; estimated, or refused.
ABSOLUTE_ACROSS_SESSIONS = frozenset({"energy_per_token", "tbt_ms"})


@dataclass(frozen=True)
class SessionTerm:
    """A between-session sd on the log scale, its degrees of freedom (None: declared, not
    estimated) and where it came from, in words."""

    sd: float
    df: float | None
    source: str

    @property
    def variance(self) -> float:
        """What it adds to a comparison's variance (log scale): the current session's effect and
        the stored session's, independent, so twice the per-session variance."""
        return 2.0 * self.sd**2

    def describe(self) -> str:
        """The term in a row's note."""
        return f"between-session sd {self.sd:.2%} per session ({self.source})"


def estimate(sessions: Sequence[Sequence[float]]) -> SessionTerm | None:
    """The between-session sd of per-session positive samples (one list per stored session), by
    one-way random effects on their logs, or None below :data:`MIN_SESSIONS` usable sessions."""
    logs = [np.log(np.asarray(s, float)) for s in sessions]
    logs = [x for x in logs if x.size >= 2 and np.all(np.isfinite(x))]
    if len(logs) < MIN_SESSIONS:
        return None
    means = np.array([x.mean() for x in logs])
    within = np.array([x.var(ddof=1) / x.size for x in logs])
    between = max(0.0, float(means.var(ddof=1) - within.mean()))
    return SessionTerm(
        math.sqrt(between), float(len(logs) - 1), f"estimated from {len(logs)} stored sessions"
    )


def session_term(
    metric: str, sessions: Sequence[Sequence[float]], measured: bool
) -> SessionTerm | None:
    """The term for comparing ``metric`` with a stored run: estimated from ``sessions`` (the
    stored history's per-session samples of this test) where they suffice, else the declared one
    (``measured``: a board meter); None where none applies (a modeled meter's ratio)."""
    estimated = estimate(sessions)
    if estimated is not None:
        return estimated
    if metric in ABSOLUTE_ACROSS_SESSIONS or not measured:
        return None
    return SessionTerm(DECLARED_RATIO_SD, None, "declared: too few stored sessions to estimate")


def refusal(metric: str, sessions: int, measured: bool) -> str | None:
    """Why an absolute ``metric`` cannot be judged against a stored run without an estimated term
    (``sessions``: the stored sessions holding the test), or None."""
    if metric not in ABSOLUTE_ACROSS_SESSIONS or not measured or sessions >= MIN_SESSIONS:
        return None
    return (
        f"{metric} is absolute: across sessions it keeps each session's offset (the GPU's "
        f"temperature and clocks), which only the stored history can size ({sessions} stored "
        f"session(s) hold this test, {MIN_SESSIONS} needed); gate energy_ratio (within-session, "
        "the offset cancels), compare in-job, or save more runs"
    )
