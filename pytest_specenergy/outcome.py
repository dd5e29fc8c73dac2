"""Apply what was decided about a measured pair to its test: fail, skip, xfail or warn. A regression
fails the test itself (not the session), so JUnit and IDEs pin it to the case. Nothing here decides
or measures."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Sequence

import pytest

from pytest_specenergy.measure.results import SpecEnergyAssertionError

if TYPE_CHECKING:
    from pytest_specenergy.document import CaseRecord
    from pytest_specenergy.document import Check
    from pytest_specenergy.gate.gatekeeper import Judgement

#: Record fields copied into the JUnit XML as ``specenergy.<name>`` properties.
JUNIT_FIELDS = (
    "energy_per_token",
    "energy_saving",
    "accept_length",
    "acceptance_rate",
    "tbt_ms",
    "speedup",
    "source",
    "verdict",
    "baseline_file",
    "machine_key",
)


def add_properties(item: pytest.Item, record: CaseRecord) -> None:
    """The record's headline figures as JUnit ``user_properties``."""
    for key in JUNIT_FIELDS:
        value = getattr(record, key)
        if value is not None:
            item.user_properties.append((f"specenergy.{key}", value))
    item.user_properties.append(
        ("specenergy.baseline_energy_per_token", record.baseline.energy_per_token)
    )


def apply(
    item: pytest.Item,
    failed_checks: Sequence[Check],
    checks_mode: str,
    judgement: Judgement | None,
    described_pair: str,
    body_failed: bool,
) -> None:
    """Raise to fail, skip or xfail ``item``; warn for what only warns (``checks_mode``: ``fail`` or
    ``warn`` on a failed validity check). A body that already failed keeps its own failure."""
    __tracebackhide__ = True  # the failure is the message, not this frame
    failures: list[str] = []
    checks = "; ".join(str(c) for c in failed_checks)
    if failed_checks and checks_mode == "fail":
        # A normal-looking row can hide broken speculation (paper s.10): fail closed.
        failures.append(f"validity checks failed: {checks}\n{described_pair}")
    elif failed_checks:
        item.warn(pytest.PytestWarning(f"specenergy validity checks failed: {checks}"))
    if judgement is not None:
        failures += judgement.fail
        for message in judgement.warn:
            item.warn(pytest.PytestWarning(message))
    if body_failed:
        return
    if failures:
        # Raised after the body returned, so no line of the test is in the traceback: name it.
        path, line, name = item.location
        where = f"\n(test {name} at {path}:{line + 1})" if line is not None else ""
        raise SpecEnergyAssertionError("\n".join(failures) + where)
    if judgement is not None and judgement.skip:
        pytest.skip(judgement.skip)
    if judgement is not None and judgement.xfail:
        pytest.xfail(judgement.xfail)
