"""Every pointer into ``docs/`` resolves (issue 43 item 3).

Code, tests, scripts and the top-level Markdown files name documentation as ``docs/FILE.md`` or
``docs/FILE.md#section``; the files in ``docs/`` link each other as ``[text](FILE.md#section)``.
Each file must exist, and each ``#section`` must be the anchor of one of its headings (GitHub's:
lower case, punctuation dropped, spaces as hyphens).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEARCHED = ("pytest_specenergy", "tests", "benchmarks", "dev", "example_suites", ".ci")
TOP_LEVEL = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")
POINTER = re.compile(r"docs/[\w./-]*?\.md(?:#[\w-]+)?")
DOC_LINK = re.compile(r"\]\(([\w./-]+\.md)(#[\w-]+)?\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {anchor(m) for m in re.findall(r"^#+ (.+)$", doc.read_text(), re.M)}


def broken(pointer: str, base: Path = ROOT) -> str | None:
    """Why ``pointer`` (``path.md`` or ``path.md#section``, relative to ``base``) does not
    resolve, or None."""
    path, _, section = pointer.partition("#")
    doc = (base / path).resolve()
    if not doc.is_file():
        return f"{pointer}: no such file"
    if section and section not in anchors(doc):
        return f"{pointer}: {doc.name} has no heading #{section}"
    return None


def pointers() -> list[tuple[Path, str, Path]]:
    """``(file, pointer, base)`` for every pointer in the repository."""
    files = [ROOT / name for name in TOP_LEVEL]
    for folder in SEARCHED:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".sh", "")]
    found = []
    for path in files:
        # This file's own examples are not pointers.
        if not path.is_file() or "__pycache__" in path.parts or path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        found += [(path, p, ROOT) for p in POINTER.findall(text)]
    for doc in (ROOT / "docs").rglob("*.md"):
        for target, section in DOC_LINK.findall(doc.read_text()):
            if "://" not in target:
                found.append((doc, target + section, doc.parent))
    return found


def test_every_docs_pointer_resolves():
    problems = [
        f"{path.relative_to(ROOT)}: {why}"
        for path, pointer, base in pointers()
        if (why := broken(pointer, base))
    ]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_missing_file_and_a_missing_section(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "gate.md").write_text("# The gate\n\n## Stopping rule and cap\n")
    assert broken("docs/gate.md", tmp_path) is None
    assert broken("docs/gate.md#stopping-rule-and-cap", tmp_path) is None
    assert "no heading" in broken("docs/gate.md#the-rule", tmp_path)
    assert "no such file" in broken("docs/design/gate.md", tmp_path)


def test_pointers_are_found_in_code_and_docs():
    found = {(path.name, pointer) for path, pointer, _ in pointers()}
    assert any(name.endswith(".py") for name, _ in found), "no pointer found in the code"
