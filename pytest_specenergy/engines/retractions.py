"""Retractions: SGLang takes a running request back to its waiting queue when the KV pool is full
and prefills it again later, inside the measured window. Counted per request from ``meta_info``
(:func:`count`), per arm over its windows, and compared between the arms (:func:`arms_differ`):
a window that recomputed prefills is not the steady decode the case declared, and arms that
retracted differently did different work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from pytest_specenergy.engines.meta_info import RequestCounters


@dataclass(frozen=True)
class Retractions:
    """What one arm's requests say about retraction: ``requests`` answered, how many of them were
    ``retracted`` and how often in all (``total``), and how many reported nothing (``unknown``:
    a release without ``num_retractions``)."""

    requests: int = 0
    retracted: int = 0
    total: int = 0
    unknown: int = 0

    def __add__(self, other: Retractions) -> Retractions:
        return Retractions(
            self.requests + other.requests,
            self.retracted + other.retracted,
            self.total + other.total,
            self.unknown + other.unknown,
        )

    def as_dict(self) -> dict[str, int]:
        """JSON-ready (a record's ``retractions``)."""
        return {
            "requests": self.requests,
            "retracted": self.retracted,
            "total": self.total,
            "unknown": self.unknown,
        }

    def describe(self) -> str:
        """``3 of 192 requests retracted (4 retractions)``, with the unknown ones."""
        text = f"{self.retracted} of {self.requests} requests retracted ({self.total} retractions)"
        return text + (f", {self.unknown} not reported" if self.unknown else "")


def count(counters: Iterable[RequestCounters]) -> Retractions:
    """The retractions of a window's (or an arm's) requests."""
    requests = retracted = total = unknown = 0
    for request in counters:
        requests += 1
        if request.retractions is None:
            unknown += 1
        elif request.retractions > 0:
            retracted += 1
            total += request.retractions
    return Retractions(requests, retracted, total, unknown)


@dataclass(frozen=True)
class RetractionFlag:
    """A check the measurer records on the pair: ``severity`` fail (the arms differ) or warn (both
    retracted alike), and the message."""

    name: str
    severity: str
    message: str


def arms_differ(baseline: Retractions, speculative: Retractions) -> RetractionFlag | None:
    """The flag for two arms' retractions, or None when neither arm retracted. The arms differ
    (in requests retracted or retractions): ``fail``, the arms did different work. Both retracted
    alike: ``warn``, the recomputed prefills sit in both windows. Arms that report no count (a
    release without ``num_retractions``) show nothing, so give None."""
    if not baseline.total and not speculative.total:
        return None
    differ = (baseline.retracted, baseline.total) != (speculative.retracted, speculative.total)
    return RetractionFlag(
        name="retractions-differ" if differ else "retractions",
        severity="fail" if differ else "warn",
        message=(
            f"SGLang retracted requests (KV pool full) inside the measured windows"
            f"{', differently in the two arms' if differ else ', in both arms alike'}: baseline "
            f"{baseline.describe()}, speculative {speculative.describe()}; a retracted request is "
            "prefilled again inside the window, which is then not the steady decode the case "
            "declared. Give the engines a larger KV pool (max_total_tokens, or blocked order with "
            "resident=False) or lower the batch or max_new_tokens"
        ),
    )
