"""pytest-xdist: per-worker servers merged into one table and file, or no measurement."""

from __future__ import annotations

import json
import re

import pytest

SUITE = """
import pytest

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.drafter("ngram"), pytest.mark.batch(2),
              pytest.mark.generation(max_new_tokens=16, prompts=8)]

@pytest.mark.corpus("code")
def test_code(spec_pair):
    spec_pair.measure().assert_equivalent()

@pytest.mark.corpus("news")
def test_news(spec_pair):
    spec_pair.measure().assert_equivalent()
"""

FAST = ["--specenergy-repeats=1", "--specenergy-warmup=0", "-p", "no:cacheprovider"]


def test_per_gpu_mode_merges_worker_results(pytester: pytest.Pytester):
    pytester.makepyfile(SUITE)
    out = pytester.path / "run.json"
    # per-gpu is the default: a CI job that adds -n for speed still measures and gates.
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "load", f"--specenergy-json={out}", *FAST
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*= specenergy =*",
            "energy figures: modeled (h200, priced as *)*",
            "*test_code[[]code-ngram-b2[]]*",
        ]
    )
    result.stdout.fnmatch_lines(["*test_news[[]news-ngram-b2[]]*"])
    # Workers never write to the terminal: the controller prints their engine starts, whole lines.
    starts = [line for line in result.stdout.lines if "specenergy: engine " in line]
    assert starts and all(
        re.fullmatch(
            r"\[gw[01]\] specenergy: engine reference:tiny:dense\[\w+\] started in "
            r"\d+\.\d s",
            line,
        )
        for line in starts
    ), starts
    data = json.loads(out.read_text())
    assert sorted(r["case_id"] for r in data["results"]) == ["code-ngram-b2", "news-ngram-b2"]


def test_with_per_gpu_mode_off_the_tests_fail_unmeasured_and_it_is_said_once(
    pytester: pytest.Pytester,
):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest_subprocess("-n", "2", "--specenergy-xdist=off", *FAST)
    result.assert_outcomes(errors=2)  # the spec_pair fixture fails: an error, never a skip
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*specenergy xdist*",
            "2 spec_pair tests failed unmeasured: energy is not measured under pytest-xdist*",
        ]
    )
    assert result.stdout.str().count("failed unmeasured: energy is not measured") == 1


CRASH = """
import os
import signal


def test_zz_crash():
    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies after test_code passed on it
"""


def test_a_killed_worker_keeps_the_results_it_sent_and_the_run_is_marked_interrupted(
    pytester: pytest.Pytester,
):
    pytester.makepyfile(
        test_suite=SUITE.split('@pytest.mark.corpus("news")')[0], test_suite_zz=CRASH
    )
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "-n",
        "1",
        "--max-worker-restart=0",
        f"--specenergy-json={out}",
        "--specenergy-save=main",
        *FAST,
    )
    assert result.ret != 0
    data = json.loads(out.read_text())
    assert [r["case_id"] for r in data["results"]] == ["code-ngram-b2"] and data[
        "interrupted"
    ] is True
    [saved] = (pytester.path / ".specenergy").rglob("*_main_*.json")
    assert json.loads(saved.read_text())["interrupted"] is True


TERM_CONTROLLER = """
import os
import signal
import time


def test_zz_term():
    time.sleep(3)  # the controller has taken in test_code's report
    os.kill(os.getppid(), signal.SIGTERM)  # SIGTERM to the xdist controller, after test_code passed
"""


def test_sigterm_to_the_controller_still_writes_what_the_workers_reported(
    pytester: pytest.Pytester,
):
    pytester.makepyfile(
        test_suite=SUITE.split('@pytest.mark.corpus("news")')[0], test_suite_zz=TERM_CONTROLLER
    )
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "-n", "1", f"--specenergy-json={out}", "--specenergy-save=main", *FAST
    )
    assert result.ret != 0
    data = json.loads(out.read_text())
    assert [r["case_id"] for r in data["results"]] == ["code-ngram-b2"] and data[
        "interrupted"
    ] is True
    [saved] = (pytester.path / ".specenergy").rglob("*_main_*.json")
    assert json.loads(saved.read_text())["interrupted"] is True
