"""The gate closed (issue 42 items 1, 2, 5; issue 40 item 4): a stored case whose own checks failed
judges nothing, baseline cases a run did not measure are part of the verdict, and a session that
cannot compare or measure says so once, at its start, before anything is measured."""

from __future__ import annotations

import json

import pytest

SUITE = """
import pytest

pytestmark = [
    pytest.mark.model("tiny:dense"),
    pytest.mark.corpus("code"),
    pytest.mark.drafter("ngram"),
    pytest.mark.batch(1),
    pytest.mark.generation(max_new_tokens=16, prompts=2),
]


def test_a(spec_pair):
    spec_pair.measure()


def test_b(spec_pair):  # the same case as test_a: measured once, two records
    spec_pair.measure()


def test_plain():
    pass
"""

# One repeat a side is too few to judge energy: the comparison is incomparable, which these
# sessions accept, so that what decides their outcome is what each test is about.
LENIENT = "--specenergy-incomparable=warn"


def _stored(pytester: pytest.Pytester):
    return next((pytester.path / ".specenergy").rglob("0001_main_*.json"))


def test_baseline_cases_a_run_did_not_measure_are_listed_and_fail_under_ci(
    pytester: pytest.Pytester, run_suite, monkeypatch
):
    pytester.makepyfile(test_suite=SUITE)
    assert run_suite("--specenergy-save=main").ret == 0
    # T31: "-k" in a CI command used to shrink the gate silently (1 passed, rc 0).
    monkeypatch.setenv("CI", "true")
    result = run_suite("--specenergy-compare=main", LENIENT, "-k", "test_a")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*specenergy coverage*",
            "1 of 2 baseline case(s) in *0001_main_*.json were not measured by this run*",
            "  - test_suite.py::test_b[[]code-ngram-b1[]]",
            "exit status 1 (--specenergy-unmeasured=fail)*--specenergy-unmeasured-ok=GLOB",
        ]
    )
    assert "test_a" in result.stdout.str() and "1 passed" in result.stdout.str()
    declared = run_suite(
        "--specenergy-compare=main", LENIENT, "-k", "test_a", "--specenergy-unmeasured-ok=*test_b*"
    )
    assert declared.ret == 0
    declared.stdout.fnmatch_lines(["1 baseline case(s) not measured, declared by*test_b*"])
    # A -k that selects no gated case covers nothing of the baseline: both listed, no engine.
    nothing = run_suite("--specenergy-compare=main", "-k", "test_plain")
    assert nothing.ret == pytest.ExitCode.TESTS_FAILED
    nothing.stdout.fnmatch_lines(["2 of 2 baseline case(s) in *", "*test_a*", "*test_b*"])
    # Outside CI the same run lists them and passes.
    monkeypatch.delenv("CI")
    local = run_suite("--specenergy-compare=main", "-k", "test_plain")
    assert local.ret == 0
    local.stdout.fnmatch_lines(["2 of 2 baseline case(s) in *", "not failing*"])


def test_a_stored_case_whose_checks_failed_is_refused_as_a_baseline(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(test_suite=SUITE)
    assert run_suite("--specenergy-save=main", "-k", "test_a").ret == 0
    # T32: a nightly whose window failed concurrency-below-batch judged a PR "IMPROVED -35%".
    stored = _stored(pytester)
    data = json.loads(stored.read_text())
    data["results"][0]["checks"] = [
        {"name": "concurrency-below-batch", "severity": "fail", "message": "2.0 of 4 rows"}
    ]
    stored.write_text(json.dumps(data))
    result = run_suite(
        "--specenergy-compare=main", LENIENT, "--specenergy-missing-baseline=warn", "-k", "test_a"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*the baseline of test_suite.py::test_a[[]code-ngram-b1[]] in *0001_main_*.json is "
            "refused: the baseline record's own fail-closed checks failed when it was measured "
            "(concurrency-below-batch)*"
        ]
    )


def test_a_missing_baseline_stops_the_session_before_anything_is_measured(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(test_suite=SUITE)
    for ref, why in (
        ("main", "no saved runs in *.specenergy*"),
        ("base.json", "no such file*"),
    ):
        result = run_suite(f"--specenergy-compare={ref}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*specenergy: --specenergy-compare={ref}: {why}"])
        assert "test session starts" not in result.stdout.str()
    assert not (pytester.path / ".specenergy" / "logs").exists()  # no engine started
    # The opt-outs keep their meaning: a missing run warns per case.
    assert run_suite("--specenergy-compare=main", "--specenergy-missing-baseline=warn").ret == 0


def test_an_engine_whose_extra_is_missing_is_one_usage_error_at_start(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE)
    # None in sys.modules is how Python spells "not installed" for an import (find_spec too).
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--specenergy-repeats=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if "specenergy:" in line]
    assert len(errors) == 1, result.stderr.str()
    assert "the reference engine (case code-ngram-b1, and any other on it) needs torch" in errors[0]
    assert "pip install 'pytest-specenergy[reference]'" in errors[0]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert not (pytester.path / ".specenergy" / "logs").exists()
    # Under xdist a worker's usage error is a bare INTERNALERROR: each case fails with the message.
    workers = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    workers.assert_outcomes(failed=2, passed=1)
    assert "INTERNALERROR" not in workers.stdout.str()
    workers.stdout.fnmatch_lines(["*needs torch*pip install 'pytest-specenergy[[]reference[]]'*"])
    assert not (pytester.path / ".specenergy" / "logs").exists()


def test_an_unwritable_log_folder_is_found_at_start(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "a-file").write_text("")
    result = run_suite(f"--specenergy-log-dir={pytester.path / 'a-file' / 'logs'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--specenergy-log-dir *a-file/logs: *a-file is not a folder*"])
    assert "PASSED" not in result.stdout.str() and "FAILED" not in result.stdout.str()
