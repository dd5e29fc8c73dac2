"""Numerical ties pass assert_equivalent, real divergences fail it: the reference server's faults.

``numerical-noise`` perturbs the target's logits in their last bits (a bf16 ulp, relative),
differently per step shape, as batch-dependent GPU kernels do. It moves a greedy token only
where the target's two best nearly tie, so it needs enough near-ties to show: at batch 4, 96
new tokens and 8 prompts of the conversation and news corpora it diverges on 5 of the 16
prompts, every one a tie (4 prompts of 32 tokens on the code corpus show none).
``accept-off-by-one`` and ``skip-state-rollback`` are real bugs and must still fail; they
diverge within a few tokens, so a short run shows them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_faults import call_outcomes

from pytest_specenergy.measure.equivalence import DEFAULT_TIE_MARGIN

SUITE = """
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("{model}")
@pytest.mark.corpus({corpora})
@pytest.mark.drafter({drafter})
@pytest.mark.batch(4)
@pytest.mark.generation(max_new_tokens={tokens}, prompts=8)
def test_equivalent(spec_pair):
    spec_pair.measure().assert_equivalent()
"""
DRAFT = 'Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft")'
# Under noise the text after each tie is still the target's greedy text up to ties:
# assert_coherent's per-token check passes it too (worst token 0.023 and 0.041 nats below the
# target's best, under 0.125).
NOISE = SUITE.format(
    model="tiny:dense", drafter=DRAFT, corpora='"conversation", "news"', tokens=96
).replace("assert_equivalent()", "assert_equivalent().assert_coherent()")
DENSE = SUITE.format(model="tiny:dense", drafter=DRAFT, corpora='"conversation"', tokens=24)
HYBRID = SUITE.format(model="tiny:hybrid", drafter='"ngram"', corpora='"conversation"', tokens=24)


def counts(path: Path) -> tuple[int, int, list[dict]]:
    """Ties, real divergences and every divergence record over the run's pairs."""
    results = json.loads(path.read_text())["results"]
    divergences = [d for r in results for d in r["equivalence"]["divergences"]]
    return (
        sum(r["equivalence"]["ties"] for r in results),
        sum(r["equivalence"]["real_divergences"] for r in results),
        divergences,
    )


def test_numerical_noise_makes_ties_that_pass(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(test_ties=NOISE)
    out = pytester.path / "run.json"
    noisy = run_suite(
        "--specenergy-fault=numerical-noise", f"--specenergy-json={out}", "--specenergy-pool=8"
    )
    noisy.assert_outcomes(passed=2)
    ties, real, divergences = counts(out)
    assert ties >= 1 and real == 0, divergences  # ties really occur, and pass
    assert all(
        d["class"] == "tie" and d["margin"] < DEFAULT_TIE_MARGIN and d["top2"]["between_top2"]
        for d in divergences
    )
    # The tie margin is the engine's stated rounding (the fault's, a bf16 ulp: 0.125 nats), not a
    # fixed constant: a float32 engine's would be 2**-13 (issue 40 item 2).
    for record in json.loads(out.read_text())["results"]:
        equivalence = record["equivalence"]
        assert equivalence["tie_margin"] == 0.125 and equivalence["near_ties"] == ties_of(record)
        assert equivalence["tie_margin_source"].startswith("the engine's emulated logit rounding")


def ties_of(record: dict) -> int:
    """A record's ties (under the share bound every near-tie is one)."""
    return record["equivalence"]["ties"]


def test_off_by_one_acceptance_is_a_real_divergence(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(test_ties=DENSE)
    out = pytester.path / "run.json"
    faulted = run_suite(
        "--specenergy-fault=accept-off-by-one", f"--specenergy-json={out}", "--specenergy-pool=8"
    )
    faulted.assert_outcomes(failed=1)
    faulted.stdout.fnmatch_lines(
        [
            "*outputs differ from the baseline: exact-match fraction * (counting * "
            "numerical tie(s) as matches) is below the required 1.000",
            "* real divergence(s), the first at token * of prompt * (baseline top-2 margin *",
        ]
    )
    ties, real, _ = counts(out)
    assert real > ties


def test_skipped_state_rollback_is_a_real_divergence(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(test_ties=HYBRID)
    out = pytester.path / "run.json"
    faulted = run_suite(
        "--specenergy-fault=skip-state-rollback", f"--specenergy-json={out}", "--specenergy-pool=8"
    )
    faulted.assert_outcomes(failed=1)
    faulted.stdout.fnmatch_lines(["*real divergence(s), the first at token * of prompt *"])
    ties, real, _ = counts(out)
    assert real > ties


GATED = """
import pytest
from pytest_specenergy import Drafter

DRAFT = Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft")

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("news")
@pytest.mark.drafter(DRAFT)
@pytest.mark.batch(4)
@pytest.mark.generation(max_new_tokens=96, prompts=8)
def test_stored(spec_pair):
    spec_pair.measure()

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("news")
@pytest.mark.drafter(DRAFT)
@pytest.mark.reference_drafter(Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=2, id="draft2"))
@pytest.mark.batch(4)
@pytest.mark.generation(max_new_tokens=96, prompts=8)
def test_in_job(spec_pair):
    spec_pair.measure()
"""


def test_the_default_gate_passes_numerical_ties_stored_and_in_job(
    pytester: pytest.Pytester, run_suite
):
    """Issue 22 item 3: on news at 96 tokens the noise fault ties some prompts (2 of 8 candidate and
    1 of 8 reference prompts in one run, exact fractions 0.75 and 0.875), which the raw exact
    fraction REGRESSED both against a healthy stored run and in-job. Counting real divergences only,
    the equivalence limit passes, with the ties beside the row. (Real divergences still regress:
    tests/unit/gate/test_equivalence_ties_gate.py.)

    A tie changes the text after it, and with it what the drafter accepts there: three ties in eight
    answers have moved the candidate's acceptance 9% (3.25 -> 2.96 and 3.06 -> 2.78 in two loaded
    runs, 2026-12-05) and its energy per token with it (+9.4%, +10.3%), which the 5% energy limit
    rightly calls a changed workload (quiet, six runs moved energy -0.5% to +6.7%). So a case
    passes, or fails on energy and acceptance alone, its energy moved by what its acceptance
    explains (energy per token x accept length within 3% of the stored run's)."""
    pytester.makepyfile(test_gated=GATED)
    run_suite(
        "-k", "stored", "--specenergy-save=main", "--specenergy-pool=8", repeats=2
    ).assert_outcomes(passed=1)
    out = pytester.path / "run.json"
    noisy = run_suite(
        "--specenergy-fault=numerical-noise",
        "--specenergy-compare=main",
        "--specenergy-pool=8",
        "--specenergy-max-repeats=2",
        f"--specenergy-json={out}",
        repeats=2,
    )
    outcomes = call_outcomes(noisy)
    records = {r["nodeid"].split("::")[-1]: r for r in json.loads(out.read_text())["results"]}
    assert len(outcomes) == 2 and set(outcomes) == set(records), (outcomes, list(records))
    for name, outcome in outcomes.items():
        rows = {r["metric"]: r for r in records[name]["comparison"]["rows"]}
        regressed = sorted(m for m, r in rows.items() if r["verdict"] == "regressed")
        assert outcome == "passed" or (
            regressed and set(regressed) <= {"energy_ratio", "accept_length"}
        ), noisy.stdout.str()[-4000:]
        if regressed:
            energy, accept = rows["energy_ratio"]["change_rel"], rows["accept_length"]["change_rel"]
            assert abs((1 + energy) * (1 + accept) - 1) < 0.03, rows
    # The noise is keyed by each step's batch shape, and which prompts share a step depends
    # on arrival timing: a case may tie no prompt in a run. At least one must, and every tie
    # must be counted as a match, reported beside the row.
    tied = 0
    for record in json.loads(out.read_text())["results"]:
        row = next(r for r in record["comparison"]["rows"] if r["metric"] == "equivalence")
        assert row["verdict"] == "passed" and row["current"] == 1.0, row
        ties = record["equivalence"]["ties"]
        assert (record["equivalence"]["exact_fraction"] < 1.0) == (ties > 0), record["equivalence"]
        if ties:
            tied += 1
            assert row["ties"][1] == ties and "numerical ties counted as matches" in row["note"], (
                row
            )
    assert tied, "the numerical-noise fault tied no prompt in either case: the test proves nothing"
