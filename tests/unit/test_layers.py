"""The package's import contract: data flows one way and the reference server stands alone.

Every ``import`` statement in the package (module level or inside a function) is read with
``ast``; a rule names which top-level parts of ``pytest_specenergy`` a part may import. The
rules are those of the layout note: lower layers never import upward, and the reference
server imports nothing of the plugin.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_specenergy"

#: part -> the parts it may import (besides itself). A part is a subpackage or a root module;
#: every one is listed, the root wiring included (the package's ``__init__`` only re-exports).
ALLOWED: dict[str, set[str]] = {
    "refserver": set(),
    "document": {"measure"},
    "atomic": set(),
    "hookspec": set(),
    "engines": {"refserver"},
    "meters": {"engines"},
    "cases": {"engines"},
    "measure": {"cases", "document", "engines", "meters"},
    "gate": {"atomic", "document", "engines", "measure"},
    "report": {"gate", "document", "measure"},
    "cli": {"atomic", "document", "engines", "gate", "meters", "options", "report"},
    # The wiring: options know the validators of the layers they configure.
    "options": {"cases", "engines", "gate", "measure", "meters", "refserver"},
    "xdist": {"document", "meters"},
    "outcome": {"document", "gate", "measure"},
    "outputs": {"atomic", "document", "gate", "options"},
    "fixtures": {"cases", "measure", "meters", "session", "xdist"},
    "session": {
        "cases",
        "document",
        "engines",
        "gate",
        "measure",
        "options",
        "outcome",
        "outputs",
        "report",
        "xdist",
    },
    "progress": {"xdist"},
    "plugin": {
        "cases",
        "fixtures",
        "hookspec",
        "options",
        "outputs",
        "progress",
        "session",
        "xdist",
    },
}
#: What the plugin may read of the reference server: its torch-free name lists.
#: ``catalog`` names the built-in real checkpoints and where they are cached (stdlib only).
REFSERVER_NAMES = {
    "pytest_specenergy.refserver.names",
    "pytest_specenergy.refserver.faults",
    "pytest_specenergy.refserver.catalog",
}
#: The fork server hosts reference servers: it imports their modules (and builds their tiny models)
#: in its own process, inside the functions only that process runs, never in the plugin's.
REFSERVER_HOST = Path("engines/zygote.py")
#: The only modules of ``measure`` that the document, ``gate`` and ``report`` may import.
MEASURE_FOR_DOCUMENT = MEASURE_FOR_GATE = {"pytest_specenergy.measure.metrics"}
MEASURE_FOR_REPORT = {"pytest_specenergy.measure.metrics", "pytest_specenergy.measure.checks"}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path) -> list[str]:
    module = "pytest_specenergy." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    module = module.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = (
                    module.split(".")[: -node.level]
                    if not path.name == "__init__.py"
                    else module.split(".")[: len(module.split(".")) - node.level + 1]
                )
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found += [target] if node.module or node.level else []
            if target == "pytest_specenergy":
                found += [f"pytest_specenergy.{a.name}" for a in node.names]
    return [f for f in found if f == "pytest_specenergy" or f.startswith("pytest_specenergy.")]


def _violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        part = rel.parts[0].removesuffix(".py") if len(rel.parts) == 1 else rel.parts[0]
        if part == "__init__":
            continue  # the package root's lazy re-exports
        if part not in ALLOWED:
            bad.append(f"{rel}: a part the contract does not know; add it to ALLOWED")
            continue
        for target in _imports(path):
            other = _part(target)
            if other in ("", part):
                if other == "" and target == "pytest_specenergy" and part == "refserver":
                    bad.append(f"{rel}: imports the package root")
                continue
            if other not in ALLOWED[part]:
                bad.append(f"{rel}: {part} imports {target} ({other} is not below {part})")
            elif other == "refserver" and target not in REFSERVER_NAMES and rel != REFSERVER_HOST:
                bad.append(
                    f"{rel}: {part} imports {target}; of the reference server only its name lists "
                    f"({', '.join(sorted(REFSERVER_NAMES))}) may be read"
                )
            elif part == "document" and other == "measure" and target not in MEASURE_FOR_DOCUMENT:
                bad.append(f"{rel}: the document imports {target}; only measure.metrics is allowed")
            elif part == "gate" and other == "measure" and target not in MEASURE_FOR_GATE:
                bad.append(f"{rel}: gate imports {target}; only measure.metrics is allowed")
            elif part == "report" and other == "measure" and target not in MEASURE_FOR_REPORT:
                bad.append(
                    f"{rel}: report imports {target}; only measure.metrics/checks are allowed"
                )
    return bad


def test_no_layer_imports_upward():
    assert _violations() == []


def test_the_contract_catches_an_upward_import(tmp_path, monkeypatch):
    """A gate module that imports the session is reported (the rule can fail)."""
    fake = tmp_path / "pytest_specenergy"
    (fake / "gate").mkdir(parents=True)
    (fake / "gate" / "bad.py").write_text("from pytest_specenergy.session import SESSION_KEY\n")
    (fake / "refserver").mkdir()
    (fake / "refserver" / "bad.py").write_text("import pytest_specenergy.measure.results\n")
    # Root modules are held to the contract too: the options reaching into the report, the
    # document into the gate, and a root module nobody declared.
    (fake / "options.py").write_text("from pytest_specenergy.report.terminal import render_table\n")
    (fake / "document.py").write_text("from pytest_specenergy.gate import compare\n")
    (fake / "helpers.py").write_text("import os\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    found = _violations()
    assert any("gate/bad.py" in v and "session" in v for v in found)
    assert any("refserver/bad.py" in v for v in found)
    assert any(v.startswith("options.py: options imports pytest_specenergy.report") for v in found)
    assert any(v.startswith("document.py: document imports pytest_specenergy.gate") for v in found)
    assert any(v.startswith("helpers.py: a part the contract does not know") for v in found)


@pytest.mark.parametrize(
    "entry",
    [
        "pytest_specenergy.refserver",
        "pytest_specenergy.refserver.records",
        "pytest_specenergy.refserver.faults",
        "pytest_specenergy.refserver.names",
        "pytest_specenergy.refserver.catalog",
    ],
)
def test_importing_the_reference_server_loads_no_plugin_module(entry):
    code = (
        f"import sys, {entry}; "
        "print(sorted(m for m in sys.modules if m.startswith('pytest_specenergy.') "
        "and not m.startswith('pytest_specenergy.refserver')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_document_imports_only_the_standard_library_and_the_metric_definitions():
    code = (
        "import sys; before = set(sys.modules); import pytest_specenergy.document; "
        "new = set(sys.modules) - before; "
        "print(sorted(m for m in new "
        "if m.startswith(('pytest_specenergy.', 'numpy', '_pytest')) or m == 'pytest'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "['pytest_specenergy.document', 'pytest_specenergy.measure', "
        "'pytest_specenergy.measure.metrics']"
    )
