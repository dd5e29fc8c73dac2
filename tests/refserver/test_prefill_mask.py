"""A prompt prefilled into a fresh cache without padding gets no attention mask (kv.py): the
model's own causal attention, which must give the masked forward's values bit for bit."""

from __future__ import annotations

import pytest
import torch

from pytest_specenergy.refserver.kv import BatchKV
from pytest_specenergy.refserver.models import load_model


@pytest.mark.parametrize("model", ["tiny:dense", "tiny:moe", "tiny:hybrid"])
def test_an_unpadded_fresh_prefill_without_a_mask_equals_the_masked_one(model):
    loaded = load_model(model)
    n = 300
    kv = BatchKV(loaded.model, 1)
    mask, positions = kv.step_inputs(torch.ones((1, n), dtype=torch.bool))
    assert mask is None and positions.tolist() == [list(range(n))]
    # Padding keeps the explicit mask: the padded query must not see the padding.
    padded = torch.ones((2, n), dtype=torch.bool)
    padded[1, :5] = False
    assert BatchKV(loaded.model, 2).step_inputs(padded)[0] is not None

    dtype = next(loaded.model.parameters()).dtype
    causal = torch.zeros((1, 1, n, n), dtype=dtype)
    causal.masked_fill_(~torch.ones((n, n), dtype=torch.bool).tril(), torch.finfo(dtype).min)
    explicit = {"full_attention": causal, "linear_attention": None} if kv.has_linear else causal
    ids = torch.randint(3, 250, (1, n), generator=torch.Generator().manual_seed(0))
    decoder = loaded.model.get_decoder()
    with torch.inference_mode():
        unmasked = decoder(
            input_ids=ids, position_ids=positions, attention_mask=None
        ).last_hidden_state
        masked = decoder(
            input_ids=ids, position_ids=positions, attention_mask=explicit
        ).last_hidden_state
    assert torch.equal(unmasked, masked)
