"""Randomly initialised models of a real model's shape: ``random:NAME`` (no files, no downloads).

Shapes, overrides, pricing, seeding and tokenizer: its section of ``docs/reference-server.md#random-models``."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Any

from .tokenizer import BOS_ID
from .tokenizer import EOS_ID
from .tokenizer import PAD_ID
from .tokenizer import ByteTokenizer

if TYPE_CHECKING:
    import torch

RANDOM_PREFIX = "random:"
OVERRIDE_KEYS = ("layers", "hidden", "mlp", "vocab")
MIN_VOCAB = ByteTokenizer().vocab_size  # every id the byte tokenizer encodes must be a model id


@dataclass(frozen=True)
class RandomModelSpec:
    """The dimensions of one ``random:*`` model (the registry shape, overrides applied)."""

    name: str  # the model name as given, e.g. "random:qwen3-4b:layers=2"
    shape_key: str  # the shape registry key it stands for (and is priced as), e.g. "qwen3-4b"
    layers: int
    hidden: int
    mlp: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool


def is_random_model(name: str | None) -> bool:
    """Whether ``name`` asks for a randomly initialised model."""
    return name is not None and name.startswith(RANDOM_PREFIX)


#: The published configs (Hugging Face ``config.json``) of the dense Qwen3 models a random model can
#: stand for - the shapes Qwen3ForCausalLM expresses exactly (no routed experts, no linear or gated
#: attention). The reference server stands alone, so it keeps these few numbers itself; a test holds
#: them equal to the plugin's shape registry (:mod:`pytest_specenergy.meters.shapes`), whose key is
#: also what the model is priced as.
PUBLISHED_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        layers=28,
        hidden=1024,
        mlp=3072,
        q_heads=16,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=True,
    ),
    "qwen3-4b": dict(
        layers=36,
        hidden=2560,
        mlp=9728,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=True,
    ),
    "qwen3-8b": dict(
        layers=36,
        hidden=4096,
        mlp=12288,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=False,
    ),
}


def random_model_names() -> list[str]:
    """Every valid ``random:NAME`` (without overrides), sorted."""
    return [RANDOM_PREFIX + key for key in sorted(PUBLISHED_SHAPES)]


def _parse_overrides(text: str, name: str) -> dict[str, int]:
    """``layers=2,vocab=1024`` -> ``{"layers": 2, "vocab": 1024}``; ValueError names the fault."""
    out: dict[str, int] = {}
    valid = ", ".join(OVERRIDE_KEYS)
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ValueError(f"override {item!r} in {name!r} must be key=value (keys: {valid})")
        if key not in OVERRIDE_KEYS:
            raise ValueError(f"unknown override {key!r} in {name!r}; valid keys: {valid}")
        if key in out:
            raise ValueError(f"override {key!r} is given twice in {name!r}")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"override {key}={value!r} in {name!r} must be a positive integer")
        out[key] = int(value)
    return out


def parse_random_model(name: str) -> RandomModelSpec:
    """The spec of ``random:NAME[:key=value,...]``; ValueError says what is wrong and what is valid."""
    if not is_random_model(name):
        raise ValueError(f"{name!r} is not a random model name (expected {RANDOM_PREFIX}NAME)")
    key, _, overrides = name[len(RANDOM_PREFIX) :].partition(":")
    key = key.strip().lower()
    shape = PUBLISHED_SHAPES.get(key)
    if shape is None:
        raise ValueError(
            f"unknown random model {name!r}; expected one of {', '.join(random_model_names())} "
            f"(optionally :layers=N,...): the dense Qwen3 shapes"
        )
    spec = RandomModelSpec(name=name, shape_key=key, **shape)
    if overrides:
        spec = replace(spec, **_parse_overrides(overrides, name))
    if spec.vocab < MIN_VOCAB:
        raise ValueError(
            f"override vocab={spec.vocab} in {name!r} is smaller than the byte tokenizer's "
            f"{MIN_VOCAB} ids"
        )
    return spec


def build_random_model(
    spec: RandomModelSpec, seed: int, dtype: torch.dtype, device: torch.device
) -> torch.nn.Module:
    """Build ``spec`` with seeded random weights directly on ``device`` in ``dtype`` (eval mode)."""
    import torch
    from transformers import Qwen3Config
    from transformers import Qwen3ForCausalLM

    # byte-tokenizer special ids; SDPA honours the explicit 4-D masks the engine builds,
    # flash-attention would not
    config = Qwen3Config(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.mlp,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.q_heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        tie_word_embeddings=spec.tied_embeddings,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        attn_implementation="sdpa",
    )
    # fork_rng restores every RNG it seeds, so building a model leaves the caller's streams alone
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=cuda), torch.device(device):
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(before)
    model.eval()
    model.requires_grad_(False)
    return model
