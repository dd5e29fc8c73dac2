"""Merging run shards: one matrix split over several CI machines becomes one run.

Shards are refused - never silently mixed - when they could not have been one run: another
schema, another machine key, meter or engine version, or the same test measured twice.
"""

from __future__ import annotations

from typing import Any
from typing import Mapping
from typing import Sequence

from pytest_specenergy.gate.machine import run_info


class MergeError(ValueError):
    """Shards that cannot form one run; the message names the shard and the difference."""


_SHARD_FACTS = ("schema_version", "kind", "machine_key")


def merge_documents(shards: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """One run document from ``shards`` (``names`` label them in errors)."""
    if not shards:
        raise MergeError("nothing to merge: give at least one shard")
    first, first_name = shards[0], names[0]
    seen: dict[str, str] = {}
    engines: dict[tuple[Any, Any], str] = {}
    results: list[dict[str, Any]] = []
    for shard, name in zip(shards, names):
        for fact in _SHARD_FACTS:
            if shard.get(fact) != first.get(fact):
                raise MergeError(f"{name}: {fact} is {shard.get(fact)!r} but {first_name} has "
                                 f"{first.get(fact)!r}; shards of one run share it")
        for record in shard.get("results", []):
            node = str(record.get("nodeid") or record.get("case_id"))
            if node in seen:
                raise MergeError(f"{name}: {node} was also measured in {seen[node]}; a test "
                                 f"belongs to exactly one shard")
            seen[node] = name
            info = run_info(record)
            engines.setdefault((info["meter"], info["engine_version"]), name)
            results.append(dict(record))
    if len(engines) > 1:
        described = "; ".join(f"{meter} with engine {version} in {name}"
                              for (meter, version), name in engines.items())
        raise MergeError(f"shards were measured differently: {described}; only runs with one "
                         f"meter and engine version merge")
    return {
        **{k: v for k, v in first.items() if k not in ("results", "name")},
        "engine_starts": sum(int(s.get("engine_starts") or 0) for s in shards),
        "meters": {k: v for s in shards for k, v in (s.get("meters") or {}).items()},
        "shards": list(names),
        "results": results,
    }
