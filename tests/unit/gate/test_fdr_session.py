"""``--specenergy-fdr`` as the session applies it: fail now, pass now, or pending until the
session finishes, where Benjamini-Hochberg decides and sets the exit status."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_specenergy.gate.gatekeeper import Judgement
from pytest_specenergy.session import SpecEnergySession

Q, N = 0.05, 10  # pending band: 0.005 < p <= 0.05


def _session(fdr=Q):
    session = SpecEnergySession(SimpleNamespace(fdr=fdr))
    session.fdr_tests = N
    return session


def _record(nodeid, *pvalues):
    rows = [{"metric": f"m{i}", "p_sequential": p, "verdict": "passed"} for i, p in enumerate(pvalues)]
    rows.append({"metric": "equivalence", "p_sequential": None, "verdict": "passed"})
    return {"nodeid": nodeid, "comparison": {"rows": rows}}


def _settled(session, record):
    judgement = Judgement(None)
    session._fdr_immediate(record["nodeid"], record, judgement)
    session.records.append(record)
    return judgement


def test_pending_comparisons_pass_now_and_are_decided_at_finish():
    session = _session()
    # 3 of 10 comparisons at p = 0.012: BH rejects them (0.012 <= 0.05 x 3 / 10).
    judged = [_settled(session, _record(f"t{i}", 0.012)) for i in range(3)]
    for i in range(3, 10):
        _settled(session, _record(f"t{i}", 0.9))
    assert all(j.warn and "pending FDR" in j.warn[0] and not j.fail for j in judged)
    assert session.records[0]["fdr_pending"] == ["t0::m0"]
    finished = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    block = session._finish_fdr(finished)
    assert finished.exitstatus == pytest.ExitCode.TESTS_FAILED
    assert block["pending_rejected"] == ["t0::m0", "t1::m0", "t2::m0"]
    assert "decided at session end" in session.fdr_result.summary()


def test_a_lone_pending_comparison_is_not_rejected_and_the_session_passes():
    session = _session()
    _settled(session, _record("t0", 0.012))  # 0.012 > 0.05 x 1 / 10
    for i in range(1, 10):
        _settled(session, _record(f"t{i}", 0.9))
    finished = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    block = session._finish_fdr(finished)
    assert finished.exitstatus == pytest.ExitCode.OK and block["rejected"] == []


def test_outside_the_band_nothing_is_pending():
    session = _session()
    judgement = _settled(session, _record("t0", 0.9, 0.001))
    assert not judgement.warn and session.records[0]["fdr_pending"] == []


def test_fdr_off_does_nothing():
    session = _session(fdr=None)
    session.records.append(_record("t0", 0.012))
    finished = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    assert session._finish_fdr(finished) is None and finished.exitstatus == pytest.ExitCode.OK
