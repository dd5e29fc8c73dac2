"""Fixtures: ``spec_pair`` (this case's matched pair) and ``specenergy`` (the session)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the session module loads the measurement stack; fixtures run after configure
    from pytest_specenergy.cases.case import Case
    from pytest_specenergy.measure.results import PairResult
    from pytest_specenergy.session import SpecEnergySession


@dataclass
class SpecPair:
    """The matched pair of one case; :meth:`measure` runs it (once per session)."""

    case: Case
    session: SpecEnergySession
    node: pytest.Item

    def measure(self) -> PairResult:
        """Measure and compare both arms; a window the meter cannot measure is retried once, then
        fails the test."""
        from pytest_specenergy.meters.base import MeterError
        from pytest_specenergy.session import PAIR_KEY

        try:
            pair = self.session.measure(self.case)
        except MeterError as first:
            try:
                pair = self.session.measure(self.case)
            except MeterError as exc:
                pytest.fail(
                    f"specenergy: energy of {self.case.id} could not be measured, twice: "
                    f"{exc} (first try: {first})",
                    pytrace=False,
                )
        self.node.stash[PAIR_KEY] = pair
        return pair


@pytest.fixture(scope="session")
def specenergy(pytestconfig: pytest.Config) -> SpecEnergySession:
    """The session object: options, engine pool, meters and every measured pair."""
    from pytest_specenergy.session import SESSION_KEY

    return pytestconfig.stash[SESSION_KEY]


@pytest.fixture
def specenergy_case(request: pytest.FixtureRequest) -> Case:
    """This test's case; the plugin parametrizes it from the markers."""
    raise pytest.UsageError(
        f"{request.node.nodeid}: spec_pair needs @pytest.mark.model, drafter, batch and corpus "
        "markers to form its cases"
    )


@pytest.fixture
def spec_pair(
    specenergy_case: Case, specenergy: SpecEnergySession, request: pytest.FixtureRequest
) -> SpecPair:
    """The matched pair (speculative engine + its non-speculative twin) for this case."""
    from pytest_specenergy import xdist

    if xdist.is_worker(request.config) and specenergy.config.xdist == "off":
        # Never a skip: a CI job that added -n for speed must not go green having gated nothing.
        specenergy.xdist_skipped += 1
        pytest.fail(xdist.OFF_REASON, pytrace=False)
    return SpecPair(specenergy_case, specenergy, request.node)
