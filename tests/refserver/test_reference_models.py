"""Tokenizer and built-in tiny models: lossless, deterministic, derived drafts, clear errors."""

from __future__ import annotations

import hashlib

import pytest
import torch

from pytest_specenergy.refserver import tiny_models
from pytest_specenergy.refserver.models import load_model
from pytest_specenergy.refserver.tiny_models import TINY_MODELS
from pytest_specenergy.refserver.tiny_models import build_tiny_model
from pytest_specenergy.refserver.tiny_models import default_draft_for
from pytest_specenergy.refserver.tokenizer import BOS_ID
from pytest_specenergy.refserver.tokenizer import EOS_ID
from pytest_specenergy.refserver.tokenizer import PAD_ID
from pytest_specenergy.refserver.tokenizer import ByteTokenizer

# sha256 over sorted (name, float64 bytes) of the seed-0 weights. Same on every machine, torch and
# transformers version (checked with transformers 5.17 and 5.24): a change here changes every
# stored baseline, so it must be deliberate.
GOLDEN = {
    "tiny:dense": "feefb0f8bc1ab1033ecfb4976e8272a3770036d541d29079d95b348cf963a7b0",
    "tiny:moe": "5de3245c6d4de1a98750cb081f248efe49a8e42b053fb6f79800e4d2806550d5",
    "tiny:hybrid": "99e40862bfd25148bfe00b1e4977d43e44d70fb6758ff525e4ec22160fba7163",
}


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        h.update(key.encode())
        h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Hello, the world of energy per token.",
        "Allegra! Jau discur rumantsch: tschertgar, ün, ö, ä, è, Cuira.",
        "def f(self):\n    return None\n",
        "日本語 and emoji 🎉 and \x00 control",
    ],
)
def test_tokenizer_roundtrip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(3 <= i < tok.vocab_size for i in ids)


def test_tokenizer_fixed_ids_and_merges():
    tok = ByteTokenizer()
    assert (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert tok.eos_token_ids == (EOS_ID,)
    assert tok.encode("A") == [3 + ord("A")]
    assert len(tok.encode(" the energy")) < len(b" the energy")  # merges apply
    assert tok.decode([EOS_ID, 3 + ord("x")]) == "x"
    assert tok.decode([EOS_ID], skip_special_tokens=False) == "<eos>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    assert ByteTokenizer().vocab_size == tok.vocab_size


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_weights_are_bit_identical_for_a_seed(name):
    assert _digest(build_tiny_model(name, 0)) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_a_build_without_the_random_init_has_the_same_tensors(name, monkeypatch):
    """Builds skip the modules' random initialisers (seed_weights overwrites what they draw): every
    parameter and buffer, non-persistent ones (rotary frequencies) too, equals a build with them."""
    import transformers

    def tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {
            **dict(model.named_parameters()),
            **{f"buffer {k}": v for k, v in model.named_buffers()},
        }

    fast = tensors(build_tiny_model(name, 0))
    monkeypatch.setattr(
        tiny_models, "_construct", lambda cls_name, config: getattr(transformers, cls_name)(config)
    )
    initialised = tensors(build_tiny_model(name, 0))
    assert fast.keys() == initialised.keys()
    assert [
        k
        for k in fast
        if fast[k].dtype != initialised[k].dtype or not torch.equal(fast[k], initialised[k])
    ] == []


def test_other_seed_gives_other_weights():
    a = build_tiny_model("tiny:dense", 0).state_dict()
    b = build_tiny_model("tiny:dense", 1).state_dict()
    assert not torch.equal(
        a["model.layers.0.self_attn.q_proj.weight"], b["model.layers.0.self_attn.q_proj.weight"]
    )


@pytest.mark.parametrize("target", ["tiny:dense", "tiny:moe", "tiny:hybrid"])
def test_drafts_are_derived_from_their_target(target):
    draft_name = default_draft_for(target)
    assert draft_name == f"{target}-draft"
    t = build_tiny_model(target, 0).state_dict()
    d = build_tiny_model(draft_name, 0).state_dict()
    assert len(d) < len(t)
    for key, value in d.items():
        assert torch.equal(value, t[key]), key
    assert TINY_MODELS[target].family == TINY_MODELS[draft_name].family


def test_registry_architectures():
    assert type(build_tiny_model("tiny:dense")).__name__ == "Qwen3ForCausalLM"
    assert type(build_tiny_model("tiny:moe")).__name__ == "Qwen3MoeForCausalLM"
    hybrid = build_tiny_model("tiny:hybrid")
    assert type(hybrid).__name__ == "Qwen3NextForCausalLM"
    assert set(hybrid.config.layer_types) == {"linear_attention", "full_attention"}


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="neither a built-in tiny model"):
        load_model(str(tmp_path / "does-not-exist"))
    with pytest.raises(ValueError, match="unknown tiny model"):
        load_model("tiny:nope")


def test_local_checkpoint_directory_loads(tmp_path):
    """Any HF checkpoint directory is a model; its own tokenizer is used."""
    from tokenizers import Tokenizer
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = build_tiny_model("tiny:dense-draft", 0)
    model.save_pretrained(tmp_path)
    vocab = {chr(97 + i): i + 3 for i in range(26)}
    vocab.update({"<pad>": 0, "<bos>": 1, "<eos>": 2, "[UNK]": 29})
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>"
    )
    fast.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="float64", device="cpu")
    assert loaded.dtype == torch.float64
    assert 2 in loaded.eos_token_ids
    assert loaded.tokenizer.encode("abc") == [3, 4, 5]
    ref = build_tiny_model("tiny:dense-draft", 0)
    for key, value in ref.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
