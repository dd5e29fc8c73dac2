"""Cases the gate cannot pair, refused before anything is measured.

A drafter measured in its baseline's interleaved cycles is judged paired: repeat ``i`` of each arm
shares the drift of cycle ``i``, and no allowance is needed. Where the arms run in blocked order
(one engine at a time on one GPU) they are not, and the gate allows a block drift of
``block_drift`` either way for each run measured so (``compare.drift_allowance``). An allowance
at or beyond a limit leaves no room for "unchanged": every such case would end INCONCLUSIVE after
the whole repeat cap. The session refuses it at collection instead, naming the fix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Sequence

from pytest_specenergy.gate.compare import DRIFTING_METRICS
from pytest_specenergy.gate.compare import drift_allowance
from pytest_specenergy.gate.limits import FailLimit


def allowance_refusal(
    nodeid: str,
    limits: Sequence[FailLimit],
    *,
    why_blocked: str,
    block_drift: float,
    sides: int,
) -> str | None:
    """Why ``nodeid``'s limits cannot be met when its arms run blocked (``why_blocked``), or
    None. ``sides``: the blocked runs the judgement pairs - 2 against a stored run (one with the
    same machine key ran on the same GPU, so blocked too), 1 for an in-job A/B. A relative limit on
    a metric a block drift moves at or below that allowance is refused."""
    allowance = drift_allowance(block_drift, sides)
    tight = [
        limit
        for limit in limits
        if limit.metric in DRIFTING_METRICS and limit.relative and limit.threshold <= allowance
    ]
    if not tight:
        return None
    names = ", ".join(limit.expr for limit in tight)
    against = "against a stored run measured blocked too" if sides > 1 else "in-job"
    wider = math.ceil(allowance * 100 + 1)
    in_job = ", compare in-job (reference_drafter) for one run's allowance" if sides > 1 else ""
    return (
        f"{nodeid}: its arms run in blocked order ({why_blocked}), unpaired, so the gate allows "
        f"{allowance:.1%} of block drift either way ({against}), at or beyond the limit {names}: "
        "no number of repeats could find it unchanged. Let the engines stay resident so the arms "
        "interleave (model(resident=True), or weights_gb= so they are known to fit; a GPU with "
        f"more memory){in_job}, or gate a limit wider than the allowance (e.g. "
        f"energy_ratio:{wider}%)"
    )


def allowance_refusals(
    tests: Iterable[tuple[str, Sequence[FailLimit], str | None]], block_drift: float, sides: int
) -> list[str]:
    """The refusal of every test whose arms run blocked (``(nodeid, limits, why blocked or
    None)``) with a limit inside the allowance of ``sides`` blocked runs."""
    refusals = (
        allowance_refusal(nodeid, limits, why_blocked=why, block_drift=block_drift, sides=sides)
        for nodeid, limits, why in tests
        if why is not None
    )
    return [refusal for refusal in refusals if refusal is not None]
