"""The gate's verdicts: one enum for a metric, a case and a suite, and one order (worst first)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable


class Verdict(str, enum.Enum):
    """Outcome of comparing a metric (or a case: its worst metric) with its baseline."""

    REGRESSED = "regressed"
    INCOMPARABLE = "incomparable"
    INCONCLUSIVE = "inconclusive"
    NO_BASELINE = "no baseline"
    IMPROVED = "improved"
    PASSED = "passed"
    #: The sequential rule's name for a change shown to lie inside the limit.
    UNCHANGED = "passed"

    @property
    def mark(self) -> str:
        """asv-style change mark: ``+`` worse, ``-`` better, ``~`` inconclusive, ``x``
        incomparable, ``?`` no baseline, blank unchanged."""
        return _MARKS[self]

    @property
    def word(self) -> str:
        """The verdict in a table: its value, but ``unchanged`` for a change shown inside the limit
        (``passed`` is the test's outcome, and the counts line says ``unchanged``: one word for one
        verdict)."""
        return "unchanged" if self is Verdict.PASSED else self.value

    @property
    def label(self) -> str:
        """The verdict in a count: ``3 regressed``, ``2 unchanged``, ``1 without baseline``."""
        return {Verdict.PASSED: "unchanged", Verdict.NO_BASELINE: "without baseline"}.get(
            self, self.value
        )

    @property
    def rank(self) -> int:
        """Position in :data:`WORST_FIRST` (0 is worst): tables sort by it."""
        return WORST_FIRST.index(self)


#: What each table mark means, for the legends under the tables.
MARK_LEGEND = "+ regressed, - improved, ~ inconclusive, x incomparable, ? no baseline"

#: Worst first: the order of every table, and a case's verdict is the first of its metrics'.
#: A regression outranks an incomparable metric, so one row that cannot be judged never hides
#: another that regressed.
WORST_FIRST: tuple[Verdict, ...] = (
    Verdict.REGRESSED,
    Verdict.INCOMPARABLE,
    Verdict.INCONCLUSIVE,
    Verdict.NO_BASELINE,
    Verdict.IMPROVED,
    Verdict.PASSED,
)
_MARKS = {
    Verdict.PASSED: " ",
    Verdict.REGRESSED: "+",
    Verdict.IMPROVED: "-",
    Verdict.INCONCLUSIVE: "~",
    Verdict.INCOMPARABLE: "x",
    Verdict.NO_BASELINE: "?",
}


def worst(verdicts: Iterable[Verdict], default: Verdict = Verdict.PASSED) -> Verdict:
    """The worst of ``verdicts`` (``default`` when there are none)."""
    return min(verdicts, key=lambda v: v.rank, default=default)


@dataclass(frozen=True)
class Section:
    """One block of a summary: a title, its lines, and whether it reports a failure."""

    title: str
    lines: tuple[str, ...]
    failed: bool = False
