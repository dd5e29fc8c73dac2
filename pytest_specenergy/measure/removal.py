"""Which arms of a case run on replay engines: draft removal and oracle-free controlled acceptance.

**Draft removal** (paper s.8) splits speculative decode energy into verification and drafting:
the same run repeated without draft passes - the same verification steps over the same
contexts - and the difference is what the draft passes cost. The reference server records the
drafts of every verify step (``return_spec_drafts`` -> ``meta_info.spec_drafts``) and its replay
engine (``--drafter replay``) verifies exactly those drafts, each request bringing its own, with
no draft model loaded. Given the same drafts over the same committed context the target accepts
the same number, so the replay makes the recorded run's verify steps one for one. The plugin
records the drafts once per case (an unmetered run of the whole pool on the speculative engine)
and measures a ``removal`` arm in every repeat cycle, right after the speculative arm:
``draft_share = 1 - removal J/token / speculative J/token`` per cycle
(:func:`~pytest_specenergy.measure.metrics.removal_draft_share`). A replay that missed a recorded
draft, or whose outputs differ from the speculative arm's, fails the ``replay-unlike`` check.

``--specenergy-draft-removal``:

* ``auto`` (default): under a board meter (nvml), for reference-engine cases whose drafter runs
  draft passes (``draft_model``, ``block``). Under the modeled meter the priced split of the work
  trace already is what removal would measure in the model (``draft_share_method: priced``).
* ``on``: for every speculative case, any meter (the modeled meter then prices the replay's
  trace, a check of the priced split). SGLang cannot replay drafts: such a case fails with why.
* ``off``: never; a board meter then reports no draft share.

**Controlled acceptance without its oracle.** A drafter with ``accept_p`` verifies the target's
own greedy continuation, which an untraced oracle (the target run as a chain draft) computes
(:mod:`pytest_specenergy.refserver.oracle`). The modeled meter never sees the oracle, but a board
meter would charge its forwards to the speculative arm. So under a board meter such an arm is
measured on a ``proposals`` replay engine: the drafter's own passes run as usual while the drafts
verified are the ones recorded from the controlled run - the same steps, accepts and draft cost,
no oracle.
"""

from __future__ import annotations

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.drafters import Drafter

DRAFT_REMOVAL_MODES = ("auto", "on", "off")


def check_mode(mode: str) -> str:
    """``mode`` if it is a draft-removal mode; ValueError naming the valid ones otherwise."""
    if mode not in DRAFT_REMOVAL_MODES:
        raise ValueError(f"draft removal {mode!r}: expected one of {', '.join(DRAFT_REMOVAL_MODES)}")
    return mode


def is_board_meter(meter_kind: str) -> bool:
    """Whether the meter reads the hardware (every forward the engine runs is charged)."""
    return not meter_kind.startswith("modeled:")


def removes_drafts(mode: str, case: Case, meter_kind: str) -> bool:
    """Whether ``case`` gets a verify-only ``removal`` arm under ``mode`` and this meter."""
    if check_mode(mode) == "on":
        return True
    return (mode == "auto" and case.engine == "reference" and case.drafter.draft_model is not None
            and is_board_meter(meter_kind))


def replays_proposals(drafter: Drafter, engine: str, meter_kind: str) -> bool:
    """Whether an arm of ``drafter`` is measured on a ``proposals`` replay engine: controlled
    acceptance under a board meter, whose oracle must not be in the measured window."""
    return (engine == "reference" and dict(drafter.settings).get("accept_p") is not None
            and is_board_meter(meter_kind))
