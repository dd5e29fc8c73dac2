"""A case measured in the same cycles as an A/A control (``Drafter("none")``) fails when its
exact-match fraction falls below the control's by more than one prompt (issue 40 item 2), and
only then; a case with no control in its cycles gets no such check."""

from __future__ import annotations

import dataclasses

import pytest
from test_pairs import FakeClient
from test_pairs import ScoringClient
from test_pairs import ScoringPool
from test_pairs import TokenMeter
from test_pairs import _case
from test_pairs import _measurer

from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.measure.checks import control_checks
from pytest_specenergy.measure.equivalence import DivergenceMargin
from pytest_specenergy.measure.equivalence import RequestEquivalence

CONTROL, NGRAM, DRAFT = (
    _case(Drafter("none")),
    _case(Drafter("ngram")),
    _case(Drafter("draft_model", draft_model="tiny:dense-draft")),
)
FIRST_PROMPT = NGRAM.pool()[0]


class DivergingClient(ScoringClient):
    """Scores like :class:`ScoringClient`; a generation's last token is changed on the prompts
    ``diverges`` picks (by text), a real divergence (not between the scorer's top two)."""

    diverges: frozenset[str] | None = frozenset()  # None: every prompt

    def generate(self, input_ids=None, *, text=None, sampling_params, rids=None, **scoring):
        if not sampling_params["max_new_tokens"]:
            return super().generate(
                input_ids, text=text, sampling_params=sampling_params, rids=rids, **scoring
            )
        answers = FakeClient.generate(self, text, sampling_params, rids)
        for prompt, answer in zip(text, answers):
            if self.diverges is None or prompt in self.diverges:
                answer["output_ids"][-1] += 1
        return answers


def _pool(diverging: dict[str, frozenset[str] | None]) -> ScoringPool:
    """A fake pool whose drafting engines diverge on the prompts ``diverging`` names per drafter
    (the baseline never does)."""

    class Pool(ScoringPool):
        def server(self, config):
            server = super().server(config)
            client = DivergingClient(server.client.speculative, self.log)
            name = config.drafter.name if config.drafter is not None else None
            client.diverges = diverging.get(name, frozenset())
            server.client = client
            return server

    return Pool()


def _flagged(pair) -> list[str]:
    return [c.message for c in pair.failed_checks if c.name == "exact-below-control"]


@pytest.mark.parametrize(
    ("ngram", "control", "trips"),
    [
        (None, frozenset(), True),  # every prompt diverged, the control's none
        (frozenset(), frozenset(), False),  # equal: both exact
        (None, None, False),  # equal: the control diverged on every prompt too
        (frozenset({FIRST_PROMPT}), frozenset(), False),  # one prompt below: within the slack
    ],
)
def test_a_case_below_its_controls_exact_fraction_fails(ngram, control, trips):
    measurer = _measurer(_pool({"ngram": ngram, "none": control}), TokenMeter(1.0))
    measurer.plan([NGRAM, CONTROL, DRAFT])
    pair = measurer.measure(NGRAM)
    controlled = measurer.measure(CONTROL)
    # Measured in one group's cycles, on the same prompts.
    assert set(pair.order.cycled_with) == {CONTROL.id, DRAFT.id}
    assert pair.baseline.prompts == controlled.baseline.prompts
    n = len(pair.equivalence.requests)
    real = {None: n, frozenset(): 0}.get(ngram, 1)
    assert len(pair.equivalence.real_divergences) == real
    flagged = _flagged(pair)
    assert bool(flagged) == trips
    if trips:
        [message] = flagged
        assert f"exact-match fraction 0.000 (0 of {n} prompts" in message
        assert f"A/A control {CONTROL.id}'s 1.000 ({n} of {n})" in message
    # The control is never checked against itself, nor a drafter whose outputs match it.
    assert _flagged(controlled) == [] and _flagged(measurer.measure(DRAFT)) == []


def test_added_repeats_check_the_grown_pairs_against_the_grown_control():
    measurer = _measurer(_pool({"ngram": None}), TokenMeter(1.0))
    measurer.plan([NGRAM, CONTROL])
    assert _flagged(measurer.measure(NGRAM))
    grown = measurer.add_repeats(NGRAM, 1)
    assert len(grown.speculative.samples) == 3
    assert len(_flagged(grown)) == 1  # checked once again, not once per measurement


def test_a_case_with_no_control_in_its_cycles_gets_no_such_check():
    """No control planned, no check; a control measured in other cycles (here: the case was not
    planned, so it is measured alone against the baseline measured ahead) is no control of it."""
    measurer = _measurer(_pool({"ngram": None}), TokenMeter(1.0))
    measurer.plan([NGRAM, DRAFT])
    assert _flagged(measurer.measure(NGRAM)) == []
    lone = _measurer(_pool({"ngram": None}), TokenMeter(1.0))
    lone.plan([CONTROL])
    lone.measure(CONTROL)
    assert lone.measure(NGRAM).order.cycled_with == ()
    assert _flagged(lone.measure(NGRAM)) == []


def _with_divergences(pair, kinds: dict[int, float]):
    """``pair`` whose comparison diverges on the prompts ``kinds`` maps to the baseline's top-2
    margin there (between its two best tokens, the text after it greedy): under the engine's noise
    margin a numerical tie, above it a real divergence."""
    margin = DivergenceMargin(0.0, (1, 2), between_top2=True, later_gap=0.0)
    requests = tuple(
        RequestEquivalence(
            r.prompt_index,
            r.baseline_tokens,
            r.speculative_tokens,
            None if r.prompt_index not in kinds else 3,
            None
            if r.prompt_index not in kinds
            else dataclasses.replace(margin, margin=kinds[r.prompt_index]),
        )
        for r in pair.equivalence.requests
    )
    changed = dataclasses.replace(pair)
    # The comparison is a cached property of the frozen pair: set as its first reading would.
    changed.__dict__["equivalence"] = dataclasses.replace(pair.equivalence, requests=requests)
    return changed


def test_numerical_ties_count_as_matches_on_both_sides():
    """The control's arms run the same step shapes, so it never shows the rounding a verify step's
    shape brings: three ties (under the engine's noise margin) are no evidence against the case,
    while three real divergences (the same positions, a margin no rounding flips) are."""
    measurer = _measurer(_pool({}), TokenMeter(1.0))
    measurer.plan([NGRAM, CONTROL])
    pair, control = measurer.measure(NGRAM), measurer.measure(CONTROL)
    noise = pair.noise_margin.margin
    tied = _with_divergences(pair, {0: noise / 2, 1: noise / 2, 2: noise / 2})
    assert tied.equivalence.exact_fraction < 1.0 and len(tied.equivalence.ties) == 3
    assert control_checks(tied, control) == []
    real = _with_divergences(pair, {0: 2.0, 1: 2.0, 2: 2.0})
    [check] = control_checks(real, control)
    n = len(pair.equivalence.requests)
    assert check.name == "exact-below-control" and f"({n - 3} of {n} prompts" in check.message
    # The control's own real divergences are what a case is allowed, and one prompt more.
    assert control_checks(real, _with_divergences(control, {5: 2.0, 6: 2.0})) == []
