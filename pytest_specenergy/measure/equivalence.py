"""Output equivalence between the speculative arm and its non-speculative twin: the engine's
``output_ids`` compared per request, each divergence a numerical tie or a real one (why ties exist
and how they are told apart: ``docs/design/measure.md``, section
``pytest_specenergy/measure/equivalence.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any
from typing import Sequence

#: Below this baseline top-2 log-probability margin (nats) a divergence is a numerical tie. Why
#: 0.125: a margin is a logit difference, and one ulp of a bf16 logit (8 significant bits) in [16,
#: 32), where the top logits of real LLMs lie, is 2**(4 - 7) = 0.125; kernels that round in another
#: order move each of two near-tied logits by up to half an ulp, while a bug's wrong token sits at a
#: typical margin, around a nat. The reference server's ``numerical-noise`` fault swaps only pairs
#: under about 0.05 nats, well inside it.
DEFAULT_TIE_MARGIN = 0.125

#: The classes of one prompt's comparison.
EXACT, TIE, REAL = "exact", "tie", "real"


@dataclass(frozen=True)
class DivergenceMargin:
    """The baseline model's two best tokens at a prompt's first diverging position. ``margin``: best
    minus second best log-probability (>= 0). ``between_top2``: the arms' two tokens are exactly
    those two (one arm stopped: the other's token is one and the rest a stop token); only then can a
    small margin explain the divergence. ``later_gap``: the largest shortfall (nats) of a
    speculative token below the target's best, from the divergence on (``later_index``: where),
    which guards the text after the tie (``docs/design/measure.md``)."""

    margin: float
    top_ids: tuple[int, int]
    between_top2: bool
    later_gap: float
    later_index: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {**dataclasses.asdict(self), "top_ids": list(self.top_ids)}


@dataclass(frozen=True)
class RequestEquivalence:
    """One prompt's comparison."""

    prompt_index: int
    baseline_tokens: int
    speculative_tokens: int
    first_divergence: int | None  # None: identical sequences
    #: The baseline's top-2 at the first divergence (None: identical, or not measured).
    divergence_margin: DivergenceMargin | None = None

    def kind(self, tie_margin: float = DEFAULT_TIE_MARGIN) -> str:
        """``exact``, ``tie`` (a near-tie of the baseline's two best tokens) or ``real``; a
        divergence whose margin was not measured is ``real``: nothing shows it is noise."""
        if self.first_divergence is None:
            return EXACT
        m = self.divergence_margin
        if m is not None and m.between_top2 and m.margin < tie_margin and m.later_gap < tie_margin:
            return TIE
        return REAL

    def describe(self, tie_margin: float = DEFAULT_TIE_MARGIN) -> str:
        """``token 12 of prompt 3 (baseline top-2 margin 0.812 nats)``."""
        m = self.divergence_margin
        if m is None:
            why = "baseline top-2 margin not measured"
        elif not m.between_top2:
            why = (
                f"baseline top-2 margin {m.margin:.3f} nats, but the arms' tokens are not the "
                f"baseline's two best {list(m.top_ids)}"
            )
        elif m.margin < tie_margin and m.later_gap >= tie_margin:
            why = (
                f"baseline top-2 margin {m.margin:.3f} nats, a near-tie, but speculative token "
                f"{m.later_index} is {m.later_gap:.3f} nats below the target's best, over the tie "
                f"threshold {tie_margin:g}"
            )
        else:
            why = f"baseline top-2 margin {m.margin:.3f} nats, tie threshold {tie_margin:g}"
        return f"token {self.first_divergence} of prompt {self.prompt_index} ({why})"

    def as_dict(self, tie_margin: float = DEFAULT_TIE_MARGIN) -> dict[str, Any]:
        """A JSON-ready record; ``margin``: the baseline's top-2 margin at the first divergence
        (None: not measured)."""
        m = self.divergence_margin
        return {
            "prompt": self.prompt_index,
            "first_divergence": self.first_divergence,
            "margin": None if m is None else m.margin,
            "class": self.kind(tie_margin),
            "top2": None if m is None else m.as_dict(),
        }

    @property
    def common_prefix(self) -> int:
        """Tokens equal from the start."""
        return self.baseline_tokens if self.first_divergence is None else self.first_divergence

    @property
    def exact(self) -> bool:
        """Identical token ids."""
        return self.first_divergence is None


@dataclass(frozen=True)
class Equivalence:
    """All prompts' comparisons for a pair."""

    requests: tuple[RequestEquivalence, ...]
    #: Margin below which a divergence between the baseline's two best tokens is a tie (nats).
    tie_margin: float = DEFAULT_TIE_MARGIN

    def __post_init__(self) -> None:
        if not 0.0 <= self.tie_margin < float("inf"):
            raise ValueError(
                f"tie_margin must be a finite number of nats >= 0 (0 disables ties; "
                f"default {DEFAULT_TIE_MARGIN}), got {self.tie_margin!r}"
            )

    def classified(self, tie_margin: float) -> Equivalence:
        """The same comparison judged with another tie threshold."""
        return dataclasses.replace(self, tie_margin=tie_margin)

    @property
    def exact_fraction(self) -> float:
        """Share of prompts whose outputs are identical."""
        return sum(r.exact for r in self.requests) / len(self.requests) if self.requests else 0.0

    @property
    def ties(self) -> tuple[RequestEquivalence, ...]:
        """Prompts whose first divergence is a numerical tie."""
        return tuple(r for r in self.requests if r.kind(self.tie_margin) == TIE)

    @property
    def real_divergences(self) -> tuple[RequestEquivalence, ...]:
        """Prompts whose first divergence is real (or could not be shown to be a tie), earliest
        first."""
        real = [r for r in self.requests if r.kind(self.tie_margin) == REAL]
        return tuple(sorted(real, key=lambda r: (r.common_prefix, r.prompt_index)))

    @property
    def matched_fraction(self) -> float:
        """Share of prompts that are identical or diverge only at a numerical tie."""
        return 1.0 - len(self.real_divergences) / len(self.requests) if self.requests else 0.0

    @property
    def min_common_prefix(self) -> int:
        """Shortest common prefix over prompts."""
        return min((r.common_prefix for r in self.requests), default=0)

    @property
    def median_common_prefix(self) -> float:
        """Median common prefix over prompts."""
        return (
            float(statistics.median(r.common_prefix for r in self.requests))
            if self.requests
            else 0.0
        )

    @property
    def first_divergent(self) -> RequestEquivalence | None:
        """The prompt that diverges earliest, if any."""
        return min(
            (r for r in self.requests if not r.exact), key=lambda r: r.common_prefix, default=None
        )

    def summary(self) -> str:
        """``8/8 exact`` or ``6/8 exact, first divergence at token 12 (prompt 3)``, plus ``, 1
        numerical tie(s), 1 real`` once the divergences' margins were measured."""
        text = f"{sum(r.exact for r in self.requests)}/{len(self.requests)} exact"
        worst = self.first_divergent
        if worst is not None:
            text += (
                f", first divergence at token {worst.first_divergence} (prompt "
                f"{worst.prompt_index})"
            )
        if any(r.divergence_margin is not None for r in self.requests):  # classified
            text += f", {len(self.ties)} numerical tie(s), {len(self.real_divergences)} real"
        return text

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready description."""
        return {
            "exact_fraction": self.exact_fraction,
            "min_common_prefix": self.min_common_prefix,
            "median_common_prefix": self.median_common_prefix,
            "first_divergence": [r.first_divergence for r in self.requests],
            "tie_margin": self.tie_margin,
            "ties": len(self.ties),
            "real_divergences": len(self.real_divergences),
            "matched_fraction": self.matched_fraction,
            "divergences": [r.as_dict(self.tie_margin) for r in self.requests if not r.exact],
        }


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, the shorter length if one is a prefix of the other, None
    if identical."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(
    baseline: Sequence[Sequence[int]],
    speculative: Sequence[Sequence[int]],
    margins: Sequence[DivergenceMargin | None] = (),
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> Equivalence:
    """Compare the two arms prompt by prompt (same prompts, same order). ``margins``: per prompt,
    the baseline's top-2 at the first divergence (``Coherence.margins``); empty when not measured,
    leaving every divergence real."""
    if len(baseline) != len(speculative):
        raise ValueError(
            f"arms answered different numbers of prompts: baseline {len(baseline)}, "
            f"speculative {len(speculative)}"
        )
    if margins and len(margins) != len(baseline):
        raise ValueError(
            f"{len(margins)} divergence margins for {len(baseline)} prompts; expected one "
            f"per prompt (None where the outputs agree) or none at all"
        )
    out = []
    for i, (b, s) in enumerate(zip(baseline, speculative)):
        diverged_at = first_divergence(b, s)
        margin = margins[i] if margins and diverged_at is not None else None
        out.append(RequestEquivalence(i, len(b), len(s), diverged_at, margin))
    return Equivalence(tuple(out), tie_margin)
