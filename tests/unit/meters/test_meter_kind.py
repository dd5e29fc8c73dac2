"""``--specenergy-meter``'s grammar: the meters package says which kinds it builds, the option
parser asks it (issue 41, item 6: ``modeled:h200:qwen3-4b``, the block_crossover suite's
documented command, was refused at start-up)."""

from __future__ import annotations

import pytest

from pytest_specenergy.meters import check_meter_kind
from pytest_specenergy.meters import make_meter
from pytest_specenergy.options import _meter


@pytest.mark.parametrize(
    "kind",
    [
        "auto",
        "nvml",
        "modeled:h200",
        "modeled:h100",
        "modeled:h200:qwen3-4b",
        "modeled:h100:Qwen3-8B",
        "modeled:h200:self",
    ],
)
def test_kinds_the_meters_build_are_accepted(kind):
    assert check_meter_kind(kind) == kind
    assert _meter(kind) == kind


@pytest.mark.parametrize(
    "kind", ["modeled", "modeled:", "modeled:a100", "modeled:h200:", "modeled:h200:llama-9000"]
)
def test_other_kinds_are_refused_with_what_is_expected(kind):
    with pytest.raises(ValueError, match=r"modeled:<gpu>:<shape>.*h100, h200.*qwen3-4b"):
        _meter(kind)


def test_a_shaped_kind_builds_a_meter_priced_as_that_shape():
    meter = make_meter("modeled:h200:qwen3-4b")
    assert meter.kind == "modeled:h200:qwen3-4b"
    assert meter.override == "qwen3-4b"
    assert meter.describe()["preset"]["name"] == "h200"
