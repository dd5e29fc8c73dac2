"""How a full window's requests were prefilled: which ones shared a prefill forward (why it matters
and its two sources: ``docs/design/measure.md``, section
``pytest_specenergy/measure/prefill_groups.py``).
"""

from __future__ import annotations

from typing import Sequence

from pytest_specenergy.engines.meta_info import RequestCounters

#: Send-time grouping when the step time is unknown: refills of one step leave the client within
#: about a millisecond of each other, while GPU decode steps take 5 ms or more.
DEFAULT_SEND_GAP_S = 0.002

#: Groups: each a tuple of positions (into the window's requests), in the order prefilled.
Groups = tuple[tuple[int, ...], ...]


def engine_groups(counters: Sequence[RequestCounters], positions: Sequence[int]) -> Groups | None:
    """``positions`` grouped by the prefill forward the engine reports for each; None when any lacks
    that number."""
    forwards: dict[int, list[int]] = {}
    for position in positions:
        forward = counters[position].prefill_forward
        if forward is None:
            return None
        forwards.setdefault(forward, []).append(position)
    return tuple(tuple(forwards[f]) for f in sorted(forwards))


def send_groups(sent: Sequence[float | None], positions: Sequence[int], gap_s: float) -> Groups:
    """``positions`` grouped by when they were sent: a request sent more than ``gap_s`` after the
    one before it opens a new group. A position with no send time is a group of its own."""
    timed = sorted((p for p in positions if sent[p] is not None), key=lambda p: sent[p])  # type: ignore[arg-type, return-value]
    groups: list[list[int]] = []
    last: float | None = None
    for position in timed:
        at = float(sent[position])  # type: ignore[arg-type]
        if last is None or at - last > gap_s:
            groups.append([])
        groups[-1].append(position)
        last = at
    groups += [[p] for p in positions if sent[p] is None]
    return tuple(tuple(g) for g in groups)


def prefill_groups(
    counters: Sequence[RequestCounters],
    positions: Sequence[int],
    sent: Sequence[float | None],
    gap_s: float = DEFAULT_SEND_GAP_S,
) -> tuple[Groups, str]:
    """The grouping of ``positions`` and where it came from (``engine`` or ``send-time``)."""
    grouped = engine_groups(counters, positions)
    return (
        (grouped, "engine")
        if grouped is not None
        else (send_groups(sent, positions, gap_s), "send-time")
    )
