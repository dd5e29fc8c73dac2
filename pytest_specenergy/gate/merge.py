"""Merging run shards (one matrix split over several CI machines) into one run; shards that could
not have been one run (another schema, machine key, meter or engine version, or a test measured
twice) are refused, never mixed."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Sequence

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.machine import run_info


class MergeError(ValueError):
    """Shards that cannot form one run; the message names the shard and the difference."""


_SHARD_FACTS = ("schema_version", "kind", "machine_key")


def merge_documents(shards: Sequence[RunDocument], names: Sequence[str]) -> RunDocument:
    """One run document from ``shards`` (``names`` label them in errors)."""
    if not shards:
        raise MergeError("nothing to merge: give at least one shard")
    first, first_name = shards[0], names[0]
    seen: dict[str, str] = {}
    engines: dict[tuple[Any, Any], str] = {}
    results: list[CaseRecord] = []
    for shard, name in zip(shards, names):
        for fact in _SHARD_FACTS:
            if getattr(shard, fact) != getattr(first, fact):
                raise MergeError(
                    f"{name}: {fact} is {getattr(shard, fact)!r} but {first_name} has "
                    f"{getattr(first, fact)!r}; shards of one run share it"
                )
        for record in shard.results:
            if record.key in seen:
                raise MergeError(
                    f"{name}: {record.key} was also measured in {seen[record.key]}; a test "
                    f"belongs to exactly one shard"
                )
            seen[record.key] = name
            info = run_info(record)
            engines.setdefault((info["meter"], info["engine_version"]), name)
            results.append(record)
    if len(engines) > 1:
        described = "; ".join(
            f"{meter} with engine {version} in {name}" for (meter, version), name in engines.items()
        )
        raise MergeError(
            f"shards were measured differently: {described}; only runs with one "
            f"meter and engine version merge"
        )
    return dataclasses.replace(
        first,
        name=None,
        results=tuple(results),
        shards=tuple(names),
        engine_starts=sum(s.engine_starts for s in shards),
        # A shard cut short leaves the merged run incomplete: it stays marked, never a baseline.
        interrupted=any(s.interrupted for s in shards),
        meters={k: v for s in shards for k, v in s.meters.items()},
    )
