"""The block drafter (the DFlash/DSpark shape) and controlled acceptance through the plugin."""

from __future__ import annotations

import json

import pytest

SUITE = """
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter(Drafter("block", draft_model="tiny:dense-draft", block_size=8, accept_p=0.9, id="block8"))
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=32, prompts=2, ignore_eos=True)
def test_block(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent()  # the target verifies every drafted token: exact whatever the drafts
"""


def test_block_drafter_is_exact_its_acceptance_is_the_knob_and_the_balance_point_is_reported(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(SUITE)
    out = pytester.path / "run.json"
    run_suite(f"--specenergy-json={out}").assert_outcomes(passed=1)
    record = json.loads(out.read_text())["results"][0]
    assert record["verified_per_step"] == 8
    # accept_p = 0.9 over 7 drafts: 1 + sum(0.9^j, j = 1..7) = 5.70 tokens per step on average.
    assert 4.5 < record["accept_length"] < 7.0
    assert record["balance_point"] == 163.0  # H200
    assert (
        0 < record["verify_intensity"] < record["balance_point"]
        and record["compute_bound"] is False
    )
    assert 0 < record["draft_share"] < 0.5  # verification, not drafting, dominates a dense model


def test_draft_removal_measures_the_draft_share_the_modeled_meter_prices(
    pytester: pytest.Pytester, run_suite
):
    """A verify-only replay of the recorded drafts, priced by the same meter, leaves out exactly the
    draft passes: the share it measures is the priced one (up to the windows' different cuts)."""
    pytester.makepyfile(SUITE)
    out = pytester.path / "run.json"
    run_suite(
        f"--specenergy-json={out}", "--specenergy-draft-removal=on", repeats=2
    ).assert_outcomes(passed=1)
    record = json.loads(out.read_text())["results"][0]
    assert record["draft_share_method"] == "removal"
    removal = record["removal"]
    assert removal["engine"]["config"]["replay"] == "verify" and len(removal["samples"]) == 2
    assert removal["accept_length"] == pytest.approx(record["accept_length"], rel=0.05)
    assert 0.05 < record["draft_share"] < 0.5
    assert record["draft_share"] == pytest.approx(record["draft_share_priced"], abs=0.03)
    assert [r["arm"] for r in record["order"]["repeats"]] == [
        "baseline",
        "speculative",
        "removal",
    ] * 2
    assert not [c for c in record["checks"] if c["name"] == "replay-unlike"]


def test_a_replay_that_is_not_like_for_like_fails_the_case(
    pytester: pytest.Pytester, run_suite, monkeypatch
):
    """Recorded drafts lost on the way (here: every request's last step dropped) make the replay
    miss steps; its energy would describe another run, so the case fails, naming why."""
    from pytest_specenergy.measure.arm import ArmMeasurer

    record_drafts = ArmMeasurer.record_drafts

    def lossy(self):
        return tuple(d[:-1] for d in record_drafts(self))

    monkeypatch.setattr(ArmMeasurer, "record_drafts", lossy)
    pytester.makepyfile(SUITE.replace("max_new_tokens=32", "max_new_tokens=16"))
    result = run_suite("--specenergy-draft-removal=on")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*replay-unlike*removal arm*had no recorded draft*"])
