"""``--specenergy-dry-run``: each matched pair's two server commands and what differs."""

from __future__ import annotations

from typing import Any
from typing import Iterable

from pytest_specenergy.engines.sglang import dry_run_lines


def render_dry_run(cases: Iterable[Any]) -> str:
    """One block per distinct speculative engine, listing the cases it serves.

    ``cases`` are :class:`pytest_specenergy.cases.case.Case` objects (anything with ``id``,
    ``spec_config()`` and ``baseline_config()``); engines sit below cases, so this takes them
    by their shape.
    """
    cases = list(cases)
    groups: dict[object, list[Any]] = {}
    for case in cases:
        groups.setdefault(case.spec_config(), []).append(case)
    blocks = []
    for config, members in groups.items():
        ids = ", ".join(sorted({c.id for c in members}))
        blocks.append("\n".join([f"cases: {ids}", *dry_run_lines(config)]))
    if not blocks:
        return "no spec_pair cases collected"
    return "\n\n".join(blocks) + f"\n\n{len(groups)} speculative engines, " \
        f"{len({c.baseline_config() for c in cases})} baseline twins; nothing was started"
