"""docs/reference.md stays complete: every option the plugin registers and every check the code can
raise is in it (a new one without a line there fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_specenergy.options import OPTIONS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"
#: A check's name where the code raises it: ``Check("name", ...)`` (its first argument, on the same
#: line or the next) or a flag's ``name="..."``/``name="a" if ... else "b"`` in engines/retractions.py.
CHECK_CALL = re.compile(r'\bCheck\(\s*"([a-z0-9-]+)"')
FLAG_NAMES = re.compile(r'name="([a-z0-9-]+)"(?: if .*? else "([a-z0-9-]+)")?')


def raised_checks() -> set[str]:
    """Every check name the package's code can raise."""
    names: set[str] = set()
    for path in (ROOT / "pytest_specenergy").rglob("*.py"):
        names.update(CHECK_CALL.findall(path.read_text()))
    for found in FLAG_NAMES.findall(
        (ROOT / "pytest_specenergy/engines/retractions.py").read_text()
    ):
        names.update(n for n in found if n)
    return names


def test_every_option_is_in_the_reference():
    text = REFERENCE.read_text()
    missing = [o.name for o in OPTIONS if f"`--specenergy-{o.name}" not in text]
    assert missing == [], f"options missing from {REFERENCE.name}: {missing}"


def test_every_check_is_in_the_reference():
    text = REFERENCE.read_text()
    names = raised_checks()
    assert {"twin-idle", "retractions-differ", "retractions", "incoherent"} <= names
    missing = sorted(n for n in names if f"`{n}`" not in text and f"`!{n}`" not in text)
    assert missing == [], f"checks missing from {REFERENCE.name}: {missing}"


def test_the_check_finder_reads_both_shapes():
    source = 'x = Check(\n    "one-check", "fail", m)\nflag = Check("two", "warn", m)'
    assert CHECK_CALL.findall(source) == ["one-check", "two"]
