"""Output equivalence between the speculative arm and its non-speculative twin: the engine's
``output_ids`` compared per request, each divergence a numerical tie or a real one (why ties exist
and how they are told apart: ``docs/methodology.md#equivalence-and-numerical-ties``).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any
from typing import Sequence

from pytest_specenergy.measure.numerics import ulp_margin

#: The tie margin where the engine's numerics are unknown (nats): one bfloat16 ulp of a logit in
#: [16, 32), where the top logits of real LLMs lie (:func:`~.numerics.ulp_margin`). A pair's own
#: margin comes from its engine (:func:`~.numerics.noise_margin`): float32 engines get the path
#: noise floor, 2**-13, so only rounding-sized near-ties are ties there.
DEFAULT_TIE_MARGIN = ulp_margin("bfloat16")

#: The largest share of a case's prompts that numerical ties may excuse. Noise flips a greedy token
#: only where the target nearly ties, a rare event per prompt (the ``numerical-noise`` fault tied
#: up to 3 of 8 prompts at 96 tokens); more prompts diverging at near-ties than this is a pattern,
#: and a bug that corrupts state flips the near-ties first, so every one then counts as real.
MAX_TIE_SHARE = 0.5

#: The classes of one prompt's comparison.
EXACT, TIE, REAL = "exact", "tie", "real"


@dataclass(frozen=True)
class DivergenceMargin:
    """The baseline model's two best tokens at a prompt's first diverging position. ``margin``: best
    minus second best log-probability (>= 0). ``between_top2``: the arms' two tokens are exactly
    those two (one arm stopped: the other's token is one and the rest a stop token); only then can a
    small margin explain the divergence. ``later_gap``: the largest shortfall (nats) of a
    speculative token below the target's best, from the divergence on (``later_index``: where),
    which guards the text after the tie (``docs/methodology.md``)."""

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
                f"threshold {tie_margin:.3g}"
            )
        else:
            why = f"baseline top-2 margin {m.margin:.3f} nats, tie threshold {tie_margin:.3g}"
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
    """All prompts' comparisons for a pair, judged by the tie rule: a divergence is a numerical tie
    only if the evidence says noise (between the baseline's two best tokens, their margin and every
    later shortfall under the engine's noise margin ``tie_margin``), and ties excuse at most
    ``max_tie_share`` of the prompts, else none."""

    requests: tuple[RequestEquivalence, ...]
    #: The engine's noise margin (nats): a tie's top-2 margin must be under it.
    tie_margin: float = DEFAULT_TIE_MARGIN
    #: The largest share of prompts ties may excuse.
    max_tie_share: float = MAX_TIE_SHARE
    #: Where ``tie_margin`` came from (the engine's dtype or emulated rounding, or a caller).
    tie_margin_source: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.tie_margin < float("inf"):
            raise ValueError(
                f"tie_margin must be a finite number of nats >= 0 (0 disables ties; "
                f"default: the engine's noise margin), got {self.tie_margin!r}"
            )
        if not 0.0 <= self.max_tie_share <= 1.0:
            raise ValueError(
                f"max_tie_share must be a share of prompts in [0, 1] (default {MAX_TIE_SHARE}), "
                f"got {self.max_tie_share!r}"
            )

    def classified(
        self, tie_margin: float | None = None, max_tie_share: float | None = None
    ) -> Equivalence:
        """The same comparison judged with another tie margin or share bound (None: unchanged)."""
        changed: dict[str, Any] = {}
        if tie_margin is not None and tie_margin != self.tie_margin:
            changed.update(tie_margin=tie_margin, tie_margin_source="given by the caller")
        if max_tie_share is not None:
            changed["max_tie_share"] = max_tie_share
        return dataclasses.replace(self, **changed) if changed else self

    @property
    def exact_fraction(self) -> float:
        """Share of prompts whose outputs are identical."""
        return sum(r.exact for r in self.requests) / len(self.requests) if self.requests else 0.0

    @property
    def near_ties(self) -> tuple[RequestEquivalence, ...]:
        """Prompts whose first divergence, alone, has a tie's evidence (before the share bound)."""
        return tuple(r for r in self.requests if r.kind(self.tie_margin) == TIE)

    @property
    def ties_over_bound(self) -> bool:
        """More prompts diverge at near-ties than ties may excuse: none is excused."""
        return len(self.near_ties) > self.max_tie_share * len(self.requests)

    @property
    def ties(self) -> tuple[RequestEquivalence, ...]:
        """Prompts whose first divergence is a numerical tie: the near-ties, unless they are more
        than ``max_tie_share`` of the prompts."""
        return () if self.ties_over_bound else self.near_ties

    def kind_of(self, request: RequestEquivalence) -> str:
        """``exact``, ``tie`` or ``real`` for one of this comparison's prompts."""
        if request.exact:
            return EXACT
        return TIE if request in self.ties else REAL

    def describe(self, request: RequestEquivalence) -> str:
        """One prompt's divergence, saying why a near-tie was not excused."""
        text = request.describe(self.tie_margin)
        if self.tie_margin_source and request.divergence_margin is not None:
            text = text[:-1] + f"; the threshold is {self.tie_margin_source})"
        if self.ties_over_bound and request in self.near_ties:
            text = text[:-1] + (
                f"; a near-tie, but {len(self.near_ties)} of {len(self.requests)} prompts diverge "
                f"at near-ties, more than the {self.max_tie_share:.0%} ties may excuse)"
            )
        return text

    @property
    def real_divergences(self) -> tuple[RequestEquivalence, ...]:
        """Prompts whose first divergence is real (or could not be shown to be a tie), earliest
        first."""
        real = [r for r in self.requests if self.kind_of(r) == REAL]
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
            if self.ties_over_bound:
                text += f" ({len(self.near_ties)} near-ties, over the tie share bound)"
        return text

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready description."""
        return {
            "exact_fraction": self.exact_fraction,
            "min_common_prefix": self.min_common_prefix,
            "median_common_prefix": self.median_common_prefix,
            "first_divergence": [r.first_divergence for r in self.requests],
            "tie_margin": self.tie_margin,
            "tie_margin_source": self.tie_margin_source,
            "max_tie_share": self.max_tie_share,
            "near_ties": len(self.near_ties),
            "ties": len(self.ties),
            "real_divergences": len(self.real_divergences),
            "matched_fraction": self.matched_fraction,
            "divergences": [
                {**r.as_dict(self.tie_margin), "class": self.kind_of(r)}
                for r in self.requests
                if not r.exact
            ],
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
    tie_margin_source: str | None = None,
    max_tie_share: float = MAX_TIE_SHARE,
) -> Equivalence:
    """Compare the two arms prompt by prompt (same prompts, same order). ``margins``: per prompt,
    the baseline's top-2 at the first divergence (``Coherence.margins``); empty when not measured,
    leaving every divergence real. ``tie_margin``: the engine's noise margin
    (:func:`~.numerics.noise_margin`), ``tie_margin_source`` where it came from."""
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
    return Equivalence(tuple(out), tie_margin, max_tie_share, tie_margin_source)
