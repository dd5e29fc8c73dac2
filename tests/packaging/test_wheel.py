"""The wheel as a user gets it (issue 43 item 5): ``pip wheel .`` builds it, a fresh virtual
environment outside the repository installs it, and a separate project folder uses it (markers, a
CPU case on ``tiny:dense``, ``specenergy report``), importing the plugin from that environment and
never from the checkout.

The fresh environment takes its dependencies (pytest, numpy, torch, transformers, ...) from the
environment running this test, without downloading anything: a folder of links to that
environment's packages, every ``pytest_specenergy`` entry left out (the checkout's editable
install: its ``__editable__`` finder, ``.pth`` and ``dist-info``), is put on the fresh
environment's path by a ``.pth`` line. A path line adds the folder only: ``.pth`` files inside
it are not run, so the editable finder cannot come back.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]

#: The user's project: the markers, one CPU case at a CPU size, and where the plugin came from.
USER_TEST = """
import sys
from pathlib import Path

import pytest
import pytest_specenergy
from pytest_specenergy import Drafter

pytestmark = [
    pytest.mark.model("tiny:dense"),
    pytest.mark.corpus("code"),
    pytest.mark.generation(max_new_tokens=16, prompts=4),
]


def test_the_plugin_is_the_installed_wheel():
    here = Path(pytest_specenergy.__file__).resolve()
    assert here.is_relative_to(Path(sys.prefix).resolve()), here
    print("pytest_specenergy imported from", here)


@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=4))
@pytest.mark.batch(1)
def test_ngram(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent()
"""


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _links_to_dependencies(target: Path) -> Path:
    """A folder linking every package of this interpreter's environment except this project's."""
    target.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if name.startswith(("pytest_specenergy", "__editable__")) or name.endswith(".pth"):
            continue
        (target / entry.name).symlink_to(entry)
    return target


def _user_env() -> dict[str, str]:
    """The environment a user's shell would have: nothing pointing into this checkout or at this
    session's engines."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "PYTEST", "SPECENERGY", "VIRTUAL_ENV"))
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path: Path):
    env = _user_env()
    # 1. The wheel, built from a copy of the checkout's sources without its dependencies.
    wheels = tmp_path / "wheels"
    source = _sources(tmp_path / "source")
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        str(source),
        "--no-deps",
        "-q",
        "-w",
        str(wheels),
    ]
    # The environment's own setuptools where it has one: no build environment to download.
    _run(build + (["--no-build-isolation"] if _has("setuptools") else []), tmp_path, env)
    (wheel,) = wheels.glob("pytest_specenergy-*.whl")
    _check_metadata(wheel)

    # 2. A fresh environment outside the repository, its dependencies linked, the wheel installed.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            tmp_path,
            env,
        ).stdout.strip()
    )
    deps = _links_to_dependencies(tmp_path / "deps")
    (site / "dependencies.pth").write_text(f"{deps}\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], tmp_path, env)

    # 3. A separate project folder: the markers, a CPU case, the report of its JSON.
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_user.py").write_text(USER_TEST)
    ran = _run(
        [str(python), "-m", "pytest", "-s", "-p", "no:cacheprovider", "--specenergy-repeats=1"]
        + ["--specenergy-json=run.json", "test_user.py"],
        project,
        env,
    )
    assert "2 passed" in ran.stdout, ran.stdout[-3000:]
    assert f"pytest_specenergy imported from {site.resolve()}" in ran.stdout, ran.stdout[-3000:]
    assert "energy figures: modeled" in ran.stdout
    report = [str(venv / "bin" / "specenergy"), "report", "run.json", "--markdown", "summary.md"]
    _run(report + ["--html", "report.html", "--no-plots"], project, env)
    assert "code-ngram-k4-b1" in (project / "summary.md").read_text()
    assert (project / "report.html").stat().st_size > 0
    print(ran.stdout[-1500:])


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _sources(folder: Path) -> Path:
    """What a source distribution holds, copied out of the checkout: setuptools builds in the tree
    it is given, and a ``build/`` an earlier build left in the checkout would put a module the
    sources no longer have into the wheel (and the test would write into the checkout)."""
    folder.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, folder / name)
    shutil.copytree(
        ROOT / "pytest_specenergy",
        folder / "pytest_specenergy",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return folder


def _check_metadata(wheel: Path) -> None:
    """The wheel's description is README.md, its extras are named for what a user has, and the
    ``cpu`` extra is the ``reference`` one."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode("utf-8")
        meta = email.message_from_string(text)
        assert any(n.endswith("cases/corpora/data/code.jsonl") for n in zf.namelist())
    assert meta["Description-Content-Type"] == "text/markdown"
    assert text.partition("\n\n")[2].strip() == (ROOT / "README.md").read_text().strip()
    extras = set(meta.get_all("Provides-Extra"))
    assert {"cpu", "reference", "sglang", "nvml", "report"} <= extras, extras
    requires = meta.get_all("Requires-Dist")

    def extra(name: str) -> list[str]:
        return sorted(r.split(";")[0].strip() for r in requires if f'extra == "{name}"' in r)

    assert extra("cpu") and extra("cpu") == extra("reference"), (extra("cpu"), extra("reference"))
