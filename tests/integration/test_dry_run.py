"""``--specenergy-dry-run`` prints both commands of each pair and starts nothing."""

from __future__ import annotations

import pytest

SUITE = """
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram", Drafter("draft_model", draft_model="tiny:dense-draft", id="draft"))
@pytest.mark.batch(1, 4)
def test_reference(spec_pair):
    raise AssertionError("a dry run must not run tests")

@pytest.mark.model("Qwen/Qwen3-8B", engine="sglang", attention_backend="fa3", sglang_version="0.5.23")
@pytest.mark.corpus("code")
@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=8))
@pytest.mark.batch(16)
def test_sglang(spec_pair):
    raise AssertionError("a dry run must not run tests")
"""


def test_dry_run_prints_pairs_and_differences(pytester: pytest.Pytester):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--specenergy-dry-run", "-p", "no:cacheprovider")
    assert result.ret == 0
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*specenergy dry run*",
            "cases: code-ngram-b1, code-ngram-b4",
            "speculative: *-m pytest_specenergy.refserver --model tiny:dense * --drafter ngram "
            "--num-draft-tokens 8*",
            "baseline: *-m pytest_specenergy.refserver --model tiny:dense * --drafter none",
            "# differs: speculative: --drafter ngram (speculative) vs none (baseline)",
            "cases: code-draft-b1, code-draft-b4",
            "cases: code-ngram-b16",
            "speculative: *sglang.launch_server*--speculative-algorithm NGRAM*",
            "3 speculative engines, 2 baseline twins; nothing was started",
        ]
    )
    assert "MISMATCH" not in out
    assert "a dry run must not run tests" not in out
    assert not (pytester.path / ".specenergy" / "logs").exists()


def test_dry_run_can_assume_an_sglang_version(pytester: pytest.Pytester):
    pytester.makepyfile(SUITE.replace(', sglang_version="0.5.23"', ""))
    without = pytester.runpytest("--specenergy-dry-run", "-p", "no:cacheprovider")
    without.stdout.fnmatch_lines(["*SGLang is not installed in this Python*"])
    # A command that cannot be built fails the dry run (a CI step checking commands must not
    # go green); the printed blocks say which.
    assert without.ret == pytest.ExitCode.USAGE_ERROR
    without.stderr.fnmatch_lines(
        ["*specenergy dry run: 3 engine command(s) refused or not buildable*"]
    )
    with_version = pytester.runpytest(
        "--specenergy-dry-run", "--specenergy-sglang-version=0.5.13", "-p", "no:cacheprovider"
    )
    with_version.stdout.fnmatch_lines(
        ["speculative: *--cuda-graph-max-bs 48*--speculative-algorithm NGRAM*"]
    )


def test_a_refused_engine_option_fails_the_dry_run(pytester: pytest.Pytester):
    # Fault-matrix probe N39: an SGLang rendezvous address off loopback was printed as
    # "cannot build the command" and the dry run exited 0.
    pytester.makepyfile(
        SUITE.replace(
            'sglang_version="0.5.23"', 'sglang_version="0.5.23", dist_init_addr="0.0.0.0:5000"'
        )
    )
    result = pytester.runpytest("--specenergy-dry-run", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["speculative: cannot build the command: *not a loopback address*"])
    result.stderr.fnmatch_lines(
        ["*specenergy dry run: 3 engine command(s) refused or not buildable*"]
    )
