"""The README's two commands come first and work on a fresh machine (issue 24 item 6, issue 43).

The tutorial's commands run in ``test_readme_tutorial.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


#: The README's two commands, in this order, each its own ``bash`` block: CI (``.ci/run``) and a
#: person on a fresh machine run exactly these.
COMMANDS = (
    "bash dev/setup.sh && .venv/bin/python -m pytest example_suites/quickstart -p no:cacheprovider",
    "bash dev/test.sh",
)


def test_the_readme_starts_with_its_two_commands_and_stays_short():
    """After the title, the first two code blocks are the quickstart and the test suite; the README
    is a user's page of at most 250 lines (maintainer material lives in CONTRIBUTING.md)."""
    text = README.read_text()
    assert text.startswith("# pytest-specenergy\n")
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    assert [(lang, body.strip()) for lang, body in blocks[:2]] == [("bash", c) for c in COMMANDS]
    assert len(text.splitlines()) <= 250
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash dev/test.sh" in ci


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
