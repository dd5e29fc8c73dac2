"""The modeled meter says in the run document why its figures move between identical repeats at
batch > 1 (issue 40 item 6)."""

from __future__ import annotations

from pytest_specenergy.document import MeterFacts
from pytest_specenergy.meters.modeled import ModeledMeter


def test_the_meter_description_carries_the_batch_noise_into_the_document():
    facts = MeterFacts.from_dict(ModeledMeter("h200").describe(), "meter")
    assert facts.noise is not None and "batch 1" in facts.noise and "coverage" in facts.noise
    assert "noise" in facts.as_dict() and "noise" not in facts.extra
    # A file written before the field reads as before.
    assert MeterFacts.from_dict({"kind": "modeled:h200"}, "old").noise is None
