"""Issue 38 item 5 through the plugin: a drafter whose every draft is rejected (the reference server's
``dead-drafter`` fault) fails the ``dead-drafter`` check by default, although its output is exact
and its counters consistent; the healthy drafter beside it, on the same baseline, passes. A draft
model, so that no n-gram check (``accept-length-1-on-repetition``) speaks for it."""

from __future__ import annotations

import json

import pytest
from test_faults import call_outcomes

SUITE = """
import pytest
from pytest_specenergy import Drafter

DRAFT = Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft")
CASE = [pytest.mark.corpus("code"), pytest.mark.drafter(DRAFT), pytest.mark.batch(1),
        pytest.mark.generation(max_new_tokens=16, prompts=2)]

def marked(test, *faults):
    for one in [pytest.mark.model("tiny:dense", faults=faults), *CASE]:
        test = one(test)
    return test

def healthy(spec_pair):
    spec_pair.measure().assert_equivalent()

def dead(spec_pair):
    spec_pair.measure().assert_equivalent()

test_healthy = marked(healthy)
test_dead = marked(dead, "dead-drafter")
"""


def test_a_dead_drafter_fails_by_default_while_its_output_is_exact(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(test_dead=SUITE)
    out = pytester.path / "run.json"
    result = run_suite(f"--specenergy-json={out}")
    outcomes = call_outcomes(result)
    assert outcomes == {
        "test_healthy[code-draft-b1]": "passed",
        "test_dead[code-draft-b1]": "failed",
    }, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*dead-drafter*accept length 1.000 (0 drafts accepted over *"])
    records = {r["nodeid"].split("::")[-1]: r for r in json.loads(out.read_text())["results"]}
    dead = records["test_dead[code-draft-b1]"]
    assert dead["accept_length"] == 1.0 and dead["equivalence"]["exact_fraction"] == 1.0
    assert [c["name"] for c in dead["checks"] if c["severity"] == "fail"] == ["dead-drafter"]
    assert records["test_healthy[code-draft-b1]"]["accept_length"] > 1.02
