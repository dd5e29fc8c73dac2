"""``--specenergy-fdr`` as the gate decides it for a suite: fail now, pass now, or pending until
the session finishes, where Benjamini-Hochberg decides and the suite verdict fails the session."""

from __future__ import annotations

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.gate.compare import CaseComparison
from pytest_specenergy.gate.compare import MetricRow
from pytest_specenergy.gate.compare import gate_plan
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.suite import fdr_pending
from pytest_specenergy.gate.suite import judge_suite
from pytest_specenergy.gate.verdict import Verdict

Q, N = 0.05, 10  # pending band: 0.005 < p <= 0.05
PLAN = gate_plan()
_ARM = {"source": "modeled (h200)", "samples": []}


def _row(metric, p):
    return MetricRow(
        metric,
        "median",
        "x",
        1.0,
        1.0,
        0.0,
        0.0,
        parse_fail_expr("energy:5%"),
        p,
        "sequential",
        3,
        3,
        None,
        Verdict.PASSED,
        p_sequential=p,
    )


def _record(nodeid, *pvalues):
    """A judged record whose comparison has one row per p-value (and an equivalence row without)."""
    rows = [_row(f"m{i}", p) for i, p in enumerate(pvalues)] + [_row("equivalence", None)]
    return CaseRecord.from_dict(
        {"nodeid": nodeid, "case_id": nodeid, "baseline": _ARM, "speculative": _ARM}
    ), CaseComparison(nodeid, Verdict.PASSED, tuple(rows))


def _settled(judged):
    record, comparison = judged
    pending, warnings = fdr_pending(record.key, comparison, Q, N)
    return record.judged("passed", comparison.as_dict(), None, pending), warnings


def test_pending_comparisons_pass_now_and_are_decided_at_finish():
    # 3 of 10 comparisons at p = 0.012: BH rejects them (0.012 <= 0.05 x 3 / 10).
    settled = [_settled(_record(f"t{i}", 0.012)) for i in range(3)]
    settled += [_settled(_record(f"t{i}", 0.9)) for i in range(3, 10)]
    assert all(w and "pending FDR" in w[0] for _, w in settled[:3])
    assert settled[0][0].fdr_pending == ("t0::m0",)
    suite = judge_suite([r for r, _ in settled], plan=PLAN, fdr_q=Q, fdr_collected=N)
    assert suite.failed
    assert suite.fdr.pending_rejected == ("t0::m0", "t1::m0", "t2::m0")
    [section] = suite.sections
    assert section.failed and any("decided at session end" in line for line in section.lines)
    assert any("exit status 1" in line for line in section.lines)


def test_a_lone_pending_comparison_is_not_rejected_and_the_session_passes():
    settled = [_settled(_record("t0", 0.012))[0]]  # 0.012 > 0.05 x 1 / 10
    settled += [_settled(_record(f"t{i}", 0.9))[0] for i in range(1, 10)]
    suite = judge_suite(settled, plan=PLAN, fdr_q=Q, fdr_collected=N)
    assert not suite.failed and suite.fdr.rejected == ()


def test_outside_the_band_nothing_is_pending():
    record, warnings = _settled(_record("t0", 0.9, 0.001))
    assert not warnings and record.fdr_pending == ()


def test_fdr_off_decides_nothing():
    suite = judge_suite([_settled(_record("t0", 0.012))[0]], plan=PLAN)
    assert suite.fdr is None and not suite.failed and suite.sections == ()
