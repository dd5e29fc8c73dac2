"""The stored-run flow of the CI workflow example (example_suites/ci_gate/specenergy-gate.yml: the
nightly saves main; pull requests there are gated in-job, test_ci_workflow_file.py checks the file),
its commands run here on CPU with the reference server across two commits: the nightly saves main, a pull request that
makes the drafter costlier fails the gate and its report shows it, the next nightly saves again
and the history holds both runs, each naming the commit it measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SUITE = """
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=K, id="ngram"))
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=16, prompts=2)
def test_drafter(spec_pair):
    spec_pair.measure()
"""
FAST = ["--specenergy-repeats=2", "--specenergy-warmup=0", "-p", "no:cacheprovider"]
CLI = [
    sys.executable,
    "-c",
    "import sys; from pytest_specenergy.cli.main import main; sys.exit(main())",
]


def _commit(path, message: str) -> str:
    git = ["git", "-C", str(path), "-c", "user.name=ci", "-c", "user.email=ci@example.org"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _specenergy(pytester: pytest.Pytester, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], cwd=pytester.path, capture_output=True, text=True, timeout=120
    )


def test_the_ci_workflow_across_two_commits(pytester: pytest.Pytester):
    subprocess.run(["git", "init", "-q", str(pytester.path)], check=True)
    (pytester.path / ".gitignore").write_text(".specenergy/\n*.json\n*.html\n*.md\n*.xml\n")
    pytester.makepyfile(test_gate=SUITE.replace("K,", "8,"))
    main_sha = _commit(pytester.path, "main")

    # The nightly on main: measure and save the baseline, report with the history so far.
    nightly = pytester.runpytest_subprocess(
        *FAST, "--specenergy-save=main", "--specenergy-json=pr-run.json"
    )
    assert nightly.ret == 0
    assert json.loads((pytester.path / "pr-run.json").read_text())["commit"] == {
        "sha": main_sha,
        "dirty": False,
    }
    report = _specenergy(
        pytester,
        "report",
        "pr-run.json",
        "--html",
        "specenergy.html",
        "--markdown",
        "specenergy.md",
        "--no-plots",
    )
    assert report.returncode == 0, report.stderr
    history = _specenergy(pytester, "history")
    assert history.returncode == 0 and "nothing to compare yet" in history.stdout

    # A pull request that makes the drafter costlier (one drafted token instead of eight).
    pytester.makepyfile(test_gate=SUITE.replace("K,", "1,"))
    pr_sha = _commit(pytester.path, "a costlier drafter")
    gate = pytester.runpytest_subprocess(
        *FAST,
        "--specenergy-compare=main",
        "--specenergy-compare-fail=energy:5%",
        "--specenergy-compare-fail=accept_length:5%",
        "--specenergy-inconclusive=warn",
        "--specenergy-json=pr-run.json",
        "--junitxml=specenergy-junit.xml",
    )
    assert gate.ret == 1
    gate.stdout.fnmatch_lines(
        ["*test_drafter[[]code-ngram-b1[]]*regressed against baseline *0001_main_*.json:"]
    )
    assert json.loads((pytester.path / "pr-run.json").read_text())["commit"]["sha"] == pr_sha
    report = _specenergy(
        pytester,
        "report",
        "pr-run.json",
        "--baseline",
        "main",
        "--html",
        "specenergy.html",
        "--markdown",
        "specenergy.md",
        "--no-plots",
    )
    assert report.returncode == 0, report.stderr
    summary = (pytester.path / "specenergy.md").read_text()
    [row] = [line for line in summary.splitlines() if line.startswith("| **REGRESSED** |")]
    assert "code-ngram-b1" in row and "**1 regressed**" in summary
    assert (
        'name="specenergy.verdict" value="regressed"'
        in (pytester.path / "specenergy-junit.xml").read_text()
    )

    # The next nightly, with the change merged: saved again; the history holds both commits.
    assert (
        pytester.runpytest_subprocess(
            *FAST, "--specenergy-save=main", "--specenergy-json=pr-run.json"
        ).ret
        == 0
    )
    history = _specenergy(pytester, "history")
    assert history.returncode == 0 and "2 runs in" in history.stdout
    runs = sorted((pytester.path / ".specenergy").rglob("*_main_*.json"))
    assert [json.loads(r.read_text())["commit"]["sha"] for r in runs] == [main_sha, pr_sha]
