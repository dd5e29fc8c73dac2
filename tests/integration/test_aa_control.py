"""Issue 40 item 2 through the plugin: a case measured in the same cycles as an A/A control
(``Drafter("none")``, a second process of the baseline engine) fails the ``exact-below-control``
check when its exact-match fraction falls below the control's by more than one prompt. The
``accept-off-by-one`` fault acts on the speculative engine alone (the twin starts without it), so
the faulted n-gram case shares the baseline arm, and the cycles, with the control and the healthy
n-gram case; neither of those trips the check."""

from __future__ import annotations

import json

import pytest
from test_faults import call_outcomes

SUITE = """
import pytest
from pytest_specenergy import Drafter

CASE = [pytest.mark.corpus("code"), pytest.mark.batch(1),
        pytest.mark.generation(max_new_tokens=16, prompts=4)]

def marked(test, drafter, *faults):
    marks = [pytest.mark.model("tiny:dense", faults=faults), pytest.mark.drafter(drafter)]
    for one in [*marks, *CASE]:
        test = one(test)
    return test

def control(spec_pair):
    spec_pair.measure()

def healthy(spec_pair):
    spec_pair.measure()

def faulted(spec_pair):
    spec_pair.measure()

test_control = marked(control, Drafter("none"))
test_healthy = marked(healthy, "ngram")
test_faulted = marked(faulted, "ngram", "accept-off-by-one")
"""


def test_a_case_below_its_aa_controls_exact_fraction_fails(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile(test_control=SUITE)
    out = pytester.path / "run.json"
    result = run_suite(f"--specenergy-json={out}")
    outcomes = call_outcomes(result)
    tail = result.stdout.str()[-3000:]
    assert outcomes == {
        "test_control[code-none-b1]": "passed",
        "test_healthy[code-ngram-b1]": "passed",
        "test_faulted[code-ngram-b1]": "failed",
    }, tail
    result.stdout.fnmatch_lines(
        [
            "*exact-below-control*exact-match fraction * of 4 prompts, numerical ties counting "
            "as matches) is below the A/A control *none*'s 1.000 (4 of 4)*"
        ]
    )
    records = {r["nodeid"].split("::")[-1]: r for r in json.loads(out.read_text())["results"]}
    checks = {
        name.split("[")[0]: {c["name"] for c in record["checks"] if c["severity"] == "fail"}
        for name, record in records.items()
    }
    assert "exact-below-control" in checks["test_faulted"], checks
    assert "exact-below-control" not in checks["test_healthy"] | checks["test_control"], checks
    # One group's cycles: the faulted case was measured with the control, on its baseline arm.
    faulted = records["test_faulted[code-ngram-b1]"]
    assert records["test_control[code-none-b1]"]["case_id"] in faulted["order"]["cycled_with"]
    assert faulted["equivalence"]["matched_fraction"] <= 0.5, faulted["equivalence"]


NOISE = """
import pytest
from pytest_specenergy import Drafter

DRAFT = Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft")
CASE = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("conversation"), pytest.mark.batch(1),
        pytest.mark.generation(max_new_tokens=96, prompts=8)]

def marked(test, drafter):
    for one in [pytest.mark.drafter(drafter), *CASE]:
        test = one(test)
    return test

def control(spec_pair):
    spec_pair.measure()

def draft(spec_pair):
    spec_pair.measure()

test_control = marked(control, Drafter("none"))
test_draft = marked(draft, DRAFT)
"""


def test_numerical_ties_below_the_controls_raw_exact_fraction_pass(
    pytester: pytest.Pytester, run_suite
):
    """Why ties count as matches: at batch 1 the control's arms run the very same step shapes, so
    the ``numerical-noise`` fault (keyed by step shape, as bf16 kernels round) never moves its
    output, while the drafter's verify steps have shapes of their own and tie (3 of 8 prompts
    when written: raw exact 0.625 against the control's 1.000). A raw comparison would fail this
    healthy drafter; counted with its ties, it matches the control."""
    pytester.makepyfile(test_noise=NOISE)
    out = pytester.path / "run.json"
    result = run_suite(
        "--specenergy-fault=numerical-noise", "--specenergy-pool=8", f"--specenergy-json={out}"
    )
    result.assert_outcomes(passed=2)
    records = {
        r["nodeid"].split("::")[-1].split("[")[0]: r for r in json.loads(out.read_text())["results"]
    }
    control, draft = records["test_control"]["equivalence"], records["test_draft"]["equivalence"]
    assert control["exact_fraction"] == 1.0 and control["ties"] == 0, control
    # More than one prompt below the control's raw fraction, every divergence a tie.
    assert draft["exact_fraction"] < 1.0 - 1 / 8 and draft["real_divergences"] == 0, draft
    assert not any(c["name"] == "exact-below-control" for c in records["test_draft"]["checks"])
