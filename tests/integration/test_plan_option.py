"""``--specenergy-plan``, ``specenergy plan`` and ``--specenergy-budget`` on a collected SGLang
suite (SGLang command lines built for 0.5.23; nothing starts)."""

from __future__ import annotations

import subprocess
import sys

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [
    pytest.mark.model("Qwen/Qwen3-8B", engine="sglang", max_running_requests=64,
                      max_total_tokens=131072),
    pytest.mark.corpus("code"),
    pytest.mark.generation(max_new_tokens=512, prompts=192),
]

@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=8))
@pytest.mark.batch(1, 64)
def test_gate(spec_pair):
    raise AssertionError("a plan runs nothing")
"""
OPTIONS = ("-p", "no:cacheprovider", "--specenergy-sglang-version=0.5.23")


def test_the_plan_prints_every_case_and_the_total_and_runs_nothing(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(*OPTIONS, "--specenergy-plan")
    assert result.ret == 0 and "no tests ran" in result.stdout.str()  # nothing ran
    result.stdout.fnmatch_lines(
        [
            "specenergy plan: modeled GPU minutes on h200 *",
            "test_gate[[]code-ngram-b1[]] *",
            "test_gate[[]code-ngram-b64[]] *",
            "total: * GPU minutes at the first look, * (2 cases)",
        ]
    )


def test_the_save_repeats_and_the_gpu_change_the_plan(pytester):
    pytester.makepyfile(test_suite=SUITE)
    totals = {}
    for name, extra in (
        ("pr", ["--specenergy-compare=main"]),
        ("nightly", ["--specenergy-save=main"]),
        ("h100", ["--specenergy-plan-gpu=h100"]),
    ):
        out = pytester.runpytest_subprocess(*OPTIONS, "--specenergy-plan", *extra).stdout.str()
        totals[name] = [line for line in out.splitlines() if line.startswith("total: ")][0]
    assert totals["nightly"] != totals["pr"] != totals["h100"]


def test_a_suite_over_budget_is_refused_at_collection_naming_the_costliest(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(*OPTIONS, "--specenergy-budget=0.5")
    assert result.ret == 4
    result.stderr.fnmatch_lines(
        [
            "*specenergy: the suite's modeled GPU time is * over --specenergy-budget=0.5; the costliest"
            " cases: *test_gate[[]code-ngram-b*"
        ]
    )
    assert "AssertionError" not in result.stdout.str()
    fits = pytester.runpytest_subprocess(*OPTIONS, "--specenergy-budget=600", "--collect-only")
    assert fits.ret == 0 and "total: " in fits.stdout.str()


def test_the_specenergy_plan_command(pytester):
    pytester.makepyfile(test_suite=SUITE)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pytest_specenergy.cli.main import main; sys.exit(main())",
            "plan",
            *OPTIONS,
        ],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "total: " in done.stdout and "code-ngram-b64" in done.stdout
