"""``METRIC[:STAT]:LIMIT`` fail expressions for the regression gate (e.g. ``energy_ratio:5%``,
``accept_length:median:0.1``, ``equivalence:0``): how far a metric may move in its worse direction.
Syntax and meaning: docs/gate.md#fail-expressions."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Any
from typing import Iterable
from typing import Sequence

from pytest_specenergy.gate.settings import DEFAULT_LIMITS
from pytest_specenergy.metrics import METRICS
from pytest_specenergy.metrics import MetricInfo

STATS: tuple[str, ...] = ("median", "mean", "min", "max")
DEFAULT_STAT = "median"


#: The metrics a limit may name: the registry's entries the gate can check.
GATE_METRICS: dict[str, MetricInfo] = {
    name: info for name, info in METRICS.items() if info.per_repeat is not None
}

#: ``energy`` names the session-robust default, the ratio; energy_per_token gates absolute J.
ALIASES: dict[str, str] = {
    "energy": "energy_ratio",
    "ratio": "energy_ratio",
    "epat": "energy_per_token",
    "acceptance": "accept_length",
    "accept": "accept_length",
    "saving": "energy_saving",
    "tbt": "tbt_ms",
}

VALID_FORMS = (
    "METRIC[:STAT]:LIMIT where METRIC is one of "
    + ", ".join(GATE_METRICS)
    + " (aliases: "
    + ", ".join(f"{a}={m}" for a, m in ALIASES.items())
    + "), STAT is one of "
    + "|".join(STATS)
    + f" (default {DEFAULT_STAT}), and LIMIT is N% or an absolute value in the metric's unit; e.g. "
    "energy:5%, accept_length:median:0.1, energy_saving:2%, tbt_ms:mean:10%, equivalence:0"
)


class FailExprError(argparse.ArgumentTypeError, ValueError):
    """A fail expression could not be parsed; the message says why and shows the valid forms."""


@dataclass(frozen=True)
class FailLimit:
    """One parsed fail expression: ``threshold`` bounds the worse-direction change, a fraction of
    the baseline value when ``relative`` (5% -> 0.05), else an amount in the metric's unit."""

    metric: str
    stat: str
    threshold: float
    relative: bool
    expr: str

    @property
    def info(self) -> MetricInfo:
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
            amount = f"{self.threshold * 100:.6g}%"
        elif self.info.percent_is_points:
            amount = f"{self.threshold * 100:.6g} pts"
        else:
            amount = f"{self.threshold:.6g} {self.unit}"
        return f"{amount} {self.worse}"

    def worse_amount(self, baseline: float, current: float) -> float:
        """How far ``current`` moved in the worse direction (negative: better), in this limit's
        terms; relative to a zero baseline, any change is infinitely far."""
        sign = 1.0 if self.worse == "up" else -1.0
        if not self.relative:
            return sign * (current - baseline)
        if baseline == 0:
            return 0.0 if current == 0 else sign * math.copysign(math.inf, current)
        return sign * (current - baseline) / abs(baseline)

    def __str__(self) -> str:
        return self.expr


_NUMBER = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def parse_fail_expr(text: str) -> FailLimit:
    """Parse one ``METRIC[:STAT]:LIMIT`` expression; raises :class:`FailExprError`."""
    if not isinstance(text, str) or not text.strip():
        raise FailExprError(f"empty fail expression; expected {VALID_FORMS}")
    raw = text.strip()
    parts = [p.strip() for p in raw.split(":")]
    if len(parts) not in (2, 3):
        raise FailExprError(
            f"fail expression {raw!r} has {len(parts) - 1} ':' separators, "
            f"expected 1 or 2; expected {VALID_FORMS}"
        )
    name, stat, limit = parts[0], parts[1].lower() if len(parts) == 3 else DEFAULT_STAT, parts[-1]
    metric = ALIASES.get(name.lower(), name.lower())
    if metric not in GATE_METRICS:
        raise FailExprError(
            f"fail expression {raw!r}: unknown metric {name!r}; expected {VALID_FORMS}"
        )
    if stat not in STATS:
        raise FailExprError(
            f"fail expression {raw!r}: unknown statistic {stat!r}; expected one of "
            f"{', '.join(STATS)}"
        )
    info, percent = GATE_METRICS[metric], limit.endswith("%")
    number = limit[:-1].strip() if percent else limit
    # A strict pattern: float() accepts "nan", "inf" and "-5", none of which is a usable limit.
    if not _NUMBER.match(number):
        raise FailExprError(
            f"fail expression {raw!r}: limit {limit!r} is not a non-negative number or percentage; "
            f"expected N% (e.g. 5%) or an absolute value in {info.unit} (e.g. 0.1)"
        )
    # N% is N points for a fraction that may sit at or cross zero.
    threshold, relative = (
        (float(number) / 100.0, not info.percent_is_points) if percent else (float(number), False)
    )
    return FailLimit(metric=metric, stat=stat, threshold=threshold, relative=relative, expr=raw)


#: The block drift (either way) allowed for between arms not measured alongside each other (blocked
#: arms, a shared baseline): 0-3% is what an engine restart and a warming GPU give.
DEFAULT_BLOCK_DRIFT = 0.03


def merge_limits(*layers: Sequence[FailLimit]) -> list[FailLimit]:
    """Later layers override earlier ones metric by metric (defaults < ini/CLI < marker)."""
    merged: dict[str, FailLimit] = {}
    for layer in layers:
        overridden = {limit.metric for limit in layer}
        merged = {k: v for k, v in merged.items() if v.metric not in overridden}
        merged.update((f"{limit.metric}:{limit.stat}", limit) for limit in layer)
    return list(merged.values())


def limits_for(
    configured: Sequence[FailLimit], marker: Sequence[FailLimit] = ()
) -> list[FailLimit]:
    """The limits of one test: marker > command line/ini > :data:`DEFAULT_LIMITS`, metric by
    metric: naming one metric's limit never stops the gate from checking the others."""
    return merge_limits([parse_fail_expr(t) for t in DEFAULT_LIMITS], configured, marker)


def limits_of_test(configured: Sequence[FailLimit], tolerance: Any = None) -> list[FailLimit]:
    """The limits of one test from its ``tolerance`` marker (a pytest Mark, or None), e.g.
    ``tolerance(energy_per_token="5%")`` or ``tolerance("energy:median:5%")``; raises
    :class:`FailExprError`."""
    marker = []
    if tolerance is not None:
        for text in [str(a) for a in tolerance.args] + [
            f"{k}:{v}" for k, v in tolerance.kwargs.items()
        ]:
            try:
                marker.append(parse_fail_expr(text))
            except FailExprError as exc:
                raise FailExprError(f"marker tolerance value {text!r}: {exc}") from None
    return limits_for(configured, marker)


def per_repeat_count(limit_lists: Iterable[Sequence[FailLimit]]) -> int:
    """How many per-repeat comparisons (test x limit) these tests' limits make: the FDR's N."""
    return sum(
        1 for limits in limit_lists for limit in limits if GATE_METRICS[limit.metric].per_repeat
    )
