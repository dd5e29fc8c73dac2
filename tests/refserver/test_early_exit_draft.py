"""The early-exit self-draft (``--draft-model early-exit:K``): a view of the target's first K layers
and its head, sharing the target's weights; speculative output still equals the plain engine's."""

from __future__ import annotations

import pytest

from pytest_specenergy.refserver.early_exit import early_exit_view
from pytest_specenergy.refserver.early_exit import parse_early_exit

torch = pytest.importorskip("torch")


def test_k_must_be_a_strict_prefix_of_the_layers():
    assert parse_early_exit("early-exit:3", 6) == 3
    for bad in ("early-exit:0", "early-exit:6", "early-exit:x", "early-exit:"):
        with pytest.raises(
            ValueError, match="expected early-exit:K with K a whole number of layers from 1 to 5"
        ):
            parse_early_exit(bad, 6)


def test_the_view_is_the_targets_first_layers_and_head_sharing_its_weights(engine_for):
    target = engine_for(model="tiny:dense").target.model
    layers = len(target.get_decoder().layers)
    k = layers // 2
    view = early_exit_view(target, k)
    assert view.config.num_hidden_layers == k and target.config.num_hidden_layers == layers
    shared = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in shared for p in view.parameters())  # no copy of any weight
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.inference_mode():
        hidden = target(ids, output_hidden_states=True).hidden_states[k]
        expected = target.lm_head(target.get_decoder().norm(hidden))
        got = view(ids).logits
    assert torch.allclose(got, expected, atol=1e-5)


def test_speculative_output_equals_the_plain_engine_and_drafts_are_accepted(
    engine_for, make_requests
):
    plain = engine_for(model="tiny:dense")
    layers = len(plain.target.model.get_decoder().layers)
    spec = engine_for(
        model="tiny:dense", drafter="draft_model", draft_model=f"early-exit:{layers - 1}"
    )
    assert spec.draft.name == f"early-exit:{layers - 1}"
    base = plain.generate(make_requests(plain, 4, max_new_tokens=24))
    out = spec.generate(make_requests(spec, 4, max_new_tokens=24))
    assert [r.output_ids for r in out] == [r.output_ids for r in base]
    assert sum(r.spec.num_correct_drafts for r in out) > 0


def test_a_bad_k_stops_the_engine_naming_the_layer_count(engine_for):
    with pytest.raises(ValueError, match=r"early-exit:99.*the target has \d+"):
        engine_for(model="tiny:dense", drafter="draft_model", draft_model="early-exit:99")
