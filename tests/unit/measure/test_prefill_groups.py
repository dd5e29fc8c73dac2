"""The prefill-only twin's groups: the engine's prefill forwards, else send-time clusters."""

from __future__ import annotations

from pytest_specenergy.engines.meta_info import RequestCounters
from pytest_specenergy.measure.prefill_groups import engine_groups
from pytest_specenergy.measure.prefill_groups import prefill_groups
from pytest_specenergy.measure.prefill_groups import send_groups


def _counter(forward: int | None) -> RequestCounters:
    return RequestCounters("r", 5, 9, "length", None, None, prefill_forward=forward)


def test_engine_groups_follow_the_prefill_forward_numbers_in_order():
    counters = [_counter(f) for f in (7, 7, 9, 8, 9)]
    assert engine_groups(counters, range(5)) == ((0, 1), (3,), (2, 4))
    assert engine_groups(counters, (0, 2)) == ((0,), (2,))  # only the positions asked for


def test_an_engine_without_the_record_falls_back_to_send_times():
    counters = [_counter(None)] * 4
    assert engine_groups(counters, range(4)) is None
    groups, source = prefill_groups(counters, range(4), [0.0, 0.0005, 0.030, 0.0301], gap_s=0.002)
    assert source == "send-time" and groups == ((0, 1), (2, 3))


def test_send_groups_split_at_the_gap_and_keep_unsent_positions_alone():
    sent = [0.010, 0.0, 0.011, None, 0.5]
    assert send_groups(sent, range(5), gap_s=0.002) == ((1,), (0, 2), (4,), (3,))
