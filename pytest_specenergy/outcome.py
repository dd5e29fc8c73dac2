"""What happens after a test body that measured a pair: record it, run the fail-closed
checks and the gate, and turn both into the test's own outcome.

A regression fails the regressed test itself (not the session), so JUnit and IDEs pin it to
the case; the figures go into ``item.user_properties`` for the JUnit XML.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_specenergy.gate.gatekeeper import Gatekeeper
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import SpecEnergyAssertionError
from pytest_specenergy.session import SpecEnergySession


def record_of(item: pytest.Item, pair: PairResult, machine_key: str) -> dict[str, Any]:
    """The JSON-ready record of one test's pair."""
    return {"nodeid": item.nodeid, "machine_key": machine_key, **pair.as_dict()}


def _properties(item: pytest.Item, record: dict[str, Any]) -> None:
    for key in ("energy_per_token", "energy_saving", "accept_length", "acceptance_rate", "tbt_ms",
                "speedup", "source", "verdict", "baseline_file", "machine_key"):
        value = record.get(key)
        if value is not None:
            item.user_properties.append((f"specenergy.{key}", value))
    item.user_properties.append(("specenergy.baseline_energy_per_token",
                                 record["baseline"]["energy_per_token"]))


def settle(item: pytest.Item, pair: PairResult, session: SpecEnergySession, gate: Gatekeeper,
           body_failed: bool) -> None:
    """Record the pair and apply checks and gate; raises to fail, skip or xfail the test."""
    key = session.machine_key_for(pair)
    record = record_of(item, pair, key)
    failures: list[str] = []
    if pair.failed_checks and session.config.checks == "fail":
        # A normal-looking row can hide broken speculation (paper s.10): fail closed.
        failures.append("validity checks failed: " + "; ".join(str(c) for c in pair.failed_checks)
                        + "\n" + pair.describe())
    elif pair.failed_checks:
        item.warn(pytest.PytestWarning("specenergy validity checks failed: "
                                       + "; ".join(str(c) for c in pair.failed_checks)))
    judgement = None
    if gate.active:
        def repeat(extra: int) -> dict[str, Any]:
            nonlocal pair
            pair = session.add_repeats(pair.case, extra)
            return record_of(item, pair, key)

        judgement = gate.judge(item, record, key, repeat)
        record = record_of(item, pair, key)
        record["verdict"] = judgement.verdict
        record["comparison"] = judgement.comparison.as_dict() if judgement.comparison else None
        record["baseline_file"] = str(judgement.baseline_path) if judgement.baseline_path else None
        failures += judgement.fail
        for message in judgement.warn:
            item.warn(pytest.PytestWarning(message))
    session.records.append(record)
    _properties(item, record)
    if body_failed:
        return  # the test already fails for its own assertion; the record is kept
    if failures:
        raise SpecEnergyAssertionError("\n".join(failures))
    if judgement is not None and judgement.skip:
        pytest.skip(judgement.skip)
    if judgement is not None and judgement.xfail:
        pytest.xfail(judgement.xfail)
