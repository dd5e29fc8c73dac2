"""The package's structure in figures: statements, long functions, complexity, probes, circles.

Run: ``.venv/bin/python benchmarks/structure.py`` (add ``--list`` for the names behind each count).

What each figure counts (the same rules before and after a change, so two runs compare):

- statements: ``ast.stmt`` nodes in every module of ``pytest_specenergy/`` (docstrings excluded);
- functions over 50 lines: a ``def`` whose source spans more than 50 lines, its docstring included;
- blocks of complexity D or worse: McCabe complexity above 20 (radon's grade D starts at 21), as
  ``ruff check --select C901`` computes it;
- probes: ``getattr(``/``hasattr(`` calls in ``measure/``, and ``.get("`` outside the reference server;
- long lines: lines of 110 characters or more, as a share of every line of the package;
- circles: strongly connected groups of modules in the import graph (every ``import`` statement,
  module level or inside a function, ``TYPE_CHECKING`` blocks left out: they never run);
- arrows back up: imports that the layer contract of ``tests/unit/test_layers.py`` refuses.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_specenergy"
LONG_LINE = 110
LONG_FUNCTION = 50
GRADE_D = 20


def _module_name(path: Path) -> str:
    name = ".".join(("pytest_specenergy", *path.relative_to(PACKAGE).with_suffix("").parts))
    return name.removesuffix(".__init__")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The package modules ``module`` imports (a ``from X import name`` counts ``X.name`` when that is a module)."""
    found: set[str] = set()
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("pytest_specenergy")}


def _import_graph(trees: dict[str, tuple[ast.AST, Path]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, (tree, path) in trees.items():
        targets = _imports(tree, module, path.name == "__init__.py")
        # Only edges to modules that exist (``from pkg import function`` names no module); a package's own
        # ``__init__`` is not an edge of its submodules.
        graph[module] = {
            t for t in targets if t in trees and t != module and not module.startswith(t + ".")
        }
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _statements(tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        is_docstring = (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        )
        count += not is_docstring
    return count


def _long_functions(tree: ast.AST, module: str) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if span > LONG_FUNCTION:
                found.append(f"{module}:{node.name} ({span} lines)")
    return found


def _complex_blocks() -> list[str]:
    ruff = Path(sys.executable).with_name("ruff")
    command = [
        str(ruff) if ruff.exists() else "ruff",
        "check",
        "--select",
        "C901",
        "--config",
        f"lint.mccabe.max-complexity={GRADE_D}",
        "--output-format",
        "json",
        "--no-cache",
        str(PACKAGE),
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    return [
        f"{Path(d['filename']).relative_to(ROOT)}: {d['message']}"
        for d in json.loads(out.stdout or "[]")
    ]


def _layer_violations() -> list[str]:
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import test_layers  # the contract the suite checks

    return test_layers._violations()


def measure() -> dict[str, object]:
    """Every figure of the module docstring, with the names behind each count."""
    trees: dict[str, tuple[ast.AST, Path]] = {}
    lines = long_lines = 0
    statements = 0
    long_functions: list[str] = []
    probes: list[str] = []
    gets: dict[str, int] = defaultdict(int)
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        module = _module_name(path)
        tree = ast.parse(text)
        trees[module] = (tree, path)
        source_lines = text.splitlines()
        lines += len(source_lines)
        long_lines += sum(1 for line in source_lines if len(line) >= LONG_LINE)
        statements += _statements(tree)
        long_functions += _long_functions(tree, module)
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "measure":
            probes += [
                f"{rel}:{n}"
                for n, line in enumerate(source_lines, 1)
                if "getattr(" in line or "hasattr(" in line
            ]
        if rel.parts[0] != "refserver":
            count = text.count('.get("')
            if count:
                gets[str(rel)] = count
    graph = _import_graph(trees)
    return {
        "modules": len(trees),
        "lines": lines,
        "statements": statements,
        "long_lines": long_lines,
        "long_line_share": long_lines / lines,
        "functions_over_50_lines": long_functions,
        "complexity_d_or_worse": _complex_blocks(),
        "getattr_hasattr_in_measure": probes,
        "dict_get_outside_refserver": dict(gets),
        "circles": _circles(graph),
        "arrows_back_up": _layer_violations(),
    }


def main() -> None:
    figures = measure()
    show = "--list" in sys.argv
    for name, value in figures.items():
        if isinstance(value, float):
            print(f"{name}: {value:.2%}")
        elif isinstance(value, (list, dict)):
            total = sum(value.values()) if isinstance(value, dict) else len(value)
            print(f"{name}: {total}")
            if show:
                items = value.items() if isinstance(value, dict) else enumerate(value)
                for key, item in items:
                    print(f"    {item}" if isinstance(value, list) else f"    {key}: {item}")
        else:
            print(f"{name}: {value}")


if __name__ == "__main__":
    main()
