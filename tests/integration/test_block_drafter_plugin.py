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
        pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(SUITE)
    out = pytester.path / "run.json"
    run_suite(f"--specenergy-json={out}").assert_outcomes(passed=1)
    record = json.loads(out.read_text())["results"][0]
    assert record["verified_per_step"] == 8
    # accept_p = 0.9 over 7 drafts: 1 + sum(0.9^j, j = 1..7) = 5.70 tokens per step on average.
    assert 4.5 < record["accept_length"] < 7.0
    assert record["balance_point"] == 163.0  # H200
    assert 0 < record["verify_intensity"] < record["balance_point"] and record["compute_bound"] is False
    assert 0 < record["draft_share"] < 0.5  # verification, not drafting, dominates a dense model
