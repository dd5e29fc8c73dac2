"""Degeneracy detectors: text statistics that expose broken speculation without a reference. Small
and random-weight models loop on their own, so each detector compares the speculative arm with the
baseline's continuations of the same prompts: a broken drafter shows as *more* repetition, *fewer*
distinct n-grams, leaked special tokens or answers far longer than the baseline's - never as a
judgement on the baseline itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable
from typing import Sequence


def repeated_suffix_fraction(tokens: Sequence[int], max_period: int = 16) -> float:
    """Share of the sequence covered by its final loop: the longest tail made of one short period
    repeated at least twice (0.0 = no loop, close to 1.0 = a loop from the start)."""
    n = len(tokens)
    best = 0
    for period in range(1, min(max_period, n // 2) + 1):
        length = period
        while length < n and tokens[n - 1 - length] == tokens[n - 1 - length + period]:
            length += 1
        if length >= 2 * period:
            best = max(best, length)
    return best / n if n else 0.0


def distinct_n(tokens: Sequence[int], n: int = 2) -> float:
    """Distinct n-grams over all n-grams (1.0 = no n-gram repeats)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


@dataclass(frozen=True)
class DegeneracyReport:
    """Speculative-vs-baseline text statistics over all prompts of a pair."""

    loop_fraction_spec: float
    loop_fraction_base: float
    distinct2_spec: float
    distinct2_base: float
    special_leaks: int
    length_ratio: float

    def problems(
        self, loop_excess: float = 0.25, distinct_drop: float = 0.25, length_blowup: float = 1.5
    ) -> list[str]:
        """Named findings; empty when the speculative text looks like the baseline's."""
        found = []
        if self.loop_fraction_spec - self.loop_fraction_base > loop_excess:
            found.append(
                f"repetition loop: {self.loop_fraction_spec:.0%} of speculative output is a "
                f"loop vs {self.loop_fraction_base:.0%} of the baseline's"
            )
        if self.distinct2_base and self.distinct2_spec < self.distinct2_base * (1 - distinct_drop):
            found.append(
                f"distinct-2 collapse: {self.distinct2_spec:.2f} vs baseline "
                f"{self.distinct2_base:.2f}"
            )
        if self.special_leaks:
            found.append(
                f"special-token leakage: {self.special_leaks} special tokens inside "
                f"speculative answers that the baseline does not emit"
            )
        if self.length_ratio > length_blowup:
            found.append(
                f"length blow-up: speculative answers are {self.length_ratio:.2f}x the baseline's "
                "length"
            )
        return found

    def as_dict(self) -> dict[str, float]:
        """A JSON-ready record."""
        return dict(self.__dict__)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def degeneracy(
    baseline: Sequence[Sequence[int]],
    speculative: Sequence[Sequence[int]],
    special_ids: Iterable[int] = (),
) -> DegeneracyReport:
    """Compare the arms' outputs, prompt by prompt."""
    special = set(special_ids)

    def leaks(seq: Sequence[int]) -> int:
        # A final EOS is how an answer ends; special ids anywhere before it are leaks.
        return sum(1 for t in seq[:-1] if t in special)

    base_len = sum(len(s) for s in baseline)
    return DegeneracyReport(
        loop_fraction_spec=_mean(repeated_suffix_fraction(s) for s in speculative),
        loop_fraction_base=_mean(repeated_suffix_fraction(s) for s in baseline),
        distinct2_spec=_mean(distinct_n(s) for s in speculative),
        distinct2_base=_mean(distinct_n(s) for s in baseline),
        special_leaks=max(0, sum(leaks(s) for s in speculative) - sum(leaks(s) for s in baseline)),
        length_ratio=(sum(len(s) for s in speculative) / base_len) if base_len else 1.0,
    )
