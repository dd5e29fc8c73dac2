"""In-job A/B: a candidate drafter and a reference drafter in the same session and repeat cycles."""

from __future__ import annotations

import json

import pytest

AB_SUITE = """
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=8, id="ngram-k8"))
@pytest.mark.reference_drafter(Drafter("ngram", num_draft_tokens=2, id="ngram-k2"))
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=24, prompts=3)
def test_candidate(spec_pair):
    r = spec_pair.measure()
    assert r.reference is not None
    r.assert_equivalent()
"""


def test_reference_arm_runs_in_the_same_cycles_and_reaches_the_json(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(AB_SUITE)
    out = pytester.path / "run.json"
    result = run_suite(f"--specenergy-json={out}", repeats=2)
    result.assert_outcomes(passed=1)
    record = json.loads(out.read_text())["results"][0]
    assert record["case_id"] == "code-ngram-k8-vs-ngram-k2-b1"
    assert record["reference_drafter"]["settings"]["num_draft_tokens"] == 2
    assert record["reference"]["engine"]["config"]["drafter"]["settings"]["num_draft_tokens"] == 2
    assert len(record["reference"]["samples"]) == len(record["speculative"]["samples"]) == 2
    # One cycle per repeat: baseline first, then candidate and reference, alternating order.
    assert record["order"]["order"] == [
        "baseline",
        "speculative",
        "reference",
        "baseline",
        "reference",
        "speculative",
    ]
    assert record["order"]["interleaved"] is True


def test_a_reference_equal_to_the_candidate_is_a_collection_error(pytester: pytest.Pytester):
    pytester.makepyfile("""
import pytest

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.reference_drafter("ngram")
@pytest.mark.batch(1)
def test_same(spec_pair):
    pass
""")
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*marker reference_drafter*is the candidate drafter itself*"])


def test_a_reference_that_drafts_nothing_against_a_drafting_candidate_is_a_collection_error(
    pytester: pytest.Pytester,
):
    """Such a pair could only end incomparable (one arm has no acceptance to compare), after
    being measured: it is refused before, either way round; an A/A control (both arms
    non-speculative) is not."""
    head = (
        "import pytest\nfrom pytest_specenergy import Drafter\n\n"
        '@pytest.mark.model("tiny:dense")\n@pytest.mark.corpus("code")\n@pytest.mark.batch(1)\n'
    )
    pytester.makepyfile(
        # one module each: a module stops collecting at its first refused test
        against_none=head
        + '@pytest.mark.drafter("ngram")\n@pytest.mark.reference_drafter("none")\n'
        "def test_it(spec_pair):\n    pass\n",
        none_against=head
        + '@pytest.mark.drafter("none")\n@pytest.mark.reference_drafter("ngram")\n'
        "def test_it(spec_pair):\n    pass\n",
        aa_control=head + '@pytest.mark.drafter("none")\n'
        '@pytest.mark.reference_drafter(Drafter("none", id="none-ref"))\n'
        "def test_it(spec_pair):\n    pass\n",
    )
    result = pytester.runpytest(
        "--collect-only",
        "-p",
        "no:cacheprovider",
        "against_none.py",
        "none_against.py",
        "aa_control.py",
    )
    text = result.stdout.str()
    assert text.count("one drafts and the other does not") == 2, text
    assert "against_none.py::test_it: marker" in text and "none_against.py::test_it: marker" in text
    assert (
        "aa_control.py::test_it: marker" not in text
        and "<Function test_it[code-none-vs-none-ref-b1]>" in text
    ), text


def test_a_costlier_candidate_fails_in_job_against_its_reference(
    pytester: pytest.Pytester, run_suite
):
    """The A/B gate on the real server: a candidate drafting 1 token where the reference drafts
    8 costs more energy per token on code; judged against the reference in the same session."""
    pytester.makepyfile(
        AB_SUITE.replace(
            'Drafter("ngram", num_draft_tokens=8, id="ngram-k8")',
            'Drafter("ngram", num_draft_tokens=1, id="ngram-k1")',
        ).replace(
            'Drafter("ngram", num_draft_tokens=2, id="ngram-k2")',
            'Drafter("ngram", num_draft_tokens=8, id="ngram-k8")',
        )
    )
    worse = run_suite("--specenergy-compare-fail=energy:5%", repeats=3)
    worse.assert_outcomes(failed=1)
    worse.stdout.fnmatch_lines(["*energy_ratio*REGRESSED*"])
