"""Fail closed (issue: a gate never passes when it could not measure, compare or trust)."""

from __future__ import annotations

import json

import pytest

SUITE = """
import pytest

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=16, prompts=2)
def test_saves(spec_pair):
    spec_pair.measure().assert_saves_energy(at_least=-100.0)
"""

# A meter whose every window fails as a board counter does after a reset.
RESETTING_METER = """
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.meters.modeled import ModeledMeter


class ResettingMeter(ModeledMeter):
    def stop(self, token):
        raise MeterError("energy counter went backwards (counter reset) during the window")


def pytest_specenergy_make_meter(kind, engine):
    return ResettingMeter("h200")
"""


@pytest.mark.parametrize(
    "option, expected",
    [
        ("--specenergy-alpha=2", "significance level between 0 and 1"),
        ("--specenergy-startup-timeout=-5", "seconds > 0"),
        ("--specenergy-request-timeout=0", "seconds > 0"),
        ("--specenergy-fault=no-such-fault", "unknown fault no-such-fault"),
        ("--specenergy-save=last", "reserved"),
        ("--specenergy-save=a/b", "contains"),
    ],
)
def test_bad_option_values_are_usage_errors_at_start(pytester: pytest.Pytester, option, expected):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(option, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option.split('=')[0]}*{expected}*"])


def test_an_unmeasurable_window_fails_the_case_never_skips(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(RESETTING_METER)
    result = run_suite()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*could not be measured, twice*counter reset*"])


def test_a_corrupt_baseline_fails_even_when_missing_baselines_only_warn(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(test_suite=SUITE)
    assert run_suite("--specenergy-save=main").ret == 0
    stored = next((pytester.path / ".specenergy").rglob("0001_main_*.json"))
    stored.write_text('{"schema_version": 1, "kind": "specenergy-run", "results": [')
    result = run_suite("--specenergy-compare=main", "--specenergy-missing-baseline=warn")
    # Found at start, before anything is measured (issue 40 item 4), whatever the policy says.
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*baseline run cannot be read*{stored.name}*"])


def test_an_interrupted_session_is_never_a_reference(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(test_suite=SUITE, test_zz_fails="def test_boom():\n    assert False\n")
    # complete: 0001
    assert run_suite("--specenergy-save=main", "test_suite.py", repeats=2).ret == 0
    # -x stops the session at the failure: the run is saved, marked interrupted.
    run_suite("--specenergy-save=main", "-x", "test_suite.py", "test_zz_fails.py", repeats=2)
    files = sorted((pytester.path / ".specenergy").rglob("*_main_*.json"))
    assert [json.loads(f.read_text()).get("interrupted", False) for f in files] == [False, True]
    out = pytester.path / "run.json"
    # Two repeats a side: the energy limit needs them (a 1-repeat baseline is incomparable, which
    # fails).
    result = run_suite(
        "--specenergy-compare=last", f"--specenergy-json={out}", "test_suite.py", repeats=2
    )
    result.assert_outcomes(passed=1)
    assert json.loads(out.read_text())["results"][0]["baseline_file"] == str(files[0])


def test_an_output_that_cannot_be_written_stops_the_session_before_anything_runs(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(SUITE)
    (pytester.path / "a-file").write_text("")
    result = run_suite(
        "--specenergy-save=main", f"--specenergy-storage={pytester.path / 'a-file' / 'history'}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*specenergy: --specenergy-storage *a-file/history: *a-file is not a folder*"]
    )
    assert "test session starts" not in result.stdout.str()


# On the second pair, SIGTERM twice in a row from outside, as coreutils timeout delivers it.
DOUBLE_SIGTERM = """
import os
import subprocess

pairs = []


def pytest_specenergy_pair_measured(pair):
    pairs.append(pair)
    if len(pairs) == 2:
        pid = os.getpid()
        subprocess.Popen(["sh", "-c", f"kill -TERM {pid}; kill -TERM {pid}"]).wait()
"""


def test_a_double_sigterm_still_writes_what_was_measured(pytester: pytest.Pytester):
    pytester.makepyfile(
        test_suite=SUITE.replace("@pytest.mark.batch(1)", "@pytest.mark.batch(1, 2)")
    )
    pytester.makeconftest(DOUBLE_SIGTERM)
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--specenergy-repeats=1",
        "--specenergy-warmup=0",
        "-p",
        "no:cacheprovider",
        f"--specenergy-json={out}",
        "--specenergy-save=main",
    )
    assert result.ret != 0
    document = json.loads(out.read_text())
    assert document["interrupted"] is True and [r["case_id"] for r in document["results"]] == [
        "code-ngram-b1"
    ]
    [saved] = (pytester.path / ".specenergy").rglob("*_main_*.json")
    assert json.loads(saved.read_text())["interrupted"] is True
    result.stdout.fnmatch_lines(["*= specenergy =*"])


def test_a_storage_url_is_a_usage_error_naming_it(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(SUITE)
    result = run_suite("--specenergy-storage=http://x", "--specenergy-save=main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--specenergy-storage: storage 'http://x': only local directories*"]
    )
    assert not (pytester.path / "http:").exists()
