"""The steady window's end rule (``plan/window.py``): bounded requests, the same prompts for every
arm of a repeat, and the close."""

from __future__ import annotations

import pytest

from pytest_specenergy.plan.window import filler_prompts
from pytest_specenergy.plan.window import window_ends
from pytest_specenergy.plan.window import window_prompts
from pytest_specenergy.plan.window import window_requests


@pytest.mark.parametrize(
    ("batch", "pool", "requests"),
    [(1, 192, 8), (4, 192, 12), (16, 192, 48), (64, 192, 192), (64, 96, 96), (1, 5, 5)],
)
def test_a_window_sends_three_waves_of_the_batch_at_least_eight_at_most_the_pool(
    batch, pool, requests
):
    assert window_requests(batch, pool) == requests


def test_batch_1_no_longer_decodes_the_whole_pool():
    assert window_requests(1, 192) * 512 == 4096  # tokens, against 192 x 512 = 98,304 before


def test_repeats_walk_the_pool_and_every_arm_of_a_repeat_takes_the_same_prompts():
    assert window_prompts(1, 192, 0) == tuple(range(8))
    assert window_prompts(1, 192, 1) == tuple(range(8, 16))
    assert window_prompts(16, 100, 2) == tuple((96 + i) % 100 for i in range(48))
    assert window_prompts(64, 192, 5) == tuple(range(192))


def test_the_window_closes_when_all_are_sent_and_fewer_than_the_batch_remain():
    assert not window_ends(sent=47, in_flight=15, batch=16, requests=48)  # still refilling
    assert not window_ends(sent=48, in_flight=16, batch=16, requests=48)  # the batch still held
    assert window_ends(sent=48, in_flight=15, batch=16, requests=48)  # the first finish after
    assert not window_ends(sent=7, in_flight=0, batch=1, requests=8)
    assert window_ends(sent=8, in_flight=0, batch=1, requests=8)  # batch 1: the last answer


def test_fillers_are_the_next_repeats_prompts_and_the_last_window_prompt_ends_the_window():
    assert filler_prompts(4, 100, 0) == window_prompts(4, 100, 1)
    assert filler_prompts(4, 8, 0) == tuple(range(8))  # a pool of one window: its own again
    assert filler_prompts(1, 192, 0) == ()  # batch 1: the last prompt runs alone, as every other
    # With fillers the window ends at its last prompt's answer, fillers still in flight or not.
    assert window_ends(sent=20, in_flight=16, batch=16, requests=96, unanswered=0)
    assert not window_ends(sent=60, in_flight=16, batch=16, requests=96, unanswered=3)
    # The fillers ran out first: the old rule, fewer than the batch left.
    assert window_ends(sent=96, in_flight=15, batch=16, requests=96, unanswered=3)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="batch and pool"):
        window_requests(0, 10)
    with pytest.raises(ValueError, match="repeat"):
        window_prompts(1, 10, -1)
