"""The run document: every sample, case, engine and meter description of a session.

The same document is written by ``--specenergy-json``, saved to the run history, merged from
xdist workers and CI shards, and rendered by ``specenergy report``. This module defines its
kinds and schema and builds it from per-test records; it imports only the standard library,
so every layer that reads or writes documents can use it.
"""

from __future__ import annotations

import datetime as dt
from importlib import metadata
from typing import Any
from typing import Iterable
from typing import Mapping

#: ``kind`` of a run document and of a golden file; readers refuse any other kind.
RUN_KIND = "specenergy-run"
GOLDEN_KIND = "specenergy-golden"
SCHEMA_VERSION = 1


def plugin_version() -> str:
    """The installed plugin's version (``unknown`` when run from a bare source tree)."""
    try:
        return metadata.version("pytest-specenergy")
    except metadata.PackageNotFoundError:
        return "unknown"


def record_of(nodeid: str, pair: Any, machine_key: str) -> dict[str, Any]:
    """The JSON-ready record of one test's pair (``pair`` has ``as_dict()``)."""
    return {"nodeid": nodeid, "machine_key": machine_key, **pair.as_dict()}


def build_document(records: Iterable[Mapping[str, Any]], meters: Mapping[str, Any],
                   engine_starts: int, machines: Mapping[str, Any] | None = None,
                   host: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON-ready run document; ``records`` are per-test pair records (or PairResults).

    ``machines`` maps each machine key to its description; ``host`` describes this machine
    for a document whose records span several keys (or none).
    """
    records = [r.as_dict() if hasattr(r, "as_dict") else dict(r) for r in records]
    machines = dict(machines or {})
    keys = sorted({str(r.get("machine_key")) for r in records if r.get("machine_key")})
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": RUN_KIND,
        "plugin_version": plugin_version(),
        "datetime": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        # One key per document when saved; a session measuring on several keeps them all.
        "machine_key": keys[0] if len(keys) == 1 else None,
        "machine_info": (machines.get(keys[0]) if len(keys) == 1 else None) or dict(host or {}),
        "machines": machines,
        "meters": dict(meters),
        "engine_starts": engine_starts,
        "results": records,
    }
