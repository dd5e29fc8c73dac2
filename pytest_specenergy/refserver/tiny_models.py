"""Built-in tiny models, made deterministically from a seed (no files, no downloads).

How weights are seeded, drafts derived and models priced: its section of
``docs/reference-server.md#tiny-models``."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .random_models import is_random_model
from .random_models import parse_random_model
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
# The hybrid's gated-delta-net layers (issue 22 item 9): a long-memory state writing under the
# full-attention layer lets n-gram drafts be accepted while every state-rollback fault shows (the
# section of docs/reference-server.md#tiny-models).
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


def tiny_model_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(TINY_MODELS)


def priced_as_for(model: str, draft: str | None = None) -> dict[str, str] | None:
    """``/server_info``'s ``priced_as``: the real shape of the target and draft (a tiny model's
    declared shape, ``random:NAME``'s ``NAME``); None for a real checkpoint (priced at its own
    size), no draft entry without one."""
    shapes = {"target": _priced_as(model), "draft": _priced_as(draft) if draft else None}
    if shapes["target"] is None:
        return None
    return {role: shape for role, shape in shapes.items() if shape is not None}


def _priced_as(name: str) -> str | None:
    if name in TINY_MODELS:
        return TINY_MODELS[name].priced_as
    # the shape registry key
    return parse_random_model(name).shape_key if is_random_model(name) else None


def build_tiny_model(name: str, seed: int = 0) -> torch.nn.Module:
    """Build a registered tiny model (float64, CPU, eval mode); the caller casts and moves it."""
    spec = TINY_MODELS.get(name)
    if spec is None:
        raise ValueError(
            f"unknown tiny model {name!r}; expected one of {', '.join(tiny_model_names())}"
        )
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


# These projections add into the residual stream; scaling them scales a layer's contribution.
_RESIDUAL_WRITERS = ("o_proj.weight", "down_proj.weight", "out_proj.weight", "experts.down_proj")


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
                values[[PAD_ID, BOS_ID]] = 0.0
            else:
                bound = math.sqrt(3.0 / shape[-1])  # unit variance out for unit variance in
                if name.endswith("mlp.gate.weight"):
                    bound *= ROUTER_SCALE
                layer = re.search(r"(?:^|\.)layers\.(\d+)(?:\.|$)", name)
                if (
                    name.endswith(_RESIDUAL_WRITERS)
                    and layer is not None
                    and int(layer[1]) >= DRAFT_LAYERS
                ):
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


# ------------------------------------------------------------------------------------ families
HYBRID_LAYER_TYPES = ("linear_attention", "full_attention", "linear_attention", "full_attention")


def _config(family: str, num_layers: int) -> object:
    import transformers

    # what every family shares: attention shape, byte-tokenizer vocabulary and special ids
    common = dict(
        hidden_size=256,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=ByteTokenizer().vocab_size,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        max_position_embeddings=16384,
        rms_norm_eps=1e-6,
        attn_implementation="sdpa",
    )
    if family == "moe":
        return transformers.Qwen3MoeConfig(
            intermediate_size=768,
            moe_intermediate_size=192,
            num_experts=16,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            **common,
        )
    if family == "hybrid":
        # num_experts=0, dense MLPs: the hybrid tests the recurrent state, tiny:moe tests routing
        return transformers.Qwen3NextConfig(
            intermediate_size=512,
            layer_types=list(HYBRID_LAYER_TYPES[:num_layers]),
            linear_conv_kernel_dim=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=0,
            **common,
        )
    return transformers.Qwen3Config(intermediate_size=768, **common)


def _construct(cls_name: str, config: object) -> torch.nn.Module:
    """An instance of the transformers class ``cls_name`` without its random initialisation, which
    :func:`seed_weights` overwrites anyway (faster, same weights: the section of
    ``docs/reference-server.md#tiny-models``)."""
    import transformers
    from transformers.initialization import no_init_weights

    with no_init_weights():
        return getattr(transformers, cls_name)(config)


def _make_target(family: str, cls_name: str, layers: int) -> ModelBuilder:
    def build(seed: int) -> torch.nn.Module:
        return _finish(seed_weights(_construct(cls_name, _config(family, layers)), seed))

    return build


def _make_draft(target: ModelBuilder, family: str, cls_name: str) -> ModelBuilder:
    def build(seed: int) -> torch.nn.Module:
        source = target(seed).state_dict()
        draft = _construct(cls_name, _config(family, DRAFT_LAYERS)).to(torch.float64)
        wanted = draft.state_dict().keys()
        missing = next((key for key in wanted if key not in source), None)
        if missing is not None:
            raise RuntimeError(f"derived draft: target has no parameter {missing!r}")
        draft.load_state_dict({key: source[key] for key in wanted}, strict=True)
        return _finish(draft)

    return build


# Registered in this order, each target followed by its draft (first DRAFT_LAYERS layers +
# embeddings + lm_head).
_FAMILIES = (
    # family, transformers class, layers, description, priced as, draft description
    (
        "dense",
        "Qwen3ForCausalLM",
        6,
        "Qwen3 dense, 6 layers, hidden 256",
        "qwen3-8b",
        "first 2 layers + embeddings + lm_head of tiny:dense",
    ),
    (
        "moe",
        "Qwen3MoeForCausalLM",
        4,
        "Qwen3-MoE, 4 layers, 16 experts top-2",
        "qwen3-30b-a3b",
        "first 2 layers + embeddings + lm_head of tiny:moe",
    ),
    (
        "hybrid",
        "Qwen3NextForCausalLM",
        4,
        "Qwen3-Next, 4 layers: linear/full attention alternating",
        "qwen3.6-27b",
        "first 2 layers (linear + full attention) + embeddings + lm_head of tiny:hybrid",
    ),
)


def _register_families() -> None:
    for family, cls_name, layers, description, priced_as, draft_description in _FAMILIES:
        name = f"tiny:{family}"
        target = _make_target(family, cls_name, layers)
        TINY_MODELS[name] = TinyModelSpec(name, family, target, description, priced_as=priced_as)
        draft = _make_draft(target, family, cls_name)
        TINY_MODELS[f"{name}-draft"] = TinyModelSpec(
            f"{name}-draft",
            family,
            draft,
            draft_description,
            draft_for=name,
            priced_as="qwen3-0.6b",
        )


_register_families()


def default_draft_for(model: str) -> str | None:
    """The registered draft derived from ``model``, if any."""
    return next((spec.name for spec in TINY_MODELS.values() if spec.draft_for == model), None)
