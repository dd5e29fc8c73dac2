"""Every command of the README's tutorial runs as written (issue 43 item 3).

The README marks the tutorial's code blocks with an HTML comment before each:
``<!-- tutorial: file NAME -->`` (the block is that file's text), ``<!-- tutorial: edit NAME -->``
(a diff: its ``-`` lines are replaced by its ``+`` lines), ``<!-- tutorial -->`` (shell commands
that exit 0) and ``<!-- tutorial: exit N -->`` (commands that exit N). The test applies them in
order in an empty project folder, with ``pytest`` and ``specenergy`` on the PATH meaning this
interpreter's, and checks what the prose around them promises: a run saved as ``main``, the
changed drafter regressed, the report written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"<!-- tutorial(?:: (file|edit|exit) (\S+))? -->\n```\w*\n(.*?)```", re.S)


def tutorial_steps(text: str) -> list[tuple[str, str, str]]:
    """``(kind, argument, body)`` of each marked block, in order: kind ``file``, ``edit``,
    ``exit`` (argument: the expected status) or ``run``."""
    return [(kind or "run", arg or "0", body) for kind, arg, body in BLOCK.findall(text)]


def apply_edit(path: Path, diff: str) -> None:
    lines = diff.splitlines()
    old = "\n".join(line[1:] for line in lines if line.startswith("-"))
    new = "\n".join(line[1:] for line in lines if line.startswith("+"))
    text = path.read_text()
    assert old and text.count(old) == 1, f"the edit's old lines are not once in {path.name}: {old}"
    path.write_text(text.replace(old, new))


def test_the_tutorial_blocks_are_found():
    """The parser finds the tutorial as the README writes it: a file, commands, an edit and a
    command expected to fail."""
    kinds = [kind for kind, _, _ in tutorial_steps(README.read_text())]
    assert kinds[0] == "file" and "edit" in kinds and "exit" in kinds, kinds
    assert kinds.count("run") >= 2, kinds


def test_apply_edit_refuses_a_diff_that_does_not_match(tmp_path: Path):
    target = tmp_path / "f.py"
    target.write_text("a = 1\nb = 2\n")
    apply_edit(target, "-b = 2\n+b = 3\n")
    assert target.read_text() == "a = 1\nb = 3\n"
    with pytest.raises(AssertionError, match="not once"):
        apply_edit(target, "-b = 2\n+b = 4\n")


def test_every_tutorial_command_runs(tmp_path: Path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    project = tmp_path / "project"
    project.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, module in (("pytest", "pytest"), ("specenergy", "pytest_specenergy.cli.main")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    for kind, arg, body in tutorial_steps(README.read_text()):
        if kind == "file":
            (project / arg).write_text(body)
        elif kind == "edit":
            apply_edit(project / arg, body)
        else:
            done = subprocess.run(
                ["bash", "-c", body], cwd=project, env=env, capture_output=True, text=True
            )
            outputs.append(done.stdout)
            expected = int(arg)
            assert done.returncode == expected, (
                f"{body.strip()}: exit {done.returncode}, the README says {expected}\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
    # What the prose promises: the baseline saved, the changed drafter regressed, the report.
    assert list(project.glob(".specenergy/*/0001_main_*.json")), outputs[0][-2000:]
    assert any("+ regressed" in out and "REGRESSED" in out for out in outputs), outputs
    assert (project / "report.html").stat().st_size > 0
    assert "REGRESSED" in (project / "report.md").read_text()
