"""The gatekeeper, built from plain values and run without pytest sessions or servers."""

from __future__ import annotations

from pathlib import Path

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


def _store(tmp_path: Path, spec_ept: list[float]) -> Path:
    rec = {"nodeid": NODE, "machine_key": KEY, **record(spec_ept)}
    doc = build_document([rec], meters={}, engine_starts=1)
    return storage.save_run(doc, tmp_path, "main", machine_key=KEY)


def _gate(tmp_path: Path, **kwargs) -> Gatekeeper:
    return Gatekeeper(storage_dir=tmp_path, compare="main", repeats=3, max_repeats=9, **kwargs)


def test_a_regression_fails_with_the_numbers_and_the_file(tmp_path):
    path = _store(tmp_path, [1.0, 1.01, 0.99])
    judgement = _gate(tmp_path).judge(NODE, {"nodeid": NODE, **record([1.3, 1.31, 1.29])}, KEY, LIMITS)
    assert isinstance(judgement, Judgement) and judgement.verdict == "regressed"
    assert str(path) in judgement.fail[0] and "energy_per_token" in judgement.fail[0]


def test_an_unchanged_case_passes(tmp_path):
    _store(tmp_path, [1.0, 1.01, 0.99])
    judgement = _gate(tmp_path).judge(NODE, {"nodeid": NODE, **record([1.0, 1.01, 0.99])}, KEY, LIMITS)
    assert judgement.verdict == "passed" and not judgement.fail


def test_an_inconclusive_case_asks_for_repeats_until_the_cap(tmp_path):
    _store(tmp_path, [1.0, 1.05, 0.95])
    gate = _gate(tmp_path, policies=GatePolicies(inconclusive="fail"))
    noisy = {"nodeid": NODE, **record([1.07, 1.01, 1.13])}
    assert gate.judge(NODE, noisy, KEY, LIMITS) == NeedsRepeats(3)
    at_cap = {"nodeid": NODE, **record([1.07, 1.01, 1.13] * 3)}
    judgement = gate.judge(NODE, at_cap, KEY, LIMITS)
    assert isinstance(judgement, Judgement)
    if judgement.verdict == "inconclusive":  # the policy is applied at the cap, never before
        assert "inconclusive at the repeat cap; policy: fail" in judgement.fail[0]


def test_a_missing_baseline_follows_its_policy(tmp_path):
    rec = {"nodeid": NODE, **record([1.0, 1.0, 1.0])}
    warn = _gate(tmp_path).judge(NODE, rec, KEY, LIMITS)
    assert warn.warn and not warn.fail and "no baseline" in warn.warn[0]
    fail = _gate(tmp_path, policies=GatePolicies(missing_baseline="fail")).judge(NODE, rec, KEY, LIMITS)
    assert fail.fail and "no baseline" in fail.fail[0]
