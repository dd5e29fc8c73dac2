"""The gate's ``equivalence`` limit counts real divergences only; numerical ties are reported beside
it.

Records are real ``PairResult`` records whose divergences carry the baseline's top-2 margins, as the
plugin measures them: a tie-only run passes the default ``equivalence:0`` limit against a stored run
and in-job, a real divergence fails it, and a file without ``matched_fraction`` (written before ties
were classified) is read by its exact fraction.
"""

from __future__ import annotations

import pytest

from pytest_specenergy.cases.case import Case
from pytest_specenergy.cases.corpora import load_corpus
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RepeatSample
from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.gate.compare import Verdict
from pytest_specenergy.gate.compare import compare_case
from pytest_specenergy.gate.compare import compare_in_job
from pytest_specenergy.gate.limits import merge_limits
from pytest_specenergy.gate.limits import parse_fail_expr
from pytest_specenergy.gate.settings import DEFAULT_LIMITS
from pytest_specenergy.measure.coherence import Coherence
from pytest_specenergy.measure.degeneracy import degeneracy
from pytest_specenergy.measure.equivalence import DivergenceMargin
from pytest_specenergy.measure.results import PairResult
from pytest_specenergy.measure.results import RunResult


def parse_fail_exprs(texts):
    """Limits from expressions, a later one for the same metric and statistic winning."""
    return merge_limits([parse_fail_expr(t) for t in texts])


CASE = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram"),
    batch=2,
    corpus=load_corpus("code"),
)
AB = Case.of(
    engine="reference",
    model="tiny:dense",
    drafter=Drafter("ngram", num_draft_tokens=8, id="k8"),
    batch=2,
    corpus=load_corpus("code"),
    reference=Drafter("ngram", num_draft_tokens=2, id="k2"),
)
BASE = (
    (1, 2, 3, 4, 5, 6),
    (7, 8, 9, 10, 11, 12),
    (13, 14, 15, 16, 17, 18),
    (19, 20, 21, 22, 23, 24),
)
TIED = (BASE[0], (7, 8, 90, 10, 11, 12), BASE[2], (19, 20, 21, 22, 23, 99))  # two ties
WRONG = (BASE[0], (7, 8, 90, 10, 11, 12), BASE[2], BASE[3])  # one real divergence
TIE = DivergenceMargin(0.01, (9, 90), True, 0.02, 3)
TIE_LATE = DivergenceMargin(0.03, (24, 99), True, 0.0, None)
REAL = DivergenceMargin(1.7, (9, 90), True, 0.0, None)
EQUIVALENCE = parse_fail_exprs(["equivalence:0"])


def arm(name: str, outputs, n: int = 3) -> RunResult:
    spec = name != "baseline"
    sample = RepeatSample(
        1.0 if spec else 2.0,
        1.0,
        10,
        5.0,
        4 if spec else None,
        6 if spec else None,
        32 if spec else None,
    )
    return RunResult.measured(
        arm=name,
        engine={"engine": "reference", "version": "0.1.0"},
        source="modeled (h200)",
        samples=(sample,) * n,
        outputs=tuple(outputs),
        finish_reasons=("length",) * len(outputs),
        verified_per_step=9 if spec else 1,
    )


def coherence(outputs, margins) -> Coherence:
    diverged = tuple(o != b for o, b in zip(outputs, BASE))
    return Coherence((0.0,) * 4, (0.0,) * 4, degeneracy(BASE, outputs), diverged, tuple(margins))


def stored(outputs=BASE, margins=(None,) * 4) -> CaseRecord:
    pair = PairResult(
        CASE,
        CASE.id,
        arm("baseline", BASE),
        arm("speculative", outputs),
        coherence(outputs, margins),
    )
    return CaseRecord.from_dict(pair.as_dict())


def in_job(candidate, candidate_margins, reference, reference_margins) -> CaseRecord:
    pair = PairResult(
        AB,
        AB.id,
        arm("baseline", BASE),
        arm("speculative", candidate),
        coherence(candidate, candidate_margins),
        reference=arm("reference", reference),
        reference_coherence=coherence(reference, reference_margins),
    )
    return CaseRecord.from_dict(pair.as_dict())


def equivalence_row(comparison):
    return next(r for r in comparison.rows if r.metric == "equivalence")


def test_a_tie_only_run_passes_the_default_gate_against_a_stored_run_with_the_ties_beside_it():
    tied = stored(TIED, (None, TIE, None, TIE_LATE))
    assert tied.exact_fraction == 0.5 and tied.matched_fraction == 1.0 and tied.ties == 2
    comparison = compare_case(stored(), tied, parse_fail_exprs(list(DEFAULT_LIMITS)))
    row = equivalence_row(comparison)
    assert row.verdict is Verdict.PASSED and comparison.verdict is Verdict.PASSED
    assert row.ties == (0, 2) and row.as_dict()["ties"] == [0, 2]
    assert "numerical ties counted as matches: baseline 0, current 2" in row.describe()


def test_a_real_divergence_still_regresses_against_a_stored_run():
    comparison = compare_case(stored(), stored(WRONG, (None, REAL, None, None)), EQUIVALENCE)
    row = equivalence_row(comparison)
    assert row.verdict is Verdict.REGRESSED and row.current == pytest.approx(0.75)
    assert "real divergences only" in row.describe()


def test_an_unmeasured_margin_is_real_fail_closed():
    assert compare_case(stored(), stored(TIED), EQUIVALENCE).verdict is Verdict.REGRESSED


def test_a_file_without_matched_fraction_is_read_by_its_exact_fraction():
    old = stored(TIED, (None, TIE, None, TIE_LATE)).as_dict()
    for key in ("matched_fraction", "ties", "real_divergences"):
        del old["equivalence"][key]
    record = CaseRecord.from_dict(old)
    assert record.matched_fraction == 0.5 and record.ties == 0
    assert compare_case(stored(), record, EQUIVALENCE).verdict is Verdict.REGRESSED


def test_in_job_ties_on_either_side_match_and_a_real_divergence_regresses():
    ties = (None, TIE, None, TIE_LATE)
    one_tie = in_job(TIED, ties, BASE, (None,) * 4)
    assert equivalence_row(compare_in_job(one_tie, EQUIVALENCE)).verdict is Verdict.PASSED
    # The reference's own ties are classified too, so a tied reference is no better than an exact
    # candidate.
    tied_reference = in_job(BASE, (None,) * 4, TIED, ties)
    assert tied_reference.reference_matched_fraction == 1.0 and tied_reference.reference_ties == 2
    row = equivalence_row(compare_in_job(tied_reference, EQUIVALENCE))
    assert row.verdict is Verdict.PASSED and row.ties == (2, 0)
    assert "numerical ties counted as matches: reference 2, current 0" in row.note
    wrong = in_job(WRONG, (None, REAL, None, None), TIED, ties)
    assert equivalence_row(compare_in_job(wrong, EQUIVALENCE)).verdict is Verdict.REGRESSED


def test_in_job_a_single_tie_of_the_candidate_passes():
    """Without the reference arm's scoring (it agrees with the baseline): the candidate's tie
    matches."""
    pair = PairResult(
        AB,
        AB.id,
        arm("baseline", BASE),
        arm("speculative", TIED),
        coherence(TIED, (None, TIE, None, TIE_LATE)),
        reference=arm("reference", BASE),
    )
    record = CaseRecord.from_dict(pair.as_dict())
    assert record.as_dict()["equivalence"]["matched_fraction"] == 1.0
    assert compare_in_job(record, EQUIVALENCE).verdict is Verdict.PASSED
