"""Which arms of a case run on replay engines: draft removal and oracle-free controlled acceptance
(the method and the ``--specenergy-draft-removal`` modes: ``docs/methodology.md#draft-removal``).
"""

from __future__ import annotations

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.drafters import Drafter

DRAFT_REMOVAL_MODES = ("auto", "on", "off")


def check_mode(mode: str) -> str:
    """``mode`` if it is a draft-removal mode; ValueError naming the valid ones otherwise."""
    if mode not in DRAFT_REMOVAL_MODES:
        raise ValueError(
            f"draft removal {mode!r}: expected one of {', '.join(DRAFT_REMOVAL_MODES)}"
        )
    return mode


def is_board_meter(meter_kind: str) -> bool:
    """Whether the meter reads the hardware (every forward the engine runs is charged)."""
    return not meter_kind.startswith("modeled:")


def removes_drafts(mode: str, case: Case, meter_kind: str) -> bool:
    """Whether ``case`` gets a verify-only ``removal`` arm under ``mode`` and this meter."""
    return check_mode(mode) == "on" or (
        mode == "auto"
        and case.engine == "reference"
        and case.drafter.draft_model is not None
        and is_board_meter(meter_kind)
    )


def replays_proposals(drafter: Drafter, engine: str, meter_kind: str) -> bool:
    """Whether an arm of ``drafter`` is measured on a ``proposals`` replay engine: controlled
    acceptance under a board meter, whose oracle must not be in the measured window."""
    return (
        engine == "reference"
        and dict(drafter.settings).get("accept_p") is not None
        and is_board_meter(meter_kind)
    )
