"""Real model shapes and the work of one forward pass at a shape (what :func:`forward_cost` counts
and how it was checked against the paper: ``docs/report.md``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple
from typing import Sequence

LINEAR = "linear"
FULL = "full"


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only model that decide the work of a forward pass (each field's
    meaning: ``docs/report.md``); ``mlp`` is 0 when every layer is routed-MoE."""

    name: str
    layers: int
    hidden: int
    mlp: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int = 2
    tied_embeddings: bool = False
    attn_output_gate: bool = False
    experts: int = 0
    experts_per_token: int = 0
    expert_mlp: int = 0
    shared_experts: int = 0
    layer_pattern: tuple[str, ...] = ()
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 4
    state_dtype_bytes: int = 4
    description: str = ""

    def __post_init__(self) -> None:
        if any(kind not in (LINEAR, FULL) for kind in self.layer_pattern):
            raise ValueError(f"{self.name}: layer_pattern entries must be {LINEAR!r} or {FULL!r}")
        if self.experts and not (0 < self.experts_per_token <= self.experts and self.expert_mlp):
            raise ValueError(
                f"{self.name}: an MoE shape needs 0 < experts_per_token <= experts and expert_mlp"
            )

    # ------------------------------------------------------------------------------ layout
    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """``linear`` or ``full`` for every layer."""
        pattern = self.layer_pattern or (FULL,)
        return tuple(pattern[i % len(pattern)] for i in range(self.layers))

    @property
    def linear_layers(self) -> int:
        """Number of linear-attention (Gated DeltaNet) layers."""
        return sum(kind == LINEAR for kind in self.layer_kinds)

    @property
    def full_layers(self) -> int:
        """Number of full-attention layers."""
        return self.layers - self.linear_layers

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are routed experts."""
        return self.experts > 0

    # ------------------------------------------------------------------- parameter counts
    @property
    def q_dim(self) -> int:
        """Width of the attention output (query heads x head_dim)."""
        return self.q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V)."""
        return self.kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one full-attention layer."""
        q_out = self.q_dim * (2 if self.attn_output_gate else 1)
        return self.hidden * (q_out + 2 * self.kv_dim) + self.q_dim * self.hidden

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the Gated DeltaNet causal conv (q, k and v)."""
        return (
            2 * self.linear_key_heads * self.linear_key_dim
            + self.linear_value_heads * self.linear_value_dim
        )

    @property
    def linear_in_width(self) -> int:
        """Output width of the Gated DeltaNet input projections (q, k, v, z, and the b/a gates)."""
        value = self.linear_value_heads * self.linear_value_dim
        return self.linear_conv_dim + value + 2 * self.linear_value_heads

    @property
    def linear_params(self) -> int:
        """Input projections, conv and output projection of one Gated DeltaNet layer."""
        value = self.linear_value_heads * self.linear_value_dim
        return (
            self.hidden * (self.linear_in_width + value)
            + self.linear_conv_dim * self.linear_conv_kernel
        )

    @property
    def expert_params(self) -> int:
        """One routed (or shared) expert: gate, up and down projections."""
        return 3 * self.hidden * self.expert_mlp

    @property
    def mlp_dense_params(self) -> int:
        """MLP weights every token uses: the dense MLP, or router + shared experts of an MoE layer."""
        if self.is_moe:
            shared_gate = self.hidden if self.shared_experts else 0
            return (
                self.hidden * self.experts + self.shared_experts * self.expert_params + shared_gate
            )
        return 3 * self.hidden * self.mlp

    @property
    def embed_params(self) -> int:
        """The embedding matrix (also ``lm_head`` when tied)."""
        return self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        """All parameters (norm scales left out)."""
        layers = (
            self.full_layers * self.attention_params
            + self.linear_layers * self.linear_params
            + self.layers * (self.mlp_dense_params + self.experts * self.expert_params)
        )
        return layers + self.embed_params * (1 if self.tied_embeddings else 2)

    @property
    def active_params(self) -> int:
        """Parameters one token uses (``experts_per_token`` routed experts per layer)."""
        return (
            self.num_params
            - self.layers * (self.experts - self.experts_per_token) * self.expert_params
        )

    # ------------------------------------------------------------------- per-token sizes
    @property
    def kv_bytes_per_token(self) -> int:
        """K + V bytes one cached token takes over all full-attention layers."""
        return 2 * self.kv_dim * self.full_layers * self.dtype_bytes

    @property
    def state_bytes_per_row(self) -> int:
        """Conv + recurrent state bytes of one request over all linear-attention layers."""
        conv = self.linear_conv_dim * (self.linear_conv_kernel - 1) * self.dtype_bytes
        recurrent = (
            self.linear_value_heads
            * self.linear_key_dim
            * self.linear_value_dim
            * self.state_dtype_bytes
        )
        return self.linear_layers * (conv + recurrent)

    def _activation_elems_per_token(self) -> int:
        # Each GEMM reads its input and writes its output once; attention reads Q, writes its
        # output.
        h, q = self.hidden, self.q_dim
        q_out = q * (2 if self.attn_output_gate else 1)
        attention = (h + q_out + 2 * self.kv_dim) + (q + q) + (q + h)
        value = self.linear_value_heads * self.linear_value_dim
        linear = (h + self.linear_in_width) + (self.linear_conv_dim + value) + (value + h)
        if self.is_moe:
            # each token goes to this many experts
            copies = self.experts_per_token + self.shared_experts
            width = copies * self.expert_mlp
            mlp = (h + self.experts) + (h * copies + 2 * width) + (width + h * copies)
        else:
            mlp = (h + 2 * self.mlp) + (self.mlp + h)
        return self.full_layers * attention + self.linear_layers * linear + self.layers * mlp


class ForwardCost(NamedTuple):
    """FLOPs and bytes of one forward at a shape."""

    flops: float
    weight_bytes: float
    kv_bytes: float
    activation_bytes: float

    @property
    def bytes(self) -> float:
        """Everything moved: weights + KV/state read and written + activations."""
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte."""
        return self.flops / self.bytes if self.bytes else 0.0


def expected_experts(experts: int, per_token: int, tokens: float) -> float:
    """Distinct experts ``tokens`` independent uniformly routed tokens touch: E (1 - (1 - k/E)^n)."""
    return (
        0.0
        if experts <= 0 or tokens <= 0
        else experts * (1.0 - (1.0 - per_token / experts) ** tokens)
    )


def effective_tokens(touched: float, experts: int, per_token: int, tokens: int) -> float:
    """Independent tokens that would touch ``touched`` of ``experts`` experts (the inverse of
    :func:`expected_experts`), at most ``tokens``: how much a step's routing overlapped."""
    if tokens <= 0:
        return 0.0
    if experts <= per_token or touched >= experts or touched < per_token:
        return float(tokens)  # saturated (or not observed): no overlap information
    n = math.log(1.0 - touched / experts) / math.log(1.0 - per_token / experts)
    return min(max(n, 1.0), float(tokens))


def forward_cost(
    shape: ModelShape,
    rows: int,
    query_tokens_per_row: Sequence[int] | int,
    context_lens_per_row: Sequence[int] | int,
    experts_touched: Sequence[float] | None = None,
    *,
    logit_rows: int | None = None,
    per_position_states: bool = False,
) -> ForwardCost:
    """FLOPs, weight, KV/state and activation bytes of one forward of ``rows`` requests (the per-row
    lengths may be one int for all). ``experts_touched[l]``: distinct routed experts layer ``l``
    reads (default: the uniform-routing expectation); ``logit_rows``: positions needing logits
    (default: every query token); ``per_position_states``: a verify step, where linear attention
    writes one state per query token."""
    query, context = (
        [int(lengths)] * rows if isinstance(lengths, int) else [int(n) for n in lengths]
        for lengths in (query_tokens_per_row, context_lens_per_row)
    )
    if len(query) != rows or len(context) != rows:
        raise ValueError(
            f"{rows} rows but {len(query)} query lengths and {len(context)} context lengths"
        )
    tokens = sum(query)
    logits = tokens if logit_rows is None else int(logit_rows)
    pairs = sum(q * c + q * (q + 1) // 2 for q, c in zip(query, context))
    kv_tokens = sum(q + c for q, c in zip(query, context))
    state_touches = sum(
        (1 if c > 0 else 0) + (q if per_position_states else 1)
        for q, c in zip(query, context)
        if q > 0
    )

    experts_read = 0.0  # routed experts read, summed over layers
    if shape.is_moe and tokens:
        if experts_touched is not None and len(experts_touched) == shape.layers:
            experts_read = float(sum(min(float(t), shape.experts) for t in experts_touched))
        else:
            experts_read = shape.layers * expected_experts(
                shape.experts, shape.experts_per_token, tokens
            )

    layer_params = (
        shape.full_layers * shape.attention_params
        + shape.linear_layers * shape.linear_params
        + shape.layers * shape.mlp_dense_params
    )
    weight = layer_params + experts_read * shape.expert_params + tokens * shape.hidden
    flops = (
        2.0 * tokens * (layer_params + shape.layers * shape.experts_per_token * shape.expert_params)
    )
    flops += 4.0 * shape.q_dim * shape.full_layers * pairs
    linear_state = shape.linear_value_heads * shape.linear_key_dim * shape.linear_value_dim
    flops += 6.0 * linear_state * shape.linear_layers * tokens
    if logits > 0:
        weight += shape.embed_params  # lm_head (the embedding itself when tied)
        flops += 2.0 * logits * shape.embed_params

    kv = kv_tokens * shape.kv_bytes_per_token + state_touches * shape.state_bytes_per_row
    activations = tokens * shape._activation_elems_per_token() + logits * (
        shape.hidden + shape.vocab
    )
    return ForwardCost(
        flops, weight * shape.dtype_bytes, float(kv), activations * shape.dtype_bytes
    )


def verify_cost(shape: ModelShape, batch: int, verified: int, context: int) -> ForwardCost:
    """The verify forward: ``batch`` rows of ``verified`` tokens over ``context`` cached tokens
    each."""
    return forward_cost(shape, batch, verified, context, per_position_states=verified > 1)


# ------------------------------------------------------------------------------------ registry
_QWEN3_VOCAB = 151936
_GDN_3_TO_1 = (LINEAR, LINEAR, LINEAR, FULL)


def get_shape(name: str) -> ModelShape:
    """The shape registered as ``name`` (case-insensitive); ValueError lists the valid names."""
    shape = SHAPES.get(str(name).lower())
    if shape is None:
        raise ValueError(
            f"unknown model shape {name!r}; expected one of {', '.join(sorted(SHAPES))}"
        )
    return shape


#: Every shape by its lower-case key. Published configs (Hugging Face config.json of each model).
SHAPES: dict[str, ModelShape] = {
    "qwen3-0.6b": ModelShape(
        "Qwen3-0.6B",
        layers=28,
        hidden=1024,
        mlp=3072,
        q_heads=16,
        kv_heads=8,
        head_dim=128,
        vocab=_QWEN3_VOCAB,
        tied_embeddings=True,
        description="Qwen/Qwen3-0.6B",
    ),
    "qwen3-4b": ModelShape(
        "Qwen3-4B",
        layers=36,
        hidden=2560,
        mlp=9728,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=_QWEN3_VOCAB,
        tied_embeddings=True,
        description="Qwen/Qwen3-4B",
    ),
    "qwen3-8b": ModelShape(
        "Qwen3-8B",
        layers=36,
        hidden=4096,
        mlp=12288,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=_QWEN3_VOCAB,
        description="Qwen/Qwen3-8B",
    ),
    # The second model ML.ENERGY measured on H100 that the presets are fitted to
    # (benchmarks/mlenergy_calibration.py).
    "llama-3.1-8b": ModelShape(
        "Llama-3.1-8B",
        layers=32,
        hidden=4096,
        mlp=14336,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        description="meta-llama/Llama-3.1-8B-Instruct",
    ),
    "qwen3-30b-a3b": ModelShape(
        "Qwen3-30B-A3B",
        layers=48,
        hidden=2048,
        mlp=0,
        q_heads=32,
        kv_heads=4,
        head_dim=128,
        vocab=_QWEN3_VOCAB,
        experts=128,
        experts_per_token=8,
        expert_mlp=768,
        description="Qwen/Qwen3-30B-A3B: 128 routed experts, 8 per token, no shared expert",
    ),
    # Qwen3.6-27B as its config is reported (it shares the Qwen3.5 implementation): 16 blocks of 3
    # Gated DeltaNet + 1 gated full attention, float32 recurrent state, untied; ~26.9B parameters
    # without the vision tower.
    "qwen3.6-27b": ModelShape(
        "Qwen3.6-27B",
        layers=64,
        hidden=5120,
        mlp=17408,
        q_heads=24,
        kv_heads=4,
        head_dim=256,
        vocab=248320,
        attn_output_gate=True,
        layer_pattern=_GDN_3_TO_1,
        linear_key_heads=16,
        linear_value_heads=48,
        linear_key_dim=128,
        linear_value_dim=128,
        linear_conv_kernel=4,
        state_dtype_bytes=4,
        description="Qwen3.6-27B-like hybrid (Qwen3-Next style 3:1 Gated DeltaNet)",
    ),
}

# The built-in tiny models at their own size (the reference server's accounting charges bf16).
_TINY_VOCAB = 453  # the reference server's byte tokenizer
_TINY = "built-in tiny model at its own size"
for _layers, _suffix in ((6, ""), (2, "-draft")):
    SHAPES[f"tiny:dense{_suffix}"] = ModelShape(
        f"tiny:dense{_suffix}",
        layers=_layers,
        hidden=256,
        mlp=768,
        q_heads=4,
        kv_heads=2,
        head_dim=64,
        vocab=_TINY_VOCAB,
        description=_TINY,
    )
for _layers, _suffix in ((4, ""), (2, "-draft")):
    SHAPES[f"tiny:moe{_suffix}"] = ModelShape(
        f"tiny:moe{_suffix}",
        layers=_layers,
        hidden=256,
        mlp=0,
        q_heads=4,
        kv_heads=2,
        head_dim=64,
        vocab=_TINY_VOCAB,
        experts=16,
        experts_per_token=2,
        expert_mlp=192,
        description=_TINY,
    )
    SHAPES[f"tiny:hybrid{_suffix}"] = ModelShape(
        f"tiny:hybrid{_suffix}",
        layers=_layers,
        hidden=256,
        mlp=512,
        q_heads=4,
        kv_heads=2,
        head_dim=64,
        vocab=_TINY_VOCAB,
        attn_output_gate=True,
        layer_pattern=(LINEAR, FULL),
        linear_key_heads=2,
        linear_value_heads=4,
        linear_key_dim=32,
        linear_value_dim=32,
        linear_conv_kernel=4,
        state_dtype_bytes=2,
        description=_TINY,
    )
