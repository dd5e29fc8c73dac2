"""Fixtures: ``spec_pair`` (this case's matched pair) and ``specenergy`` (the session)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_specenergy import xdist as xdist_support
from pytest_specenergy.cases.case import Case
from pytest_specenergy.gate.gatekeeper import Gatekeeper
from pytest_specenergy.meters.base import MeterError
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.session import SpecEnergySession

SESSION_KEY = pytest.StashKey[SpecEnergySession]()
#: The pair a test measured, for the post-call validity checks and the gate.
PAIR_KEY = pytest.StashKey[PairResult]()
GATE_KEY = pytest.StashKey[Gatekeeper]()


@dataclass
class SpecPair:
    """The matched pair of one case; :meth:`measure` runs it (once per session) and returns
    the :class:`PairResult`."""

    case: Case
    session: SpecEnergySession
    node: pytest.Item

    def measure(self) -> PairResult:
        """Measure both arms (the baseline arm is shared across drafters) and compare them."""
        try:
            pair = self.session.measure(self.case)
        except MeterError as exc:
            pytest.skip(f"specenergy: no energy meter for {self.case.id}: {exc}")
        self.node.stash[PAIR_KEY] = pair
        return pair


@pytest.fixture(scope="session")
def specenergy(pytestconfig: pytest.Config) -> SpecEnergySession:
    """The session object: options, engine pool, meters and every measured pair."""
    return pytestconfig.stash[SESSION_KEY]


@pytest.fixture
def specenergy_case(request: pytest.FixtureRequest) -> Case:
    """This test's case; the plugin parametrizes it from the markers."""
    raise pytest.UsageError(
        f"{request.node.nodeid}: spec_pair needs @pytest.mark.model, drafter, batch and corpus "
        f"markers to form its cases")


@pytest.fixture
def spec_pair(specenergy_case: Case, specenergy: SpecEnergySession,
              request: pytest.FixtureRequest) -> SpecPair:
    """The matched pair (speculative engine + its non-speculative twin) for this case."""
    if xdist_support.is_worker(request.config) and specenergy.config.xdist == "off":
        specenergy.xdist_skipped += 1
        pytest.skip(xdist_support.SKIP_REASON)
    return SpecPair(specenergy_case, specenergy, request.node)
