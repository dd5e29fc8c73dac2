"""Metric definitions, one function each, the single place it is defined. Only accepted tokens
count: rejected drafts never enter a denominator, and token counts are the engine's own counters
over exactly the measured requests. A metric that cannot be computed (no verify steps, no tokens,
missing counters) is ``None``, never a number that would let an assertion pass silently.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable
from typing import Sequence


@dataclass(frozen=True)
class MetricInfo:
    """Everything the gate and the reports need to know about one metric. ``better``: the good
    direction (``lower``, ``higher`` or ``-``). ``percent_is_points``: a fraction at or across zero,
    so ``N%`` means N points, never a relative change. ``per_repeat``: None when the gate cannot
    check it, True with one sample per repeat (the sequential rule, ``gate/sequential.py``), False
    for the exact-match fraction, compared deterministically. ``samples``: where the gate's samples
    come from; ``display`` (a format spec) and ``suffix`` write one value."""

    name: str
    unit: str
    better: str
    description: str
    display: str = ".4g"
    suffix: str = ""
    percent_is_points: bool = False
    per_repeat: bool | None = None
    samples: str = ""

    @property
    def worse(self) -> str:
        """``up`` when a rise is worse, ``down`` when a fall is, ``-`` when neither."""
        return {"lower": "up", "higher": "down"}.get(self.better, "-")


#: THE metric registry: the gate's limits, its comparison and every report read it.
METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo(
            "energy_per_token",
            "J/token",
            "lower",
            "decode-window energy / output tokens committed in that window",
            per_repeat=True,
            samples="speculative arm's decode J per committed token, per repeat",
        ),
        # The gate's default energy metric: a GPU that runs 3% warmer today moves both arms of a
        # repeat cycle, so their ratio keeps only the drafter's effect (absolute J/token stays
        # reported and can still be gated by naming it).
        MetricInfo(
            "energy_ratio",
            "x",
            "lower",
            "speculative energy_per_token / its matched baseline's, per repeat cycle "
            "(within-session ratio)",
            display=".4f",
            per_repeat=True,
            samples="speculative/baseline J per committed token, repeat i of each arm paired "
            "(interleaved in one session, so a session offset cancels)",
        ),
        MetricInfo(
            "energy_saving",
            "fraction",
            "higher",
            "1 - speculative energy_per_token / baseline energy_per_token",
            display="+.1%",
            percent_is_points=True,
            per_repeat=True,
            samples="1 - spec/baseline energy per token, repeats paired by index",
        ),
        MetricInfo(
            "accept_length",
            "tokens/step",
            "higher",
            "tokens committed per verify step: 1 + accepted drafts / verify steps",
            display=".2f",
            per_repeat=True,
            samples="1 + accepted drafts / verify steps of each repeat (per-request accept "
            "lengths when the samples carry them)",
        ),
        MetricInfo(
            "acceptance_rate",
            "fraction",
            "higher",
            "accepted drafts / proposed drafts",
            display=".1%",
            per_repeat=True,
            samples="accepted/proposed drafts of each repeat",
        ),
        MetricInfo(
            "verified_per_step",
            "tokens",
            "-",
            "tokens the target verifies per request per step",
            display="d",
        ),
        MetricInfo(
            "tbt_ms",
            "ms",
            "lower",
            "mean time between tokens of the decode phase, per request",
            display=".2f",
            per_repeat=True,
            samples="speculative arm's mean time between tokens, per repeat",
        ),
        MetricInfo("baseline_tbt_ms", "ms", "lower", "the baseline arm's tbt_ms", display=".2f"),
        MetricInfo(
            "speedup",
            "x",
            "higher",
            "baseline tbt_ms / speculative tbt_ms",
            display=".2f",
            suffix="x",
            per_repeat=True,
            samples="baseline/spec time between tokens, repeats paired by index",
        ),
        MetricInfo(
            "equivalence",
            "fraction",
            "higher",
            "fraction of prompts whose output matches the baseline exactly",
            display=".0%",
            percent_is_points=True,
            per_repeat=False,
            samples="fraction of prompts whose output matches the baseline exactly",
        ),
        MetricInfo(
            "exact_fraction",
            "fraction",
            "higher",
            "the equivalence fraction, as a report column",
            display=".0%",
            percent_is_points=True,
        ),
        MetricInfo(
            "logprob_gap",
            "nats/token",
            "lower",
            "mean log-probability gap of the speculative continuation after a divergence",
            display=".3f",
        ),
    )
}


def energy_per_token(decode_joules: float, decode_tokens: int) -> float | None:
    """Joules per committed output token of the decode window."""
    return (
        None
        if decode_tokens <= 0 or not math.isfinite(decode_joules)
        else decode_joules / decode_tokens
    )


def energy_saving(speculative_ept: float | None, baseline_ept: float | None) -> float | None:
    """``1 - spec / baseline``; negative when speculation costs energy."""
    ratio = energy_ratio(baseline_ept, speculative_ept)
    return None if ratio is None else 1.0 - ratio


def accept_length(correct_drafts: int | None, verify_steps: int | None) -> float | None:
    """Tokens committed per verify step, the bonus token included."""
    return (
        None if correct_drafts is None or not verify_steps else 1.0 + correct_drafts / verify_steps
    )


def acceptance_rate(correct_drafts: int | None, proposed_drafts: int | None) -> float | None:
    """Accepted drafts over proposed drafts."""
    return (
        None if correct_drafts is None or not proposed_drafts else correct_drafts / proposed_drafts
    )


def request_tbt_ms(decode_seconds: float, completion_tokens: int) -> float | None:
    """One request's mean time between tokens: decode time over its ``n - 1`` gaps (the first token
    is prefill's)."""
    gaps = completion_tokens - 1
    return None if gaps <= 0 else 1000.0 * decode_seconds / gaps


def mean_tbt_ms(per_request: Iterable[float | None]) -> float | None:
    """Per-request TBT averaged over requests that decoded at least two tokens."""
    values = [v for v in per_request if v is not None]
    return statistics.fmean(values) if values else None


def speedup(baseline_tbt_ms: float | None, speculative_tbt_ms: float | None) -> float | None:
    """How many times shorter the speculative time between tokens is."""
    return (
        None
        if baseline_tbt_ms is None or not speculative_tbt_ms
        else baseline_tbt_ms / speculative_tbt_ms
    )


def energy_ratio(baseline_ept: float | None, speculative_ept: float | None) -> float | None:
    """Speculative over baseline energy per token (the gate's within-session ratio)."""
    if speculative_ept is None or baseline_ept is None or baseline_ept <= 0:
        return None
    return speculative_ept / baseline_ept


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """A number as text in ``spec``, ``n/a`` when it could not be computed (the one place that
    happens)."""
    return "n/a" if value is None else format(int(value) if spec == "d" else value, spec) + suffix


def show(metric: str, value: float | None) -> str:
    """A metric's value in the registry's display format (``.4g`` for an unknown metric)."""
    info = METRICS.get(metric)
    return fmt(value, info.display, info.suffix) if info else fmt(value, ".4g")


def median(values: Sequence[float | None]) -> float | None:
    """Median of the defined values (per-repeat samples), or None."""
    defined = [v for v in values if v is not None]
    return float(statistics.median(defined)) if defined else None


def compute_bound(verify_intensity: float | None, balance_point: float | None) -> bool | None:
    """Whether ``verify_intensity`` (FLOP/byte) lies past the balance point (saving turns to loss);
    None: unknown."""
    return (
        None
        if verify_intensity is None or balance_point is None
        else verify_intensity > balance_point
    )


def removal_draft_share(
    speculative_ept: Sequence[float | None], verify_only_ept: Sequence[float | None]
) -> float | None:
    """The draft passes' share of decode energy by draft removal (paper s.8): per repeat cycle ``1 -
    verify-only J/token / speculative J/token``, the mean over cycles; None when a cycle lacks
    either figure (a share that cannot be paired is not reported)."""
    if not speculative_ept or len(speculative_ept) != len(verify_only_ept):
        return None
    shares = []
    for spec, verify in zip(speculative_ept, verify_only_ept):
        if spec is None or verify is None or spec <= 0:
            return None
        shares.append(1.0 - verify / spec)
    return sum(shares) / len(shares)
