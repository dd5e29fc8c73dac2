"""``METRIC[:STAT]:LIMIT`` fail expressions for the regression gate.

Examples: ``energy_per_token:5%``, ``energy:median:5%``, ``accept_length:median:0.1``,
``energy_saving:2%``, ``tbt_ms:mean:10%``, ``equivalence:0``. An expression says how far a
metric may move in its *worse* direction before a change counts as a regression. Every
metric knows that direction (energy and time get worse going up, acceptance, savings and
equivalence going down), so unlike pytest-benchmark's increase-only checks the same syntax
works for both kinds.

``LIMIT`` is ``N%`` (relative to the baseline's value) or a bare number in the metric's own
unit. ``energy_saving`` and ``equivalence`` are fractions that may sit at or cross zero, where
a relative change means nothing, so for them ``N%`` means N percentage points (``2%`` = 0.02).

:func:`parse_fail_expr` raises :class:`FailExprError`, which is both a ``ValueError`` and an
``argparse.ArgumentTypeError``, so it works as an argparse ``type=`` and argparse shows our
message rather than a generic "invalid value".
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Iterable

STATS: tuple[str, ...] = ("median", "mean", "min", "max")
DEFAULT_STAT = "median"


@dataclass(frozen=True)
class GateMetric:
    """A metric the gate can check: its unit, worse direction and where samples come from.

    ``per_repeat`` metrics have one sample per measured repeat and are tested for
    significance; the others are pooled counters (or an exact-match fraction) with no
    per-repeat variance, compared deterministically. ``percent_is_points``: ``N%`` is an
    absolute limit of N percentage points instead of a change relative to the baseline.
    """

    name: str
    unit: str
    worse: str  # "up" | "down"
    per_repeat: bool
    percent_is_points: bool
    description: str


GATE_METRICS: dict[str, GateMetric] = {m.name: m for m in (
    GateMetric("energy_per_token", "J/token", "up", True, False,
               "speculative arm's decode J per committed token, per repeat"),
    GateMetric("tbt_ms", "ms", "up", True, False,
               "speculative arm's mean time between tokens, per repeat"),
    GateMetric("energy_saving", "fraction", "down", True, True,
               "1 - spec/baseline energy per token, repeats paired by index"),
    GateMetric("speedup", "x", "down", True, False,
               "baseline/spec time between tokens, repeats paired by index"),
    GateMetric("accept_length", "tokens/step", "down", False, False,
               "tokens per verify step from pooled counters"),
    GateMetric("acceptance_rate", "fraction", "down", False, False,
               "accepted/proposed drafts from pooled counters"),
    GateMetric("equivalence", "fraction", "down", False, True,
               "fraction of prompts whose output matches the baseline exactly"),
)}

ALIASES: dict[str, str] = {
    "energy": "energy_per_token",
    "epat": "energy_per_token",
    "acceptance": "accept_length",
    "accept": "accept_length",
    "saving": "energy_saving",
    "tbt": "tbt_ms",
}

VALID_FORMS = ("METRIC[:STAT]:LIMIT where METRIC is one of "
               + ", ".join(GATE_METRICS) + " (aliases: "
               + ", ".join(f"{a}={m}" for a, m in ALIASES.items()) + "), STAT is one of "
               + "|".join(STATS) + f" (default {DEFAULT_STAT}), and LIMIT is N% or an absolute "
               "value in the metric's unit; e.g. energy:5%, accept_length:median:0.1, "
               "energy_saving:2%, tbt_ms:mean:10%, equivalence:0")


class FailExprError(argparse.ArgumentTypeError, ValueError):
    """A fail expression could not be parsed; the message says why and shows the valid forms."""


@dataclass(frozen=True)
class FailLimit:
    """One parsed fail expression.

    ``threshold`` is what the worse-direction change is compared against: a fraction of the
    baseline value when ``relative`` (5% -> 0.05), else an amount in the metric's unit.
    """

    metric: str
    stat: str
    threshold: float
    relative: bool
    expr: str

    @property
    def info(self) -> GateMetric:
        """The metric's registry entry."""
        return GATE_METRICS[self.metric]

    @property
    def worse(self) -> str:
        """``up`` or ``down``: the direction in which this metric regresses."""
        return self.info.worse

    @property
    def unit(self) -> str:
        """The metric's unit (absolute limits are in it)."""
        return self.info.unit

    def describe(self) -> str:
        """The limit in words, e.g. ``5% up`` or ``0.1 tokens/step down``."""
        if self.relative:
            amount = f"{_trim(self.threshold * 100)}%"
        elif self.info.percent_is_points:
            amount = f"{_trim(self.threshold * 100)} pts"
        else:
            amount = f"{_trim(self.threshold)} {self.unit}"
        return f"{amount} {self.worse}"

    def worse_amount(self, baseline: float, current: float) -> float:
        """How far ``current`` moved in the worse direction, in this limit's terms.

        Positive means worse, negative better. Relative limits measure the change as a
        fraction of the baseline (a zero baseline with a changed current is infinitely far).
        """
        sign = 1.0 if self.worse == "up" else -1.0
        if not self.relative:
            return sign * (current - baseline)
        if baseline == 0:
            return 0.0 if current == 0 else sign * math.copysign(math.inf, current)
        return sign * (current - baseline) / abs(baseline)

    def __str__(self) -> str:
        return self.expr


def parse_fail_expr(text: str) -> FailLimit:
    """Parse one ``METRIC[:STAT]:LIMIT`` expression; raises :class:`FailExprError`."""
    if not isinstance(text, str) or not text.strip():
        raise FailExprError(f"empty fail expression; expected {VALID_FORMS}")
    raw = text.strip()
    parts = [p.strip() for p in raw.split(":")]
    if len(parts) == 2:
        name, stat, limit = parts[0], DEFAULT_STAT, parts[1]
    elif len(parts) == 3:
        name, stat, limit = parts[0], parts[1].lower(), parts[2]
    else:
        raise FailExprError(f"fail expression {raw!r} has {len(parts) - 1} ':' separators, "
                            f"expected 1 or 2; expected {VALID_FORMS}")
    metric = ALIASES.get(name.lower(), name.lower())
    if metric not in GATE_METRICS:
        raise FailExprError(f"fail expression {raw!r}: unknown metric {name!r}; expected "
                            f"{VALID_FORMS}")
    if stat not in STATS:
        raise FailExprError(f"fail expression {raw!r}: unknown statistic {stat!r}; expected "
                            f"one of {', '.join(STATS)}")
    threshold, relative = _parse_limit(raw, limit, GATE_METRICS[metric])
    return FailLimit(metric=metric, stat=stat, threshold=threshold, relative=relative, expr=raw)


def parse_fail_exprs(texts: Iterable[str | FailLimit] | str) -> list[FailLimit]:
    """Parse several expressions (an iterable, or one string split on whitespace/commas).

    A later expression for the same metric and statistic replaces an earlier one, so an ini
    default can be overridden on the command line.
    """
    if isinstance(texts, str):
        texts = [t for t in re.split(r"[\s,]+", texts) if t]
    by_key: dict[tuple[str, str], FailLimit] = {}
    for text in texts:
        limit = text if isinstance(text, FailLimit) else parse_fail_expr(text)
        by_key[(limit.metric, limit.stat)] = limit
    return list(by_key.values())


_NUMBER = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _parse_limit(raw: str, limit: str, info: GateMetric) -> tuple[float, bool]:
    percent = limit.endswith("%")
    number = limit[:-1].strip() if percent else limit
    # A strict pattern rather than float(): float() accepts "nan", "inf" and "-5", none of
    # which is a usable limit.
    if not _NUMBER.match(number):
        raise FailExprError(f"fail expression {raw!r}: limit {limit!r} is not a non-negative "
                            f"number or percentage; expected N% (e.g. 5%) or an absolute "
                            f"value in {info.unit} (e.g. 0.1)")
    value = float(number)
    if percent:
        if info.percent_is_points:
            return value / 100.0, False
        return value / 100.0, True
    return value, False


def _trim(value: float) -> str:
    return f"{value:.6g}"
