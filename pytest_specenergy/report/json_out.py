"""The ``--specenergy-json`` document: every sample, case, engine and meter description."""

from __future__ import annotations

import datetime as dt
import platform
from typing import Any
from typing import Iterable

from pytest_specenergy import __version__
from pytest_specenergy.results import PairResult

SCHEMA_VERSION = 1


def build_document(pairs: Iterable[PairResult], meters: dict[str, dict[str, Any]],
                   engine_starts: int) -> dict[str, Any]:
    """The JSON-ready document for a session."""
    return {
        "schema_version": SCHEMA_VERSION,
        "plugin_version": __version__,
        "datetime": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine_info": {"node": platform.node(), "python": platform.python_version(),
                         "platform": platform.platform()},
        "meters": meters,
        "engine_starts": engine_starts,
        "results": [p.as_dict() for p in pairs],
    }
