"""How a full window's requests were prefilled: which ones shared a prefill forward (why it matters
and its two sources: ``docs/methodology.md#prefill-groups``).
"""

from __future__ import annotations

from typing import Sequence

from pytest_specenergy.engines.meta_info import RequestCounters

#: Send-time grouping when the step time is unknown: refills of one step leave the client within
#: about a millisecond of each other, while GPU decode steps take 5 ms or more.
DEFAULT_SEND_GAP_S = 0.002

#: Groups: each a tuple of positions (into the window's requests), in the order prefilled.
Groups = tuple[tuple[int, ...], ...]


#: Where a grouping came from: the engine's forward numbers (the reference server), the engine's
#: forward stamps (SGLang's ``forward_entry_time``, ``--enable-metrics``), or the client's send times
#: (a guess: refused by the ``prefill-grouping-guessed`` check).
ENGINE = "engine"
ENGINE_STAMPS = "engine (forward_entry_time)"
SEND_TIME = "send-time"


def engine_groups(counters: Sequence[RequestCounters], positions: Sequence[int]) -> Groups | None:
    """``positions`` grouped by the prefill forward the engine reports for each; None when any lacks
    that number."""
    return _grouped(counters, positions, "prefill_forward")


def stamp_groups(counters: Sequence[RequestCounters], positions: Sequence[int]) -> Groups | None:
    """``positions`` grouped by the start of the prefill forward SGLang stamped on each
    (``forward_entry_time``: ``scheduler.py`` stamps every request of a prefill batch with one
    ``perf_counter`` reading, ``set_time_batch``), so equal stamps are one forward; None when any
    lacks it."""
    return _grouped(counters, positions, "forward_entry_time")


def _grouped(
    counters: Sequence[RequestCounters], positions: Sequence[int], key: str
) -> Groups | None:
    forwards: dict[float, list[int]] = {}
    for position in positions:
        forward = getattr(counters[position], key)
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
    """The grouping of ``positions`` and where it came from (:data:`ENGINE`,
    :data:`ENGINE_STAMPS` or :data:`SEND_TIME`)."""
    grouped = engine_groups(counters, positions)
    if grouped is not None:
        return grouped, ENGINE
    stamped = stamp_groups(counters, positions)
    if stamped is not None:
        return stamped, ENGINE_STAMPS
    return send_groups(sent, positions, gap_s), SEND_TIME
