"""The between-session term: estimated from the stored history, declared for a measured meter's
ratio, none on a modeled meter; absolute J/token across sessions refused without history."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.sequential import SequentialPlan
from pytest_specenergy.gate.sequential import sequential_arrays
from pytest_specenergy.gate.session_term import DECLARED_RATIO_SD
from pytest_specenergy.gate.session_term import estimate
from pytest_specenergy.gate.session_term import session_term
from pytest_specenergy.gate.verdict import Verdict


def test_the_estimate_removes_what_the_within_session_spread_explains():
    rng = np.random.default_rng(1)
    # 400 sessions of 15 repeats: a 1% sd session effect under 3% repeat noise.
    sessions = np.exp(0.01 * rng.standard_normal((400, 1)) + 0.03 * rng.standard_normal((400, 15)))
    term = estimate(list(sessions))
    assert term is not None and term.sd == pytest.approx(0.01, abs=0.002) and term.df == 399
    assert estimate(list(sessions[:2])) is None  # too few sessions
    # No session effect at all: the means vary only as much as their repeats explain.
    flat = np.exp(0.03 * rng.standard_normal((400, 15)))
    assert estimate(list(flat)).sd < 0.004


def test_declared_for_a_measured_ratio_none_for_a_modeled_one_and_absolute_needs_history():
    assert session_term("energy_ratio", [], measured=True).sd == DECLARED_RATIO_SD
    assert session_term("energy_ratio", [], measured=True).df is None
    assert session_term("energy_ratio", [], measured=False) is None
    assert session_term("energy_per_token", [], measured=True) is None


def _record(values, source="measured (nvml)"):
    samples = [{"decode_joules": v, "decode_seconds": 1.0, "decode_tokens": 1} for v in values]
    arm = lambda xs: {"source": source, "samples": xs}  # noqa: E731
    base = [{"decode_joules": 1.0, "decode_seconds": 1.0, "decode_tokens": 1}] * len(values)
    return CaseRecord.from_dict(
        {"case_id": "c", "source": source, "baseline": arm(base), "speculative": arm(samples)}
    )


def test_absolute_j_per_token_across_sessions_is_not_judged_without_history():
    limit = parse_fail_expr("energy_per_token:5%")
    stored, current = _record([0.70, 0.71, 0.69]), _record([0.70, 0.70, 0.71])
    [row] = compare_case(stored, current, [limit]).rows
    assert row.verdict is Verdict.INCOMPARABLE and "3 needed" in row.note
    history = [stored, _record([0.72, 0.71, 0.73]), _record([0.69, 0.70, 0.68])]
    [row] = compare_case(stored, current, [limit], history=history).rows
    assert row.verdict is not Verdict.INCOMPARABLE and "estimated from 3" in row.note
    # A modeled meter has no session offset: judged as before, no term.
    modeled = _record([0.7] * 3, "modeled (h200)")
    [row] = compare_case(modeled, modeled, [limit]).rows
    assert row.verdict is Verdict.PASSED and "between-session" not in row.note


def test_the_ratio_row_names_its_term():
    limit = parse_fail_expr("energy_ratio:5%")
    stored, current = _record([0.70, 0.71, 0.69]), _record([0.70, 0.70, 0.71])
    [row] = compare_case(stored, current, [limit]).rows
    assert "between-session sd 1.00% per session (declared" in row.note


def test_the_term_holds_alpha_at_the_limit_where_sessions_move_the_ratio():
    """A true change at the 5% limit, 3% arm noise, a stored run of 15, each session moving the
    ratio by N(0, 1%): without the term P(REGRESSED) exceeds alpha (the issue's 11.5%); with the
    declared term it holds 5% (4000 cases, 2 binomial standard errors: 0.7 points)."""
    rng = np.random.default_rng(3)
    rows, noise, limit = 4000, 0.03 * math.sqrt(2), 0.05
    effect = 0.01 * rng.standard_normal((rows, 2))
    stored = effect[:, :1] + noise * rng.standard_normal((rows, 15))
    current = math.log1p(limit) + effect[:, 1:] + noise * rng.standard_normal((rows, 11))
    plan = SequentialPlan()

    def p_regressed(session_sd):
        out = sequential_arrays(current, stored, limit=limit, plan=plan, session_sd=session_sd)
        return float(np.mean(out.code == 3))

    assert p_regressed(0.0) > 0.08
    assert p_regressed(math.sqrt(2) * DECLARED_RATIO_SD) <= 0.05 + 0.007
