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
    # The metric definitions: the floor every layer that computes or reads a figure stands on.
    "metrics": set(),
    "document": {"metrics"},
    "atomic": set(),
    "hookspec": set(),
    "engines": {"refserver"},
    "meters": {"engines"},
    "cases": {"engines"},
    # plan/window.py states the steady window's end rule once, for the planner and the measurer.
    "measure": {"cases", "document", "engines", "meters", "metrics", "plan"},
    "plan": {"cases", "engines", "meters"},
    "gate": {"atomic", "document", "engines", "metrics"},
    "report": {"gate", "document", "metrics"},
    "cli": {
        "atomic",
        "document",
        "engines",
        "gate",
        "meters",
        "metrics",
        "options",
        "plan",
        "report",
    },
    # The wiring: options know the validators of the layers they configure.
    "options": {"cases", "engines", "gate", "measure", "meters", "metrics", "refserver"},
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
        "plan",
        "preflight",
        "report",
        "xdist",
    },
    "progress": {"xdist"},
    # The checks at a session's start: the compare run, the engines' extras, the log folder.
    "preflight": {"atomic", "cases", "document", "gate", "options"},
    "plugin": {
        "cases",
        "fixtures",
        "hookspec",
        "options",
        "outputs",
        "preflight",
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
REFSERVER_HOST = Path("engines/zygote_serve.py")


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
    return bad


def _module(path: Path, package: Path) -> str:
    name = "pytest_specenergy." + ".".join(path.relative_to(package).with_suffix("").parts)
    return name.removesuffix(".__init__")


def module_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports: any import statement, a
    type-only one included (two files that each need the other to be read are a circle whether
    or not the interpreter runs both imports); ``from pkg import name`` counts ``pkg.name`` when
    that is a module."""
    paths = {_module(path, package): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        # A package's own __init__ is not an edge of its submodules: importing a submodule runs it.
        graph[module] = {
            t for t in targets if t in paths and t != module and not module.startswith(t + ".")
        }
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_two_modules_import_each_other():
    assert circles(module_graph()) == []


def test_a_circle_of_modules_is_found(tmp_path):
    """Two modules that import each other - one of them only for type hints - are a circle."""
    fake = tmp_path / "pytest_specenergy"
    (fake / "measure").mkdir(parents=True)
    (fake / "measure" / "results.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pytest_specenergy.measure.checks import Check\n"
    )
    (fake / "measure" / "checks.py").write_text("from pytest_specenergy.measure import results\n")
    (fake / "measure" / "load.py").write_text("import pytest_specenergy.measure.checks\n")
    assert circles(module_graph(fake)) == [
        ["pytest_specenergy.measure.checks", "pytest_specenergy.measure.results"]
    ]


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
    loaded = ast.literal_eval(out.stdout.strip())
    outside = [m for m in loaded if m.split(".")[:2] != ["pytest_specenergy", "document"]]
    assert outside == ["pytest_specenergy.metrics"] and "pytest_specenergy.document" in loaded
