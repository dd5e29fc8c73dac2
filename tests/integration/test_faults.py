"""Each check catches the bug class it exists for: the reference server's fault switches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specenergy.cases.corpora.loader import BUILTIN_CORPORA

QUICKSTART = (
    Path(__file__).resolve().parents[2] / "example_suites" / "quickstart" / "test_quickstart.py"
)


def _small_quickstart() -> str:
    """The quickstart with its hybrid test's pool and batches halved (the suite's time budget)."""
    text = QUICKSTART.read_text()
    hybrid = '@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=8))'
    small = text.replace(
        f"@pytest.mark.generation(max_new_tokens=32, prompts=8)\n{hybrid}\n@pytest.mark.batch(1, "
        "4)",
        f"@pytest.mark.generation(max_new_tokens=32, prompts=4)\n{hybrid}\n@pytest.mark.batch(1, "
        "2)",
    )
    assert small != text, "the quickstart's hybrid markers changed: update _small_quickstart"
    return small


def test_quickstart_hybrid_check_passes_healthy_and_fails_without_state_rollback(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(test_quickstart=_small_quickstart())
    healthy = run_suite("-k", "hybrid", repeats=1)
    healthy.assert_outcomes(passed=2)

    faulted = run_suite("-k", "hybrid", "--specenergy-fault=skip-state-rollback", repeats=1)
    faulted.assert_outcomes(failed=2)
    # Either of assert_coherent's two detectors may name it: the mean log-probability gap
    # ("incoherent: ... log-probability gap") or the per-token one ("not the target's greedy
    # text: ... ranks ... below its best"); since the hybrid accepts drafts (issue 22 item 9)
    # the skipped rollback's text is often no less likely on average, so the per-token one fires.
    faulted.stdout.fnmatch_lines(
        [
            "*SpecEnergyAssertionError: speculative output is *first divergence at token * of "
            "prompt *"
        ]
    )


CORPORA_SUITE = """
import pytest

@pytest.mark.model("tiny:hybrid")
@pytest.mark.corpus("code", "conversation", "long-document", "news", "rm-news")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(2)
@pytest.mark.generation(max_new_tokens=24, prompts=4)
def test_coherent(spec_pair):
    r = spec_pair.measure()
    # Acceptance statistics alone never show the bug: they look normal in both runs.
    assert r.accept_length is not None
    r.assert_coherent()
"""


def test_coherence_defaults_hold_on_every_corpus(pytester: pytest.Pytester, run_suite):
    """The default coherence limits pass the healthy hybrid and fail it without its state
    rollback, on every corpus; both in one session, sharing the baseline arms."""
    faulted = CORPORA_SUITE.replace(
        '"tiny:hybrid"', '"tiny:hybrid", faults="skip-state-rollback"'
    ).replace("def test_coherent(", "def test_without_rollback(")
    pytester.makepyfile(CORPORA_SUITE + "\n" + faulted.split("import pytest\n", 1)[1])
    result = run_suite(repeats=1)
    result.assert_outcomes(passed=5, failed=5)
    passed = {
        test.split("[")[0] for test, outcome in call_outcomes(result).items() if outcome == "passed"
    }
    assert passed == {"test_coherent"}, passed


def call_outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Each inner test's call outcome, by its name with parameters
    (``test_healthy[code-ngram-b2]``)."""
    return {
        r.nodeid.split("::")[-1]: r.outcome
        for r in result.reprec.getreports("pytest_runtest_logreport")
        if r.when == "call"
    }


HYBRID_STATE_SUITE = """
import pytest

from pytest_specenergy.cases.corpora.loader import BUILTIN_CORPORA as CORPORA


# The hybrid case on every corpus; ``faults`` make its speculative engine's copy (one shared baseline).
def hybrid(*faults):
    marks = [pytest.mark.model("tiny:hybrid", faults=faults), pytest.mark.corpus(*CORPORA),
             pytest.mark.drafter("ngram"), pytest.mark.batch(2),
             # Answers run past EOS: a partial accept late in a short answer has nothing left to spoil.
             pytest.mark.generation(max_new_tokens=64, prompts=8, ignore_eos=True)]
    def mark(test):
        for one in marks:
            test = one(test)
        return test
    return mark


def check(spec_pair):
    r = spec_pair.measure()
    # Acceptance statistics alone never show these bugs: they look normal healthy and faulted.
    assert r.accept_length is not None
    r.assert_coherent()
    # CPU float32: the arms' logits differ by at most ~1e-5 nats, and the default tie margin is
    # the engine's own (float32: 2**-13), so a divergence at a wider margin is no numerical tie.
    r.assert_equivalent()


@hybrid()
def test_healthy(spec_pair):
    check(spec_pair)


@hybrid("partial-accept-state")
def test_partial_accept_state(spec_pair):
    check(spec_pair)


@hybrid("stale-state-after-empty-draft")
def test_stale_state_after_empty_draft(spec_pair):
    check(spec_pair)
"""


def test_hybrid_state_faults_are_caught_on_every_corpus_the_healthy_hybrid_passes(
    pytester: pytest.Pytester, run_suite
):
    """Two hybrid state bugs, each beside the healthy hybrid in one session (the speculative-only
    faults leave the baseline twin alone, so the three cases of a corpus share one baseline arm):

    * ``partial-accept-state`` (issue 22 item 9) keeps a partly accepted step's rejected drafts in
      the recurrent state; all-or-none steps are right. Healthy, every corpus passes with drafts
      accepted (accept length > 1.3, so not vacuously); faulted, every corpus fails.
    * ``stale-state-after-empty-draft``, the hybrid bug as it was really found (vLLM #39273; fixed
      in vLLM PR #52942, SGLang PR #26351): a verify step with no drafts, right after one that
      accepted some, reads stale recurrent state. It fails on every corpus, and the JSON says at
      which token each corpus first diverges. On a tiny random model the log-probability gap alone
      flags only some corpora (measured: code, long-document, rm-news flagged, conversation and
      news not), so the divergence itself is what fails there.

    Counters stay consistent under both. Longer answers run past EOS: the stale-state bug needs a
    step that accepted drafts followed by one with none, and the tiny hybrid's n-gram drafts are
    accepted mostly once its text repeats. Eight prompts: with the hybrid's longer-memory state
    (issue 22 item 9) the first four of the code corpus run 64 tokens without a divergence;
    prompts 5 and 6 diverge at 25 and 49."""
    pytester.makepyfile(HYBRID_STATE_SUITE)
    out = pytester.path / "run.json"
    result = run_suite(f"--specenergy-json={out}", repeats=1)
    outcomes = call_outcomes(result)
    corpora = BUILTIN_CORPORA  # the suite's CORPORA, by import
    for test, outcome in (
        ("test_healthy", "passed"),
        ("test_partial_accept_state", "failed"),
        ("test_stale_state_after_empty_draft", "failed"),
    ):
        assert {c: outcomes.get(f"{test}[{c}-ngram-b2]") for c in corpora} == dict.fromkeys(
            corpora, outcome
        ), outcomes
    result.stdout.fnmatch_lines(["*4 engine starts*"])  # one baseline and three speculative engines
    records: dict[str, dict[str, dict]] = {}
    for record in json.loads(out.read_text())["results"]:
        test = record["nodeid"].split("::")[-1].split("[")[0]
        records.setdefault(test, {})[record["case"]["corpus"]["name"]] = record
    assert all("baseline" in r["order"]["order"] for r in records["test_healthy"].values())
    accept = {c: r["accept_length"] for c, r in records["test_healthy"].items()}
    # drafts accepted on every corpus: not vacuous
    assert all(a > 1.3 for a in accept.values()), accept
    for test in ("test_partial_accept_state", "test_stale_state_after_empty_draft"):
        for record in records[test].values():
            # the counters never show it
            assert not [c for c in record["checks"] if c["name"] == "counters-inconsistent"]
            # measured in the healthy case's cycles, paired with the one baseline arm (old: run
            # alone after it, the order holding no baseline repeat, baseline_from set)
            order = record["order"]
            assert order["order"] == ["baseline", "speculative"], order
            assert not order.get("baseline_from") and len(order["cycled_with"]) == 2, order
    stale = records["test_stale_state_after_empty_draft"]
    first = {
        corpus: min(d for d in r["equivalence"]["first_divergence"] if d is not None)
        for corpus, r in stale.items()
        if any(d is not None for d in r["equivalence"]["first_divergence"])
    }
    assert set(first) == set(corpora), first
    print("healthy accept length per corpus:", accept)
    print(
        "stale state, first divergence and mean gap:",
        {
            corpus: (token, round(stale[corpus]["coherence"]["mean_gap"], 3))
            for corpus, token in first.items()
        },
    )


def test_inflated_accept_count_fails_closed_even_without_an_assertion(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile("""
import pytest

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(2)
@pytest.mark.generation(max_new_tokens=32, prompts=4)
def test_no_assertions(spec_pair):
    spec_pair.measure()
""")
    faulted = run_suite("--specenergy-fault=wrong-accept-count", repeats=1)
    faulted.assert_outcomes(failed=1)
    faulted.stdout.fnmatch_lines(
        ["*validity checks failed: counters-inconsistent: request *accepted drafts*"]
    )
    warned = run_suite(
        "--specenergy-fault=wrong-accept-count", "--specenergy-checks=warn", repeats=1
    )
    warned.assert_outcomes(passed=1, warnings=1)


DRAFT_SUITE = """
import pytest
from pytest_specenergy import Drafter

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter(Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=4, id="draft"))
@pytest.mark.batch(2)
@pytest.mark.generation(max_new_tokens=32, prompts=4)
def test_draft(spec_pair):
    spec_pair.measure().assert_equivalent()
"""


def test_off_by_one_acceptance_looks_better_but_equivalence_fails(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(DRAFT_SUITE)
    out = pytester.path / "run.json"
    faulted = run_suite(
        "--specenergy-fault=accept-off-by-one", f"--specenergy-json={out}", repeats=1
    )
    faulted.assert_outcomes(failed=1)
    faulted.stdout.fnmatch_lines(
        ["*outputs differ from the baseline: exact-match fraction * is below the required 1.000"]
    )


def test_stale_draft_cache_shifts_acceptance_the_gate_reports_it(
    pytester: pytest.Pytester, run_suite
):
    # Output stays exact: only the acceptance comparison with main shows this bug. Its shift is
    # carried by a few requests (here 1.07, 2.58, 3.44, 1.41 accepted per step healthy, 2.21, 2.58,
    # 4.43, 1.55 faulted). At batch 2 it varied run to run with which requests shared a step, and
    # the verdict with it (INCONCLUSIVE at the 11-repeat cap once in a full suite run; with 8
    # prompts in one run of three, 16 at batch 4 failed one of eight); at batch 1 each request runs
    # alone and every run reads the same figures (+41.4%, IMPROVED, in each of three).
    pytester.makepyfile(DRAFT_SUITE.replace("batch(2)", "batch(1)"))
    run_suite("--specenergy-save=main", repeats=2).assert_outcomes(passed=1)
    # The default limits all apply (energy among them, which needs 2 stored repeats): energy is
    # set out of reach, so the acceptance comparison alone decides.
    faulted = run_suite(
        "--specenergy-fault=stale-draft-cache",
        "--specenergy-compare=main",
        # A zero limit: any significant shift is reported (4 requests
        # cannot show one beyond a 5% limit with confidence).
        "--specenergy-compare-fail=accept_length:0%",
        "--specenergy-compare-fail=energy:1000%",
        repeats=2,
    )
    faulted.stdout.fnmatch_lines(["*improved*test_draft[[]code-draft-b1[]]*"])


def test_accept_off_by_one_with_a_draft_model_fails_coherence_on_every_corpus(
    pytester: pytest.Pytester, run_suite
):
    """Issue 22 item 4: committing one rejected draft per step leaves a mean gap under 0.25
    (0.16-0.19 nats/token measured) while acceptance looks better than healthy, so the mean gap
    alone passed it. The committed draft is a token the target ranks far below its best: the
    per-token check fails it on every corpus. (Numerical noise passing the same check:
    tests/integration/test_equivalence_ties_e2e.py.)"""
    suite = DRAFT_SUITE.replace(
        '@pytest.mark.corpus("code")',
        '@pytest.mark.corpus("code", "conversation", "long-document", "news", "rm-news")',
    )
    pytester.makepyfile(
        suite.replace("measure().assert_equivalent()", "measure().assert_coherent()")
    )
    out = pytester.path / "run.json"
    faulted = run_suite(
        "--specenergy-fault=accept-off-by-one", f"--specenergy-json={out}", repeats=1
    )
    # Every corpus fails on the per-token check (two also trip concurrency-below-batch: 4 prompts
    # barely keep batch 2 in flight; the body's failure is reported first either way).
    faulted.assert_outcomes(failed=5)
    faulted.stdout.fnmatch_lines(
        [
            "*speculative output is not the target's greedy text: * diverged prompt(s) commit "
            "a token the target ranks more than the tie margin 0.000122 nats below its best*"
        ]
        * 5
    )
    records = json.loads(out.read_text())["results"]
    worst = {
        r["case"]["corpus"]["name"]: (
            round(r["coherence"]["mean_gap"], 3),
            round(max(m["later_gap"] for m in r["coherence"]["margins"] if m), 3),
        )
        for r in records
    }
    print("corpus: (mean gap, worst token gap)", worst)
