"""Drafter declarations: validation, defaults, stable ids."""

from __future__ import annotations

import pytest

from pytest_specenergy.engines.drafters import Drafter
from pytest_specenergy.engines.drafters import DrafterError


def test_defaults_and_equality():
    a = Drafter("ngram")
    assert a == Drafter("NGRAM", num_draft_tokens=8)
    assert hash(a) == hash(Drafter("ngram"))
    assert a.id == "ngram"
    assert a.num_draft_tokens == 8


def test_default_id_names_changed_settings_and_checkpoint():
    assert Drafter("ngram", num_draft_tokens=4).id == "ngram-k4"
    assert Drafter("draft_model", draft_model="tiny:dense-draft").id == "draft_model-dense-draft"
    assert Drafter("eagle3", draft_model="/models/qwen3-8b-eagle3/").id == "eagle3-qwen3-8b-eagle3"


def test_explicit_id_survives_a_settings_change():
    old = Drafter("ngram", num_draft_tokens=8, id="ngram")
    new = Drafter("ngram", num_draft_tokens=1, id="ngram")
    assert old.id == new.id and old != new


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("medusa",), {}, "unknown drafter 'medusa'; expected one of ngram, draft_model"),
        (("ngram",), {"num_draft_token": 4}, "unknown setting(s) num_draft_token"),
        (("ngram",), {"num_draft_tokens": 0}, "num_draft_tokens=0: expected an integer >= 1"),
        (("ngram",), {"num_draft_tokens": "8"}, "expected an integer"),
        (("ngram",), {"min_match_window": 5, "max_match_window": 2}, "exceeds max_match_window"),
        (("draft_model",), {}, "needs draft_model="),
        (("ngram",), {"id": "a b"}, "must be a non-empty string"),
    ],
)
def test_bad_declarations_say_what_is_wrong(args, kwargs, message):
    with pytest.raises(DrafterError) as info:
        Drafter(*args, **kwargs)
    assert message in str(info.value)


def test_round_trip_through_dict():
    d = Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=3, id="dm")
    assert Drafter.from_dict(d.as_dict()) == d


def test_block_drafter_and_controlled_acceptance_settings():
    block = Drafter("block", draft_model="tiny:dense-draft", block_size=16)
    assert block.num_draft_tokens == 15  # the target verifies the whole block of 16
    assert block.id == "block-dense-draft"
    controlled = Drafter("block", draft_model="tiny:dense-draft", block_size=8, accept_p=0.5)
    assert controlled.id == "block-p0.5-b8-dense-draft"
    with pytest.raises(DrafterError, match="needs draft_model="):
        Drafter("block")
    with pytest.raises(DrafterError, match="block_size=1: expected an integer >= 2"):
        Drafter("block", draft_model="tiny:dense-draft", block_size=1)
    for bad in (1.5, -0.1, True, "0.5"):
        with pytest.raises(DrafterError, match="expected a probability in"):
            Drafter("draft_model", draft_model="tiny:dense-draft", accept_p=bad)


def test_a_controlled_acceptance_is_in_every_id_and_defaults_to_the_papers_accept_length():
    from pytest_specenergy.engines.drafters import PAPER_BLOCK_TAU
    from pytest_specenergy.engines.drafters import accept_p_for

    # Old: id="block16" hid accept_p 0.8 (tau ~4.4, the paper's block drafters sit below 3).
    chosen = Drafter("block", draft_model="tiny:dense-draft", accept_p=0.8, id="block16")
    assert chosen.id == "block16-p0.8"
    assert Drafter("block", draft_model="d", accept_p=0.8, id="block16-p0.8").id == "block16-p0.8"
    p = accept_p_for(PAPER_BLOCK_TAU, 16)
    assert sum(p**j for j in range(16)) == pytest.approx(PAPER_BLOCK_TAU, abs=0.01)
    with pytest.raises(DrafterError, match="out of reach for a block of 4"):
        accept_p_for(5.0, 4)
