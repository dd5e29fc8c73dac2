"""An engine that dies during the repeats the gate added is warmed up again and recorded, as one
that died during the first repeats is (issue 42 item 5; audit 3, T35: ``add_repeats`` built its
measurers with no warm-up, so a restart among them was measured cold)."""

from __future__ import annotations

from test_pairs import InterleavePool
from test_pairs import TokenMeter
from test_pairs import _case
from test_pairs import _measurer

from pytest_specenergy.engines.drafters import Drafter


def _speculative_requests(log) -> int:
    """Requests the speculative engine generated in full (not the 1-token prefill twins)."""
    return sum(1 for e in log if e != "flush" and e[1] and e[3] > 1)


def _measured(case):
    """A measurer that has measured ``case``'s first 3 repeats (warm-up 1), its pool and the
    pool's log length after them."""
    pool = InterleavePool()
    measurer = _measurer(pool, TokenMeter(1.0), repeats=3, warmup=1)
    measurer.plan([case])
    first = measurer.measure(case)
    assert first.order.restarts == ()
    return measurer, pool, len(pool.log)


def _healthy_added_requests(case) -> int:
    """The speculative requests of 2 added repeats on engines that stayed up: the windows with
    their fillers (which depend on the repeats' numbers), no warm-up (the engine was warm)."""
    measurer, pool, before = _measured(case)
    pair = measurer.add_repeats(case, 2)
    assert pair.order.restarts == ()
    return _speculative_requests(pool.log[before:])


def test_a_restart_among_added_repeats_is_warmed_up_and_flagged():
    case = _case(Drafter("ngram"))
    healthy = _healthy_added_requests(case)
    measurer, pool, before = _measured(case)
    warm_up = case.batch  # one warm-up run's requests
    real_timed = measurer._timed

    def timed(arm_measurer, name, index, *args):
        result = real_timed(arm_measurer, name, index, *args)
        if name == "speculative" and index == 0:  # dies after the first added repeat
            pool.live.pop(arm_measurer.server.config)
        return result

    measurer._timed = timed
    pair = measurer.add_repeats(case, 2)
    assert [r.as_dict() for r in pair.order.restarts] == [
        {"arm": "speculative", "before_repeat": 4}
    ]
    [check] = [c for c in pair.checks if c.name == "engine-restarted"]
    assert "before its repeat 5 (warmed up again)" in check.message
    # The added windows as on healthy engines, and the restarted engine's warm-up.
    assert _speculative_requests(pool.log[before:]) == healthy + warm_up


def test_an_engine_that_died_before_the_added_repeats_is_warmed_up_and_flagged():
    # The engine died after the case's first repeats, before the gate asked for more: the added
    # repeats' measurer got a restarted engine, measured cold and unrecorded.
    case = _case(Drafter("ngram"))
    healthy = _healthy_added_requests(case)
    measurer, pool, before = _measured(case)
    pool.live.pop(case.spec_config())  # the speculative engine died
    pair = measurer.add_repeats(case, 2)
    assert [r.as_dict() for r in pair.order.restarts] == [
        {"arm": "speculative", "before_repeat": 3}
    ]
    assert any(c.name == "engine-restarted" for c in pair.checks)
    assert _speculative_requests(pool.log[before:]) == healthy + case.batch
