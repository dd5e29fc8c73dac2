"""The gatekeeper, built from plain values and run without pytest sessions or servers."""

from __future__ import annotations

from pathlib import Path

from test_compare import ab_record
from test_compare import ratio_record
from test_compare import record

from pytest_specenergy.document import build_document
from pytest_specenergy.gate import storage
from pytest_specenergy.gate.gatekeeper import Gatekeeper
from pytest_specenergy.gate.gatekeeper import GatePolicies
from pytest_specenergy.gate.gatekeeper import Judgement
from pytest_specenergy.gate.gatekeeper import NeedsRepeats
from pytest_specenergy.gate.limits import limits_for

KEY = "modeled-h200-cpu-reference-0.1.0"
NODE = "test_energy.py::test_x[code-ngram-b4]"
LIMITS = limits_for(())


def _store(tmp_path: Path, spec_ept: list[float], base_ept: list[float] | None = None) -> Path:
    rec = {"nodeid": NODE, "machine_key": KEY, **record(spec_ept, base_ept)}
    doc = build_document([rec], meters={}, engine_starts=1)
    return storage.save_run(doc, tmp_path, "main", machine_key=KEY)


def _gate(tmp_path: Path, **kwargs) -> Gatekeeper:
    return Gatekeeper(storage_dir=tmp_path, compare="main", repeats=3, max_repeats=9, **kwargs)


def test_a_regression_fails_with_the_numbers_and_the_file(tmp_path):
    path = _store(tmp_path, [1.0, 1.01, 0.99])  # ratio 0.5 in every repeat
    worse = {"nodeid": NODE, **ratio_record([0.65, 0.656, 0.644], [2.0, 2.02, 1.98])}
    judgement = _gate(tmp_path).judge(NODE, worse, KEY, LIMITS)
    assert isinstance(judgement, Judgement) and judgement.verdict == "regressed"
    assert str(path) in judgement.fail[0] and "energy_ratio" in judgement.fail[0]


def test_a_warmer_session_alone_is_not_a_regression(tmp_path):
    _store(tmp_path, [1.0, 1.01, 0.99])
    warm = {"nodeid": NODE, **record([1.06, 1.07, 1.05])}  # both arms 6% up, ratio 0.5
    judgement = _gate(tmp_path).judge(NODE, warm, KEY, LIMITS)
    assert judgement.verdict == "passed" and not judgement.fail


def test_an_unchanged_case_passes(tmp_path):
    _store(tmp_path, [1.0, 1.01, 0.99])
    judgement = _gate(tmp_path).judge(NODE, {"nodeid": NODE, **record([1.0, 1.01, 0.99])}, KEY, LIMITS)
    assert judgement.verdict == "passed" and not judgement.fail


def test_an_inconclusive_case_asks_for_repeats_until_the_cap(tmp_path):
    _store(tmp_path, [1.0, 1.03, 0.97], [2.0] * 3)
    gate = _gate(tmp_path, policies=GatePolicies(inconclusive="fail"))
    assert gate.plan.looks == (3, 5, 7, 9)
    cur = [1.07, 1.04, 1.10]
    for have, more in ((3, 2), (5, 2), (7, 2)):
        noisy = {"nodeid": NODE, **ratio_record([c / 2 for c in (cur * 3)[:have]], [2.0] * have)}
        assert gate.judge(NODE, noisy, KEY, LIMITS) == NeedsRepeats(more)
    at_cap = {"nodeid": NODE, **ratio_record([c / 2 for c in (cur * 3)], [2.0] * 9)}
    judgement = gate.judge(NODE, at_cap, KEY, LIMITS)
    assert isinstance(judgement, Judgement) and judgement.verdict == "inconclusive"
    # The policy is applied at the cap, never before.
    assert "inconclusive at the repeat cap; policy: fail" in judgement.fail[0]
    warn = _gate(tmp_path).judge(NODE, at_cap, KEY, LIMITS)
    assert warn.warn and not warn.fail


def test_in_job_a_b_needs_no_stored_baseline(tmp_path):
    gate = Gatekeeper(storage_dir=tmp_path, repeats=3, max_repeats=9)  # no --specenergy-compare
    worse = {"nodeid": NODE, **ab_record([0.60, 0.606, 0.594], [0.50, 0.505, 0.495], [2.0] * 3)}
    judgement = gate.judge(NODE, worse, KEY, LIMITS)
    assert judgement.verdict == "regressed" and "in-job A/B" in judgement.fail[0]
    same = {"nodeid": NODE, **ab_record([0.5, 0.505, 0.495], [0.5, 0.505, 0.495], [2.0] * 3)}
    assert gate.judge(NODE, same, KEY, LIMITS).verdict == "passed"
    close = {"nodeid": NODE, **ab_record([0.535, 0.52, 0.55], [0.50, 0.51, 0.49], [2.0] * 3)}
    assert gate.judge(NODE, close, KEY, LIMITS) == NeedsRepeats(2)


def test_a_missing_baseline_follows_its_policy(tmp_path):
    rec = {"nodeid": NODE, **record([1.0, 1.0, 1.0])}
    warn = _gate(tmp_path).judge(NODE, rec, KEY, LIMITS)
    assert warn.warn and not warn.fail and "no baseline" in warn.warn[0]
    fail = _gate(tmp_path, policies=GatePolicies(missing_baseline="fail")).judge(NODE, rec, KEY, LIMITS)
    assert fail.fail and "no baseline" in fail.fail[0]
