"""The gatekeeper, built from plain values and run without pytest sessions or servers."""

from __future__ import annotations

from pathlib import Path

from test_compare import ab_record
from test_compare import ratio_record
from test_compare import record

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.gatekeeper import Gatekeeper
from pytest_specenergy.gate.gatekeeper import GatePolicies
from pytest_specenergy.gate.gatekeeper import Judgement
from pytest_specenergy.gate.gatekeeper import NeedsRepeats
from pytest_specenergy.gate.limits import limits_for
from pytest_specenergy.gate.storage import RunStore

KEY = "modeled-h200-cpu-reference-0.1.0"
NODE = "test_energy.py::test_x[code-ngram-b4]"
LIMITS = limits_for(())


def _rec(fields: dict) -> CaseRecord:
    """A record of this test on this machine key, read as a loaded run gives it."""
    return CaseRecord.from_dict({"nodeid": NODE, "machine_key": KEY, **fields})


def _store(tmp_path: Path, spec_ept: list[float], base_ept: list[float] | None = None) -> Path:
    return _store_record(tmp_path, record(spec_ept, base_ept))


def _store_record(tmp_path: Path, fields: dict) -> Path:
    return RunStore(tmp_path).save(
        RunDocument.build([_rec(fields)], meters={}, engine_starts=1), "main"
    )


def _gate(tmp_path: Path, **kwargs) -> Gatekeeper:
    return Gatekeeper(runs=RunStore(tmp_path), compare="main", repeats=3, max_repeats=9, **kwargs)


def test_a_regression_fails_with_the_numbers_and_the_file(tmp_path):
    path = _store(tmp_path, [1.0, 1.01, 0.99])  # ratio 0.5 in every repeat
    worse = _rec(ratio_record([0.65, 0.656, 0.644], [2.0, 2.02, 1.98]))
    judgement = _gate(tmp_path).judge(worse, LIMITS)
    assert isinstance(judgement, Judgement) and judgement.verdict == "regressed"
    assert str(path) in judgement.fail[0] and "energy_ratio" in judgement.fail[0]


def test_a_warmer_session_alone_is_not_a_regression(tmp_path):
    _store(tmp_path, [1.0, 1.01, 0.99])
    warm = _rec(record([1.06, 1.07, 1.05]))  # both arms 6% up, ratio 0.5
    judgement = _gate(tmp_path).judge(warm, LIMITS)
    assert judgement.verdict == "passed" and not judgement.fail


def test_an_unchanged_case_passes(tmp_path):
    _store(tmp_path, [1.0, 1.01, 0.99])
    judgement = _gate(tmp_path).judge(_rec(record([1.0, 1.01, 0.99])), LIMITS)
    assert judgement.verdict == "passed" and not judgement.fail


def test_an_inconclusive_case_asks_for_repeats_until_the_cap(tmp_path):
    _store(tmp_path, [1.0, 1.03, 0.97], [2.0] * 3)
    gate = _gate(tmp_path, policies=GatePolicies(inconclusive="fail"))
    assert gate.plan.looks == (3, 5, 7, 9)
    cur = [1.07, 1.04, 1.10]
    for have, more in ((3, 2), (5, 2), (7, 2)):
        noisy = _rec(ratio_record([c / 2 for c in (cur * 3)[:have]], [2.0] * have))
        assert gate.judge(noisy, LIMITS) == NeedsRepeats(more)
    at_cap = _rec(ratio_record([c / 2 for c in (cur * 3)], [2.0] * 9))
    judgement = gate.judge(at_cap, LIMITS)
    assert isinstance(judgement, Judgement) and judgement.verdict == "inconclusive"
    # The policy is applied at the cap, never before.
    assert "inconclusive at the repeat cap; policy: fail" in judgement.fail[0]
    warn = _gate(tmp_path).judge(at_cap, LIMITS)
    assert warn.warn and not warn.fail


def test_in_job_a_b_needs_no_stored_baseline(tmp_path):
    gate = Gatekeeper(runs=RunStore(tmp_path), repeats=3, max_repeats=9)  # no --specenergy-compare
    worse = _rec(ab_record([0.60, 0.606, 0.594], [0.50, 0.505, 0.495], [2.0] * 3))
    judgement = gate.judge(worse, LIMITS)
    assert judgement.verdict == "regressed" and "in-job A/B" in judgement.fail[0]
    same = _rec(ab_record([0.5, 0.505, 0.495], [0.5, 0.505, 0.495], [2.0] * 3))
    assert gate.judge(same, LIMITS).verdict == "passed"
    close = _rec(ab_record([0.535, 0.52, 0.55], [0.50, 0.51, 0.49], [2.0] * 3))
    assert gate.judge(close, LIMITS) == NeedsRepeats(2)


def test_a_missing_baseline_follows_its_policy(tmp_path):
    rec = _rec(record([1.0, 1.0, 1.0]))
    # By default a missing baseline fails: a CI step that failed to fetch it must not go green.
    fail = _gate(tmp_path).judge(rec, LIMITS)
    assert fail.fail and "no baseline" in fail.fail[0] and "no saved runs" in fail.fail[0]
    warn = _gate(tmp_path, policies=GatePolicies(missing_baseline="warn")).judge(rec, LIMITS)
    assert warn.warn and not warn.fail and "no baseline" in warn.warn[0]


def test_a_baseline_whose_figures_are_all_null_fails_by_default(tmp_path):
    empty = record([1.0, 1.0, 1.0])
    for sample in empty["speculative"]["samples"] + empty["baseline"]["samples"]:
        sample["decode_joules"] = 0.0  # no energy: J/token is null in every repeat
    _store_record(tmp_path, empty)
    judgement = _gate(tmp_path).judge(_rec(record([1.0, 1.0, 1.0])), LIMITS)
    assert judgement.verdict == "incomparable" and judgement.fail
    assert "no energy_ratio values" in judgement.fail[0]


CAPPED = {"name": "concurrency-below-batch", "severity": "fail", "message": "2.0 of 4 rows"}


def test_a_stored_case_whose_checks_failed_is_refused_as_a_baseline_by_name(tmp_path):
    # Audit 3, T32: a nightly whose window ran 2 of 4 rows was saved as main; a PR costing +23%
    # energy against it read "IMPROVED -35%". Its figures describe a broken measurement.
    broken = {**record([1.3, 1.31, 1.29]), "checks": [CAPPED]}
    path = _store_record(tmp_path, broken)
    better = _rec(record([1.0, 1.01, 0.99]))  # reads as a big improvement against it
    for policies in (GatePolicies(), GatePolicies(incomparable="warn", missing_baseline="warn")):
        judgement = _gate(tmp_path, policies=policies).judge(better, LIMITS)
        assert judgement.verdict == "incomparable" and judgement.fail, judgement
        assert "concurrency-below-batch" in judgement.fail[0] and str(path) in judgement.fail[0]
        assert NODE in judgement.fail[0] and "never serves as a baseline" in judgement.fail[0]
    # A warn-severity check (an engine restarted, warmed up again) leaves the baseline usable.
    warned = {**record([1.0, 1.01, 0.99]), "checks": [{**CAPPED, "severity": "warn"}]}
    _store_record(tmp_path, warned)
    assert _gate(tmp_path).judge(better, LIMITS).verdict == "passed"


def test_a_golden_whose_checks_failed_judges_nothing_and_none_is_written_from_one(tmp_path):
    from pytest_specenergy.gate.storage import GoldenStore

    goldens = GoldenStore(tmp_path / "golden")
    gate = Gatekeeper(
        runs=RunStore(tmp_path), goldens=goldens, golden="check", repeats=3, max_repeats=9
    )
    broken = _rec({**record([1.3, 1.31, 1.29]), "checks": [CAPPED]})
    made = gate.judge(broken, LIMITS)
    assert made.fail and "no golden baseline written" in made.fail[0]
    assert goldens.flush() == ([], []) and not goldens.path(KEY, NODE).exists()
    # A golden file holding a record whose checks failed (written by an older plugin) is refused.
    goldens.update(KEY, NODE, broken, mode="regen-all", mismatched=False)
    assert goldens.flush()[0] == [goldens.path(KEY, NODE)]
    refused = gate.judge(_rec(record([1.0, 1.01, 0.99])), LIMITS)
    assert refused.verdict == "incomparable" and "concurrency-below-batch" in refused.fail[0]
