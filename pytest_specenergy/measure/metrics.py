"""Metric definitions: one function per metric, each the single place it is defined.

Only accepted tokens count: drafted-but-rejected tokens never enter a denominator, and
token counts come from the engine's own counters over exactly the measured requests. A
metric that cannot be computed (no verify steps, no tokens, missing counters) is ``None``,
never a number that would let an assertion pass silently.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable
from typing import Sequence


@dataclass(frozen=True)
class MetricInfo:
    """A metric's unit and which direction is better."""

    name: str
    unit: str
    better: str  # "lower" | "higher" | "-"
    description: str


METRICS: dict[str, MetricInfo] = {m.name: m for m in (
    MetricInfo("energy_per_token", "J/token", "lower",
               "decode-window energy / output tokens committed in that window"),
    MetricInfo("energy_saving", "fraction", "higher",
               "1 - speculative energy_per_token / baseline energy_per_token"),
    MetricInfo("accept_length", "tokens/step", "higher",
               "tokens committed per verify step: 1 + accepted drafts / verify steps"),
    MetricInfo("acceptance_rate", "fraction", "higher", "accepted drafts / proposed drafts"),
    MetricInfo("verified_per_step", "tokens", "-", "tokens the target verifies per request per step"),
    MetricInfo("tbt_ms", "ms", "lower", "mean time between tokens of the decode phase, per request"),
    MetricInfo("speedup", "x", "higher", "baseline tbt_ms / speculative tbt_ms"),
)}


def energy_per_token(decode_joules: float, decode_tokens: int) -> float | None:
    """Joules per committed output token of the decode window."""
    if decode_tokens <= 0 or not math.isfinite(decode_joules):
        return None
    return decode_joules / decode_tokens


def energy_saving(speculative_ept: float | None, baseline_ept: float | None) -> float | None:
    """``1 - spec / baseline``; negative when speculation costs energy."""
    if speculative_ept is None or baseline_ept is None or baseline_ept <= 0:
        return None
    return 1.0 - speculative_ept / baseline_ept


def accept_length(correct_drafts: int | None, verify_steps: int | None) -> float | None:
    """Tokens committed per verify step, the bonus token included."""
    if correct_drafts is None or not verify_steps:
        return None
    return 1.0 + correct_drafts / verify_steps


def acceptance_rate(correct_drafts: int | None, proposed_drafts: int | None) -> float | None:
    """Accepted drafts over proposed drafts."""
    if correct_drafts is None or not proposed_drafts:
        return None
    return correct_drafts / proposed_drafts


def request_tbt_ms(decode_seconds: float, completion_tokens: int) -> float | None:
    """One request's mean time between tokens: decode time over the gaps between its tokens.

    The first token comes from prefill, so ``n`` tokens have ``n - 1`` decode gaps.
    """
    gaps = completion_tokens - 1
    if gaps <= 0:
        return None
    return 1000.0 * decode_seconds / gaps


def mean_tbt_ms(per_request: Iterable[float | None]) -> float | None:
    """Per-request TBT averaged over requests that decoded at least two tokens."""
    values = [v for v in per_request if v is not None]
    return statistics.fmean(values) if values else None


def speedup(baseline_tbt_ms: float | None, speculative_tbt_ms: float | None) -> float | None:
    """How many times shorter the speculative time between tokens is."""
    if baseline_tbt_ms is None or not speculative_tbt_ms:
        return None
    return baseline_tbt_ms / speculative_tbt_ms


def median(values: Sequence[float | None]) -> float | None:
    """Median of the defined values (per-repeat samples), or None."""
    defined = [v for v in values if v is not None]
    return float(statistics.median(defined)) if defined else None
