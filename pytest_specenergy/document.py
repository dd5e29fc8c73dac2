"""The run document: every sample, case, engine and meter description of a session.

The same document is written by ``--specenergy-json``, saved to the run history, merged from
xdist workers and CI shards, and rendered by ``specenergy report``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from typing import Iterable
from typing import Mapping

from pytest_specenergy import __version__
from pytest_specenergy.gate.machine import machine_info
from pytest_specenergy.gate.storage import RUN_KIND

SCHEMA_VERSION = 1


def build_document(records: Iterable[Mapping[str, Any]], meters: Mapping[str, Any],
                   engine_starts: int, machines: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON-ready run document; ``records`` are per-test pair records (or PairResults)."""
    records = [r.as_dict() if hasattr(r, "as_dict") else dict(r) for r in records]
    machines = dict(machines or {})
    keys = sorted({str(r.get("machine_key")) for r in records if r.get("machine_key")})
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": RUN_KIND,
        "plugin_version": __version__,
        "datetime": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        # One key per document when saved; a session measuring on several keeps them all.
        "machine_key": keys[0] if len(keys) == 1 else None,
        "machine_info": (machines.get(keys[0]) if len(keys) == 1 else None) or machine_info(),
        "machines": machines,
        "meters": dict(meters),
        "engine_starts": engine_starts,
        "results": records,
    }
