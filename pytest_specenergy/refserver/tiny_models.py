"""Built-in tiny models, made deterministically from a seed (no files, no downloads).

Every weight is drawn from its own PCG64 stream keyed by ``(seed, parameter name)`` and converted to
floats with exact integer arithmetic, so the same seed gives bit-identical weights on any machine,
any torch version and any transformers version that names the parameters the same way. The
modules' own initialisers are used only for constant parameters (norm scales, ``dt_bias``), which
carry no randomness.

Targets and drafts:

* ``tiny:dense`` (``Qwen3ForCausalLM``) and ``tiny:dense-draft``;
* ``tiny:moe`` (``Qwen3MoeForCausalLM``, routed experts) and ``tiny:moe-draft``;
* ``tiny:hybrid`` (``Qwen3NextForCausalLM``, gated-delta-net linear attention + full attention)
  and ``tiny:hybrid-draft``.

A draft is *derived* from its target: the target's embeddings, first layers, final norm and
``lm_head``. The target's later layers write to the residual stream with a reduced scale, so the
truncated draft predicts the target's greedy token often enough for realistic acceptance, as a
trained draft model would. The registry (:data:`TINY_MODELS`, :func:`register_tiny_model`) is
open for more entries.

Each entry also names the real model shape it stands for (``priced_as``, a key of the plugin's
shape registry, served in ``/server_info``), so a roofline meter prices its work trace at that
size instead of at the tiny one, where fixed per-step overheads would dominate:

* ``tiny:dense`` as Qwen3-8B, its draft ``tiny:dense-draft`` as Qwen3-0.6B;
* ``tiny:moe`` as Qwen3-30B-A3B, ``tiny:moe-draft`` as Qwen3-0.6B (its usual draft model);
* ``tiny:hybrid`` as Qwen3.6-27B (3 Gated DeltaNet layers per full-attention layer),
  ``tiny:hybrid-draft`` as Qwen3-0.6B (a ~0.6B draft; no small hybrid draft is published).

The tiny models' own dimensions are unchanged: only the price tag is real-sized.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .random_models import random_priced_as
from .tokenizer import BOS_ID
from .tokenizer import EOS_ID
from .tokenizer import PAD_ID
from .tokenizer import ByteTokenizer

# Layers below this index are shared with the derived drafts and write to the residual stream at
# full scale; deeper layers write at DEEP_RESIDUAL_SCALE. Chosen so that a 2-layer draft agrees with
# the 6-layer target on most greedy tokens, but not on all of them.
DRAFT_LAYERS = 2
DEEP_RESIDUAL_SCALE = 0.15
LOGIT_SCALE = 3.0  # std of the logits for a unit-RMS final hidden state: keeps top-2 gaps wide
ROUTER_SCALE = 2.0
ATTN_OUT_SCALE = 0.25
# The hybrid's gated-delta-net (linear attention) layers, issue 22 item 9. With the decay rates the
# architecture's initialiser draws (A in [1, 16]: a state that forgets in about one token) and
# out_proj at ATTN_OUT_SCALE alone (its input is unit-RMS after the gated norm, where softmax
# attention hands o_proj an average of values: it wrote ~3x what the full-attention layer did), the
# few latest tokens steered the text like a high-order Markov chain: greedy answers cycled only after
# ~40 tokens, so n-gram drafts were never accepted in a 32-token answer. A state that remembers
# tens of tokens (A in [0.01, 0.1], as a trained layer's long-memory heads) writing under the
# full-attention layer settles the text into short cycles as the dense model's does (n-gram accept
# length 1.4 on code at 32 tokens, 1.6-1.9 on every built-in corpus at 64), while a corrupted
# state still persists long enough to change tokens: every state-rollback fault shows.
LINEAR_ATTN_OUT_SCALE = 0.2
GDN_DECAY_RANGE = (0.01, 0.1)

ModelBuilder = Callable[[int], torch.nn.Module]


@dataclass(frozen=True)
class TinyModelSpec:
    """One registry entry: how to build a tiny model from a seed."""

    name: str
    family: str  # "dense" | "moe" | "hybrid"; used for docs and the work-trace accounting tests
    build: ModelBuilder  # seed -> float64 CPU model in eval mode
    description: str
    draft_for: str | None = None  # the target this draft is derived from, if it is a draft
    priced_as: str | None = None  # the real shape this model stands for (a shape registry key)


TINY_MODELS: dict[str, TinyModelSpec] = {}


def register_tiny_model(spec: TinyModelSpec) -> None:
    """Add (or replace) a tiny model in the registry."""
    TINY_MODELS[spec.name] = spec


def tiny_model_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(TINY_MODELS)


def priced_as_for(model: str, draft: str | None = None) -> dict[str, str] | None:
    """``/server_info``'s ``priced_as``: the real shape of the target and of the draft model.

    A tiny model is priced as the shape it declares, a ``random:NAME`` model as ``NAME`` (whatever
    its overrides). None when the target is neither (a real checkpoint is priced at its own
    size); the draft entry is left out when there is no draft model or it declares no shape.
    """
    target = _priced_as(model)
    if target is None:
        return None
    out = {"target": target}
    draft_shape = _priced_as(draft) if draft else None
    if draft_shape is not None:
        out["draft"] = draft_shape
    return out


def _priced_as(name: str) -> str | None:
    spec = TINY_MODELS.get(name)
    if spec is not None:
        return spec.priced_as
    return random_priced_as(name)


def build_tiny_model(name: str, seed: int = 0) -> torch.nn.Module:
    """Build a registered tiny model (float64, CPU, eval mode); the caller casts and moves it."""
    spec = TINY_MODELS.get(name)
    if spec is None:
        raise ValueError(f"unknown tiny model {name!r}; expected one of {', '.join(tiny_model_names())}")
    return spec.build(seed)


# --------------------------------------------------------------------------------------- weights
def _uniform(seed: int, key: str, shape: tuple[int, ...], bound: float) -> torch.Tensor:
    """Uniform(-bound, bound) values, bit-identical everywhere for the same (seed, key, shape)."""
    digest = hashlib.sha256(f"specenergy-tiny/{seed}/{key}".encode()).digest()
    bitgen = np.random.PCG64(int.from_bytes(digest[:16], "little"))
    n = math.prod(shape)
    raw = bitgen.random_raw(n)
    # 53 random bits -> an exact double in [0, 1); no library float routine is involved.
    unit = (raw >> np.uint64(11)).astype(np.float64) * (2.0**-53)
    return torch.from_numpy(((2.0 * unit - 1.0) * bound).reshape(shape))


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def _residual_writer(name: str) -> bool:
    # These projections add into the residual stream; scaling them scales a layer's contribution.
    return name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight", "experts.down_proj"))


def seed_weights(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Overwrite every random parameter of ``model`` with seeded values (in place; returns it)."""
    hidden = int(model.config.hidden_size)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            shape = tuple(param.shape)
            if name.endswith("A_log"):
                # Gated-delta-net decay rates: log of Uniform(GDN_DECAY_RANGE) (see there).
                u = _uniform(seed, name, shape, 1.0)
                lo, hi = GDN_DECAY_RANGE
                values = torch.log((lo + hi) / 2 + (hi - lo) / 2 * u)
            elif param.ndim < 2:
                continue  # norm scales, dt_bias: constants from the module's own initialiser
            elif name.endswith("embed_tokens.weight"):
                values = _uniform(seed, name, shape, 1.0)
            elif name.endswith("lm_head.weight"):
                values = _uniform(seed, name, shape, LOGIT_SCALE * math.sqrt(3.0 / hidden))
                # Trained models practically never emit <pad>/<bos>; a zero row keeps them out of
                # greedy output. <eos> stays random, so some answers end early, as real ones do.
                values[PAD_ID] = 0.0
                values[BOS_ID] = 0.0
            else:
                bound = math.sqrt(3.0 / shape[-1])  # unit variance out for unit variance in
                if name.endswith("mlp.gate.weight"):
                    bound *= ROUTER_SCALE
                layer = _layer_index(name)
                if _residual_writer(name) and layer is not None and layer >= DRAFT_LAYERS:
                    bound *= DEEP_RESIDUAL_SCALE
                if name.endswith(("o_proj.weight", "linear_attn.out_proj.weight")):
                    bound *= ATTN_OUT_SCALE
                if name.endswith("linear_attn.out_proj.weight"):
                    bound *= LINEAR_ATTN_OUT_SCALE
                values = _uniform(seed, name, shape, bound)
            param.copy_(values.to(param.dtype))
    return model


def _finish(model: torch.nn.Module) -> torch.nn.Module:
    if getattr(model.config, "num_experts", 0):
        # The grouped-mm expert kernels reject float64; the eager loop over experts is exact.
        model.set_experts_implementation("eager")
    model = model.to(torch.float64)
    model.eval()
    model.requires_grad_(False)
    return model


def _common(vocab: int) -> dict[str, object]:
    return dict(
        vocab_size=vocab,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        max_position_embeddings=16384,
        rms_norm_eps=1e-6,
        attn_implementation="sdpa",
    )


# ------------------------------------------------------------------------------------ families
def _dense_config(num_layers: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        **_common(ByteTokenizer().vocab_size),
    )


def _moe_config(num_layers: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        hidden_size=256,
        intermediate_size=768,
        moe_intermediate_size=192,
        num_experts=16,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        **_common(ByteTokenizer().vocab_size),
    )


HYBRID_LAYER_TYPES = ("linear_attention", "full_attention", "linear_attention", "full_attention")


def _hybrid_config(num_layers: int):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=num_layers,
        layer_types=list(HYBRID_LAYER_TYPES[:num_layers]),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=0,  # dense MLPs: the hybrid tests the recurrent state, tiny:moe tests routing
        **_common(ByteTokenizer().vocab_size),
    )


def _construct(cls_name: str, config: object) -> torch.nn.Module:
    """An instance of the transformers class ``cls_name`` without its random initialisation.

    :func:`seed_weights` overwrites every random parameter, and the constant ones (norm scales,
    ``dt_bias``) and buffers are set by the modules' constructors, so the initialisers'
    draws were thrown away: they were the larger part of a build (``tiny:dense`` 0.074 s ->
    0.031 s, ``benchmarks/engine_setup.py``), paid by every engine start. The weights are
    bit-identical either way (``tests/refserver/test_reference_models.py`` compares every
    tensor)."""
    import transformers
    from transformers.initialization import no_init_weights

    with no_init_weights():
        return getattr(transformers, cls_name)(config)


def _make_target(config_fn: Callable[[int], object], cls_name: str, layers: int) -> ModelBuilder:
    def build(seed: int) -> torch.nn.Module:
        return _finish(seed_weights(_construct(cls_name, config_fn(layers)), seed))

    return build


def _make_draft(target: ModelBuilder, config_fn: Callable[[int], object], cls_name: str) -> ModelBuilder:
    def build(seed: int) -> torch.nn.Module:
        source = target(seed).state_dict()
        draft = _construct(cls_name, config_fn(DRAFT_LAYERS))
        keep = {}
        for key in draft.state_dict():
            if key not in source:
                raise RuntimeError(f"derived draft: target has no parameter {key!r}")
            keep[key] = source[key]
        draft = draft.to(torch.float64)
        draft.load_state_dict(keep, strict=True)
        return _finish(draft)

    return build


_dense = _make_target(_dense_config, "Qwen3ForCausalLM", 6)
_moe = _make_target(_moe_config, "Qwen3MoeForCausalLM", 4)
_hybrid = _make_target(_hybrid_config, "Qwen3NextForCausalLM", 4)

register_tiny_model(
    TinyModelSpec("tiny:dense", "dense", _dense, "Qwen3 dense, 6 layers, hidden 256", priced_as="qwen3-8b")
)
register_tiny_model(
    TinyModelSpec(
        "tiny:dense-draft",
        "dense",
        _make_draft(_dense, _dense_config, "Qwen3ForCausalLM"),
        "first 2 layers + embeddings + lm_head of tiny:dense",
        draft_for="tiny:dense",
        priced_as="qwen3-0.6b",
    )
)
register_tiny_model(
    TinyModelSpec("tiny:moe", "moe", _moe, "Qwen3-MoE, 4 layers, 16 experts top-2", priced_as="qwen3-30b-a3b")
)
register_tiny_model(
    TinyModelSpec(
        "tiny:moe-draft",
        "moe",
        _make_draft(_moe, _moe_config, "Qwen3MoeForCausalLM"),
        "first 2 layers + embeddings + lm_head of tiny:moe",
        draft_for="tiny:moe",
        priced_as="qwen3-0.6b",
    )
)
register_tiny_model(
    TinyModelSpec(
        "tiny:hybrid",
        "hybrid",
        _hybrid,
        "Qwen3-Next, 4 layers: linear/full attention alternating",
        priced_as="qwen3.6-27b",
    )
)
register_tiny_model(
    TinyModelSpec(
        "tiny:hybrid-draft",
        "hybrid",
        _make_draft(_hybrid, _hybrid_config, "Qwen3NextForCausalLM"),
        "first 2 layers (linear + full attention) + embeddings + lm_head of tiny:hybrid",
        draft_for="tiny:hybrid",
        priced_as="qwen3-0.6b",
    )
)


def default_draft_for(model: str) -> str | None:
    """The registered draft derived from ``model``, if any."""
    for spec in TINY_MODELS.values():
        if spec.draft_for == model:
            return spec.name
    return None
