"""Hooks other plugins and ``conftest.py`` files can implement; an example of each:
docs/design/root-cases.md."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_specenergy_make_meter(kind: str, engine: Any) -> Any:
    """A meter for ``kind`` (``nvml``, ``modeled:<gpu>``) on ``engine``, or None: the plugin builds
    its own."""


def pytest_specenergy_pair_measured(pair: Any) -> None:
    """Called once per measured :class:`~pytest_specenergy.PairResult`, before any assertion."""


def pytest_specenergy_update_json(data: dict[str, Any]) -> None:
    """Modify the ``--specenergy-json`` document in place before it is written."""
