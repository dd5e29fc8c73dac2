"""The reference server's fault set against the built-in real model (smollm2-135m, chat-templated
prompts): every fault that changes the output is caught by the assertions a user writes
(``assert_equivalent``, ``assert_coherent``) on the corpus where it shows, and every fault that
leaves the output alone passes them (a counter or drafter fault is then failed by the plugin's own
validity check, after the test body).

One inner session measures every fault's case (one pytester run: the speculative-only faults
share one baseline arm per corpus, and the engines start side by side), and each fault class has
its own test here reading its verdicts. Each fault case is judged by two inner tests, one per
assertion, on one cached measurement, so each assertion's verdict is seen alone.

Cost: 68-120 s on the loaded 2-core machine, most of it the inner session (7 engine starts of
smollm2-135m at 6-13 s each, side by side; 2 prompts x 16 tokens at batch 1, 2-12 s an arm).
Nothing is skipped: without the model in the cache (``dev/setup.sh --test`` fetches it) the first
engine start fetches it (about 100 s), or fails saying why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from conftest import fast_options

#: Under xdist, this module's tests go to one worker (tests/conftest.py): they share one session.
ONE_WORKER = True

SUITE = """
import pytest
from pytest_specenergy import Drafter

NGRAM = Drafter("ngram", num_draft_tokens=4)
# The only draft model this model can have here: its own first 20 of 30 layers (a draft KV cache
# that the stale-draft-cache fault leaves uncropped).
EARLY_EXIT = Drafter("draft_model", draft_model="early-exit:20", num_draft_tokens=3, id="ee20")


def case(corpora, *faults, drafter=NGRAM):
    marks = [pytest.mark.model("smollm2-135m", faults=faults), pytest.mark.corpus(*corpora),
             pytest.mark.drafter(drafter), pytest.mark.batch(1),
             pytest.mark.generation(chat=True, max_new_tokens=16, prompts=2)]
    def mark(test):
        for one in marks:
            test = one(test)
        return test
    return mark


def equivalent():
    def test(spec_pair):
        spec_pair.measure().assert_equivalent()
    return test


def coherent():
    def test(spec_pair):
        spec_pair.measure().assert_coherent()
    return test


def both(name, *args, **kwargs):
    globals()[f"test_{name}_equivalent"] = case(*args, **kwargs)(equivalent())
    globals()[f"test_{name}_coherent"] = case(*args, **kwargs)(coherent())


both("off_by_one", ("code", "conversation"), "accept-off-by-one")
# The faults that leave the output alone on this model, in one engine (each start costs seconds):
# the draft model's stale cache, and the hybrid state faults, which a dense model cannot show.
both("inert", ("code",), "stale-draft-cache", "skip-state-rollback", "partial-accept-state",
     "stale-state-after-empty-draft", drafter=EARLY_EXIT)
both("noise", ("news",), "numerical-noise")
both("wrong_count", ("code",), "wrong-accept-count")
both("dead", ("code",), "dead-drafter")
"""

#: The inner session, run once for the module (each test below needs all of it or one fault's
#: part; one run shares the baseline arms and the engine starts among them).
_session: dict[str, Any] = {}


@pytest.fixture
def faulted(pytester: pytest.Pytester) -> dict[str, Any]:
    """The inner session's call outcomes by inner test id, its JSON records by the same ids, and
    its output text."""
    if not _session:
        pytester.makepyfile(test_real_model_faults_suite=SUITE)
        out, junit = pytester.path / "run.json", pytester.path / "junit.xml"
        # A subprocess, not the in-process run: back to back on the loaded 2-core machine the
        # same session took 98 s in-process and 68 s as a subprocess.
        result = pytester.runpytest_subprocess(
            *fast_options(), f"--specenergy-json={out}", f"--junitxml={junit}"
        )
        _session.update(
            outcomes=junit_outcomes(junit),
            records={
                r["nodeid"].split("::")[-1]: r for r in json.loads(out.read_text())["results"]
            },
            stdout=result.stdout.str(),
        )
        print("inner session:", result.stdout.lines[-1], f"(pytester: {result.duration:.1f} s)")
    return _session


def junit_outcomes(path: Path) -> dict[str, str]:
    """Each inner test's outcome (``passed`` or ``failed``; ``error`` for a setup or teardown
    error), by its name with parameters, from a JUnit XML report."""
    outcomes = {}
    for case in ElementTree.parse(path).iter("testcase"):
        failed = case.find("failure") is not None
        errored = case.find("error") is not None
        outcomes[case.get("name")] = "error" if errored else "failed" if failed else "passed"
    return outcomes


def _verdicts(session: dict[str, Any], name: str, case_id: str) -> dict[str, str]:
    """Both assertions' outcomes for one fault case."""
    return {
        check: session["outcomes"].get(f"test_{name}_{check}[{case_id}]")
        for check in ("equivalent", "coherent")
    }


def _failure(session: dict[str, Any], name: str, check: str, case_id: str) -> str:
    """The inner test's failure text (its section of the output)."""
    text = session["stdout"]
    head = f"_ test_{name}_{check}[{case_id}] _"
    assert head in text, f"no failure section for {name} {check} [{case_id}]"
    return text.split(head, 1)[1].split("\n_", 1)[0]


#: The headlines of assert_equivalent's and assert_coherent's own failures.
BODY_FAILURES = (
    "outputs differ from the baseline",
    "outputs diverge from the baseline",
    "speculative output is incoherent",
    "speculative output is not the target's greedy text",
    "speculative output is degenerate",
)


def _body_failed(text: str) -> bool:
    """Whether a failure section holds a failure of the test body's own assertion (and not only
    the plugin's validity gate after it)."""
    return any(headline in text for headline in BODY_FAILURES)


def test_accepting_a_rejected_draft_is_caught_by_both_assertions_on_code_and_conversation(
    faulted,
):
    """``accept-off-by-one`` commits the first mismatching draft of a step: a token the target did
    not choose. n-gram drafts on both corpora, so it shows on both: ``assert_equivalent`` fails it
    as a real divergence (not a tie), ``assert_coherent`` as text the target ranks below its best
    or scores lower on average. Acceptance looks better than healthy, which no check can know."""
    for corpus in ("code", "conversation"):
        case_id = f"{corpus}-chat-ngram-k4-b1"
        assert _verdicts(faulted, "off_by_one", case_id) == {
            "equivalent": "failed",
            "coherent": "failed",
        }, faulted["outcomes"]
        eq = _failure(faulted, "off_by_one", "equivalent", case_id)
        assert "outputs differ from the baseline" in eq and "real divergence(s)" in eq, eq
        co = _failure(faulted, "off_by_one", "coherent", case_id)
        assert (
            "speculative output is incoherent" in co
            or "speculative output is not the target's greedy text" in co
        ), co
        record = faulted["records"][f"test_off_by_one_equivalent[{case_id}]"]
        assert record["equivalence"]["real_divergences"] >= 1 and record["accept_length"] > 1.0
        # the counters stay consistent: only the text shows the bug
        assert not [c for c in record["checks"] if c["name"] == "counters-inconsistent"]


def test_hybrid_state_faults_cannot_show_on_a_dense_model_and_pass(faulted):
    """``skip-state-rollback``, ``partial-accept-state`` and ``stale-state-after-empty-draft`` act
    on the recurrent (linear-attention) state of a hybrid model; smollm2-135m is a LLaMA, all full
    attention, with no such state to roll back, so the engine has nothing to get wrong: both
    assertions pass on code, with drafts accepted and rejected. They share an engine with
    ``stale-draft-cache`` (the test below), whose draft model accepts some of its drafts. (They are
    caught on ``tiny:hybrid`` in tests/integration/test_faults.py; no trained hybrid model can be
    had here.)"""
    faults = _inert(faulted)
    assert {"skip-state-rollback", "partial-accept-state", "stale-state-after-empty-draft"} <= set(
        faults
    ), faults


def _inert(session: dict[str, Any]) -> list[str]:
    """The case of the faults that leave this model's output alone: both assertions pass, the
    output is exact, no check tripped, and drafts were accepted and rejected (the faults' code
    paths ran: not vacuous); returns the faults its case ran with."""
    case_id = "code-chat-ee20-b1"
    assert _verdicts(session, "inert", case_id) == {
        "equivalent": "passed",
        "coherent": "passed",
    }, session["outcomes"]
    record = session["records"][f"test_inert_equivalent[{case_id}]"]
    assert record["equivalence"]["exact_fraction"] == 1.0 and record["checks"] == []
    drafts = record["case"]["drafter"]["settings"]["num_draft_tokens"]
    assert 1.0 < record["accept_length"] < 1.0 + drafts, record["accept_length"]
    return record["case"]["faults"]


def test_numerical_noise_passes_both_assertions(faulted):
    """``numerical-noise`` perturbs the target's logits in their last bits (a bf16 ulp) in both arms,
    differently per step shape: it can move a greedy token only where the target's two best nearly
    tie, and such a divergence is a numerical tie, not a bug. Both assertions pass, judged against
    the noise the engine states (its emulated rounding, not the float32 floor)."""
    case_id = "news-chat-ngram-k4-b1"
    assert _verdicts(faulted, "noise", case_id) == {
        "equivalent": "passed",
        "coherent": "passed",
    }, faulted["outcomes"]
    equivalence = faulted["records"][f"test_noise_equivalent[{case_id}]"]["equivalence"]
    # the fault was on: the tie margin is the engine's stated emulated rounding
    assert equivalence["tie_margin_source"].startswith("the engine's emulated logit rounding")
    assert equivalence["real_divergences"] == 0
    # Whether the noise moved any greedy token on these few tokens is the model's business (a
    # trained model's top two rarely tie within a bf16 ulp); said, not required.
    print(f"numerical noise on news: {equivalence['ties']} tie(s), all classified")


def test_inflated_accept_count_leaves_the_output_exact_and_fails_closed(faulted):
    """``wrong-accept-count`` counts the bonus token as an accepted draft: the output is right, so
    both assertions hold in the body, and the plugin's counter check fails the case after it."""
    case_id = "code-chat-ngram-k4-b1"
    assert _verdicts(faulted, "wrong_count", case_id) == {
        "equivalent": "failed",
        "coherent": "failed",
    }, faulted["outcomes"]
    for check in ("equivalent", "coherent"):
        text = _failure(faulted, "wrong_count", check, case_id)
        assert "validity checks failed: counters-inconsistent" in text, text
        assert not _body_failed(text), text
    record = faulted["records"][f"test_wrong_count_equivalent[{case_id}]"]
    assert record["equivalence"]["exact_fraction"] == 1.0
    assert {c["name"] for c in record["checks"] if c["severity"] == "fail"} == {
        "counters-inconsistent"
    }


def test_a_dead_drafter_leaves_the_output_exact_and_fails_closed(faulted):
    """``dead-drafter`` rejects every draft: each step commits the target's own token, so the output
    is exact and both assertions hold; the plugin's dead-drafter check fails the case."""
    case_id = "code-chat-ngram-k4-b1"
    assert _verdicts(faulted, "dead", case_id) == {
        "equivalent": "failed",
        "coherent": "failed",
    }, faulted["outcomes"]
    for check in ("equivalent", "coherent"):
        text = _failure(faulted, "dead", check, case_id)
        assert "validity checks failed:" in text and "dead-drafter" in text, text
        assert not _body_failed(text), text
    record = faulted["records"][f"test_dead_equivalent[{case_id}]"]
    assert record["equivalence"]["exact_fraction"] == 1.0 and record["accept_length"] == 1.0


def test_a_stale_draft_cache_leaves_the_output_exact_and_passes(faulted):
    """``stale-draft-cache`` leaves rejected tokens in the draft model's KV cache: later drafts are
    worse (or, on repetitive text, better), but the target verifies every one, so the output stays
    exact and both assertions pass. Only acceptance shifts, which the gate's comparison with a
    stored run reports (tests/integration/test_faults.py shows that on a tiny draft model; here it
    would need repeats of a draft model that costs 2/3 of a target pass per draft)."""
    assert "stale-draft-cache" in _inert(faulted)
