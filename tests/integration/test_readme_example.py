"""The README's headline example runs as written on CPU (issue 24 item 6).

The first ``python`` block of README.md is copied verbatim into a pytester suite; its first
case (n-gram at batch 1) runs with the README's own markers and the plugin's defaults, save one
repeat, so the test stays short. A README edit that breaks the example fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def headline_example() -> str:
    """The first fenced ``python`` block of README.md."""
    match = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_the_readme_headline_example_runs_as_written(pytester: pytest.Pytester):
    pytester.makepyfile(test_readme=headline_example())
    collected = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    # Two drafters x two batches, with the ids the README names.
    collected.stdout.fnmatch_lines(
        [
            "*test_drafter_pays_for_itself?code-ngram-b1?*",
            "*test_drafter_pays_for_itself?code-draft-b4?*",
            "4 tests collected*",
        ]
    )
    result = pytester.runpytest(
        "-k", "code-ngram-b1", "--specenergy-repeats=1", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.fnmatch_lines(["*energy figures: modeled*"])


def test_the_quickstart_command_needs_no_test_tools():
    """The quickstart's .venv (``dev/setup.sh`` without ``--test``) has no pytest-xdist: the
    project's pytest settings must not name its options (``--dist`` in ``addopts`` made the
    README's first command a usage error on a fresh machine). Run here with xdist blocked."""
    import subprocess
    import sys

    root = README.parent
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "example_suites/quickstart",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "7 tests collected" in done.stdout, done.stdout[-2000:]
