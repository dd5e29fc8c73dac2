"""Descriptive statistics by hand (scipy is not a dependency)."""

from __future__ import annotations

import pytest

from pytest_specenergy.gate.stats import summarize


def test_summary_by_hand():
    s = summarize([1, 2, 3, 4, 10])
    assert (s.n, s.min, s.max, s.mean, s.median) == (5, 1.0, 10.0, 4.0, 3.0)
    assert s.stat("median") == 3.0 and s.stat("max") == 10.0
    one = summarize([2.5, None])
    assert one.n == 1 and one.median == 2.5
    with pytest.raises(ValueError, match="empty sample"):
        summarize([None])
    with pytest.raises(ValueError, match="non-finite"):
        summarize([1.0, float("nan")])
    with pytest.raises(ValueError, match="unknown statistic 'p99'"):
        s.stat("p99")
