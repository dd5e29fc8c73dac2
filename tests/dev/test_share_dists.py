"""dev/share_dists.py: identical installed distributions are hardlinked, nothing else is."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "dev" / "share_dists.py"


def make_env(root: Path, source: str, *, record: bool = True) -> Path:
    """A virtual environment's layout holding one installed distribution, ``pkg`` 1.0, the way pip
    leaves it: the module, its .pyc, a console script and a RECORD with each file's sha256."""
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    module = site / "pkg" / "__init__.py"
    module.write_text(source)
    py_compile.compile(str(module), doraise=True)
    (root / "bin").mkdir()
    (root / "bin" / "pkg-cli").write_text(f"#!{root}/bin/python\n")
    info = site / "pkg-1.0.dist-info"
    info.mkdir()
    rows = []
    for path in (module, root / "bin" / "pkg-cli"):
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=")
        rows.append(f"{os.path.relpath(path, site)},sha256={digest.decode()},{path.stat().st_size}")
    rows.append("pkg/__pycache__/__init__.cpython-311.pyc,,")
    if record:
        (info / "RECORD").write_text("\n".join(rows) + "\n")
    return root


def share(target: Path, *sources: Path) -> str:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(target), *map(str, sources)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def files(env: Path) -> dict[str, Path]:
    site = env / "lib" / "python3.11" / "site-packages"
    return {
        "module": site / "pkg" / "__init__.py",
        "cli": env / "bin" / "pkg-cli",
        "pyc": site / "pkg" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc",
    }


def test_an_identical_distribution_is_linked_with_its_bytecode(tmp_path):
    source = make_env(tmp_path / "a", "VALUE = 1\n")
    time.sleep(0.01)  # the target's copy is younger: its .pyc names another mtime
    target = make_env(tmp_path / "b", "VALUE = 1\n")
    out = share(target, source)
    linked, original = files(target), files(source)
    assert os.path.samefile(linked["module"], original["module"])
    assert os.path.samefile(linked["pyc"], original["pyc"]), "the .pyc must follow its .py"
    # The console script names its own interpreter: it stays the target's.
    assert not os.path.samefile(linked["cli"], original["cli"])
    # The linked .pyc is valid for the linked .py: Python would not recompile it.
    loader = importlib.util.spec_from_file_location("pkg", linked["module"]).loader
    stats = loader.path_stats(str(linked["module"]))
    header = linked["pyc"].read_bytes()[8:12]
    assert int.from_bytes(header, "little") == int(stats["mtime"]) & 0xFFFFFFFF
    assert "pkg 1.0" in out and "freed" in out
    assert share(target, source).strip().endswith("0 MB freed"), "a second run links nothing"


@pytest.mark.parametrize("case", ["other content", "source install under way"])
def test_a_distribution_that_differs_or_is_incomplete_is_left_alone(tmp_path, case):
    source = make_env(
        tmp_path / "a",
        "VALUE = 2\n" if case == "other content" else "VALUE = 1\n",
        record=case != "source install under way",
    )
    target = make_env(tmp_path / "b", "VALUE = 1\n")
    share(target, source)
    assert not os.path.samefile(files(target)["module"], files(source)["module"])
    assert files(target)["module"].read_text() == "VALUE = 1\n"


def test_a_folder_that_is_no_environment_is_refused(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode != 0 and "is not a virtual environment" in result.stderr
