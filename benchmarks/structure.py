"""The package's structure in figures: statements, long functions, complexity, probes, circles.

Run: ``.venv/bin/python benchmarks/structure.py`` (add ``--list`` for the names behind each count).

What each figure counts (the same rules before and after a change, so two runs compare):

- statements: ``ast.stmt`` nodes in every module of ``pytest_specenergy/`` (docstrings excluded);
- functions over 50 lines: a ``def`` whose source spans more than 50 lines, its docstring included;
- blocks of complexity D or worse: McCabe complexity above 20 (radon's grade D starts at 21), as
  ``ruff check --select C901`` computes it;
- probes: ``getattr(``/``hasattr(`` calls in ``measure/``, and ``.get("`` outside the reference server;
- long lines: lines of 110 characters or more, as a share of every line of the package;
- circles: groups of modules that import each other (every ``import`` statement, module level,
  inside a function or for type hints only), as ``tests/unit/test_layers.py`` finds them;
- arrows back up: imports that the layer contract of ``tests/unit/test_layers.py`` refuses.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_specenergy"
LONG_LINE = 110
LONG_FUNCTION = 50
GRADE_D = 20


def _module_name(path: Path) -> str:
    name = ".".join(("pytest_specenergy", *path.relative_to(PACKAGE).with_suffix("").parts))
    return name.removesuffix(".__init__")


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


def _contract() -> Any:
    """The suite's import contract (``tests/unit/test_layers.py``): its graph, circles, rules."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import test_layers

    return test_layers


def measure() -> dict[str, object]:
    """Every figure of the module docstring, with the names behind each count."""
    modules = 0
    lines = long_lines = 0
    statements = 0
    long_functions: list[str] = []
    probes: list[str] = []
    gets: dict[str, int] = defaultdict(int)
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        module = _module_name(path)
        tree = ast.parse(text)
        modules += 1
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
    contract = _contract()
    return {
        "modules": modules,
        "lines": lines,
        "statements": statements,
        "long_lines": long_lines,
        "long_line_share": long_lines / lines,
        "functions_over_50_lines": long_functions,
        "complexity_d_or_worse": _complex_blocks(),
        "getattr_hasattr_in_measure": probes,
        "dict_get_outside_refserver": dict(gets),
        "circles": contract.circles(contract.module_graph()),
        "arrows_back_up": contract._violations(),
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
