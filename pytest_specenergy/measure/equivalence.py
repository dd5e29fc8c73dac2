"""Output equivalence between the speculative arm and its non-speculative twin.

Greedy speculation must reproduce the baseline's tokens. Per request we record the first
index where the two token-id sequences differ; the pair reports the exact-match fraction and
the minimum and median common prefix. Text is never re-tokenised: the engine's ``output_ids``
are compared.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class RequestEquivalence:
    """One prompt's comparison."""

    prompt_index: int
    baseline_tokens: int
    speculative_tokens: int
    first_divergence: int | None  # None: identical sequences

    @property
    def common_prefix(self) -> int:
        """Tokens equal from the start."""
        if self.first_divergence is None:
            return self.baseline_tokens
        return self.first_divergence

    @property
    def exact(self) -> bool:
        """Identical token ids."""
        return self.first_divergence is None


@dataclass(frozen=True)
class Equivalence:
    """All prompts' comparisons for a pair."""

    requests: tuple[RequestEquivalence, ...]

    @property
    def exact_fraction(self) -> float:
        """Share of prompts whose outputs are identical."""
        return sum(r.exact for r in self.requests) / len(self.requests) if self.requests else 0.0

    @property
    def min_common_prefix(self) -> int:
        """Shortest common prefix over prompts."""
        return min((r.common_prefix for r in self.requests), default=0)

    @property
    def median_common_prefix(self) -> float:
        """Median common prefix over prompts."""
        return float(statistics.median(r.common_prefix for r in self.requests)) if self.requests else 0.0

    @property
    def first_divergent(self) -> RequestEquivalence | None:
        """The prompt that diverges earliest, if any."""
        diverged = [r for r in self.requests if not r.exact]
        return min(diverged, key=lambda r: r.common_prefix, default=None)

    def summary(self) -> str:
        """``8/8 exact`` or ``6/8 exact, first divergence at token 12 (prompt 3)``."""
        exact = sum(r.exact for r in self.requests)
        text = f"{exact}/{len(self.requests)} exact"
        worst = self.first_divergent
        if worst is not None:
            text += f", first divergence at token {worst.first_divergence} (prompt {worst.prompt_index})"
        return text

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready description."""
        return {
            "exact_fraction": self.exact_fraction,
            "min_common_prefix": self.min_common_prefix,
            "median_common_prefix": self.median_common_prefix,
            "first_divergence": [r.first_divergence for r in self.requests],
        }


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, the shorter length if one is a prefix of the
    other, or None when identical."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(baseline: Sequence[Sequence[int]], speculative: Sequence[Sequence[int]]) -> Equivalence:
    """Compare the two arms prompt by prompt (same prompts, same order)."""
    if len(baseline) != len(speculative):
        raise ValueError(f"arms answered different numbers of prompts: baseline {len(baseline)}, "
                         f"speculative {len(speculative)}")
    return Equivalence(tuple(
        RequestEquivalence(i, len(b), len(s), first_divergence(b, s))
        for i, (b, s) in enumerate(zip(baseline, speculative))
    ))
