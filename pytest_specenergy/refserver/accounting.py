"""What one forward pass would cost on a GPU: weight bytes, KV/state bytes and FLOPs (charged at
bf16).

All per-architecture knowledge of the work trace lives here; the charging conventions: its section
of ``docs/reference-server.md#what-a-forward-costs``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass

import torch

BYTES_PER_ELEMENT = 2  # bf16


@dataclass(frozen=True)
class LayerShape:
    """Work-relevant sizes of one decoder layer."""

    kind: str  # "full_attention" | "linear_attention"
    mixer_matmul_params: int  # token mixer (attention or linear attention) matrices
    mlp_dense_matmul_params: int  # dense MLP, or router + shared expert of an MoE layer
    small_params: int  # norms, biases, decay rates: read every step, no matmul
    expert_params: int  # one routed expert (0 for a dense layer)
    num_experts: int
    experts_per_token: int
    kv_elems_per_token: int  # K + V elements per cached token (full attention)
    attn_flops_per_pair: int  # FLOPs per (query token, context token) pair
    state_elems_per_row: int  # linear attention: conv + recurrent state elements per row
    state_flops_per_token: int  # linear attention: recurrent update + readout per token


@dataclass(frozen=True)
class StepCost:
    """Bytes and FLOPs of one step."""

    weight_bytes: int
    kv_bytes: int
    flops: int


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a loaded model that the work trace needs."""

    architecture: str
    num_params: int
    hidden_size: int
    vocab_size: int
    embed_params: int
    lm_head_params: int
    final_norm_params: int
    layers: tuple[LayerShape, ...]

    @property
    def num_layers(self) -> int:
        """Number of decoder layers."""
        return len(self.layers)

    @property
    def is_moe(self) -> bool:
        """Whether any layer has routed experts."""
        return any(layer.num_experts for layer in self.layers)

    def to_json(self) -> dict[str, object]:
        """A JSON-friendly summary for ``/server_info``'s ``model_shape``."""
        first_moe = next((layer for layer in self.layers if layer.num_experts), None)
        return {
            "architecture": self.architecture,
            "num_params": self.num_params,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "layer_types": [layer.kind for layer in self.layers],
            "num_experts": first_moe.num_experts if first_moe else 0,
            "num_experts_per_tok": first_moe.experts_per_token if first_moe else 0,
            "expert_params": first_moe.expert_params if first_moe else 0,
            "weight_bytes_bf16": self.num_params * BYTES_PER_ELEMENT,
            "layers": [asdict(layer) for layer in self.layers],
        }

    def step_cost(
        self,
        query_tokens: Sequence[int],
        context_lens: Sequence[int],
        logit_rows: int,
        distinct_tokens: int,
        experts_touched: Sequence[int] | None = None,
        per_position_states: bool = False,
    ) -> StepCost:
        """Cost of one forward over ``len(query_tokens)`` rows. ``experts_touched[l]``: distinct
        experts layer ``l`` ran (when missing, the worst case ``min(E, tokens * top_k)`` is
        charged); ``per_position_states`` marks a verify step, where linear attention writes one
        state per query token."""
        tokens = int(sum(query_tokens))
        pair_sum = sum(q * c + q * (q + 1) // 2 for q, c in zip(query_tokens, context_lens))
        kv_tokens = sum(q + c for q, c in zip(query_tokens, context_lens))
        state_touches = sum(
            int(c > 0) + (q if per_position_states else 1)
            for q, c in zip(query_tokens, context_lens)
        )
        weight_elems = self.final_norm_params + distinct_tokens * self.hidden_size
        flop_count = kv_elems = 0
        for idx, layer in enumerate(self.layers):
            weight_elems += (
                layer.mixer_matmul_params + layer.mlp_dense_matmul_params + layer.small_params
            )
            flop_count += 2 * tokens * (layer.mixer_matmul_params + layer.mlp_dense_matmul_params)
            if layer.num_experts:
                touched = min(layer.num_experts, tokens * layer.experts_per_token)
                if experts_touched is not None and idx < len(experts_touched):
                    touched = int(experts_touched[idx])
                weight_elems += touched * layer.expert_params
                flop_count += 2 * tokens * layer.experts_per_token * layer.expert_params
            if layer.kind == "linear_attention":
                flop_count += tokens * layer.state_flops_per_token
                kv_elems += layer.state_elems_per_row * state_touches
            else:
                flop_count += layer.attn_flops_per_pair * pair_sum
                kv_elems += layer.kv_elems_per_token * kv_tokens
        if logit_rows > 0:
            weight_elems += self.lm_head_params
            flop_count += 2 * logit_rows * self.lm_head_params
        return StepCost(
            weight_bytes=int(weight_elems * BYTES_PER_ELEMENT),
            kv_bytes=int(kv_elems * BYTES_PER_ELEMENT),
            flops=int(flop_count),
        )


def _numel(module: torch.nn.Module | None, matmul: bool) -> int:
    return (
        0
        if module is None
        else sum(p.numel() for p in module.parameters() if (p.ndim >= 2) == matmul)
    )


def _cfg(config: object, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return default


def _layer_shape(layer: torch.nn.Module, kind: str, config: object) -> LayerShape:
    mixer = getattr(layer, "self_attn", None) or getattr(layer, "linear_attn", None)
    if mixer is None:
        mixer = next((m for n, m in layer.named_children() if "attn" in n or "mixer" in n), None)
    mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
    experts = getattr(mlp, "experts", None) if mlp is not None else None
    expert_params = num_experts = top_k = 0
    mlp_dense = _numel(mlp, matmul=True)
    if experts is not None:
        num_experts = _cfg(config, "num_experts", "num_local_experts", "n_routed_experts")
        if isinstance(experts, torch.nn.ModuleList):
            num_experts = num_experts or len(experts)
        expert_params = sum(p.numel() for p in experts.parameters()) // max(num_experts, 1)
        top_k = _cfg(config, "num_experts_per_tok", "top_k", default=1)
        mlp_dense -= sum(p.numel() for p in experts.parameters() if p.ndim >= 2)
    small = sum(p.numel() for p in layer.parameters() if p.ndim < 2)
    heads = _cfg(config, "num_attention_heads")
    head_dim = _cfg(config, "head_dim") or _cfg(config, "hidden_size") // max(heads, 1)
    kv_heads = _cfg(config, "num_key_value_heads") or heads
    kv_elems = attn_pair = state_elems = state_flops = 0
    if kind == "linear_attention":
        nv, nk = _cfg(config, "linear_num_value_heads"), _cfg(config, "linear_num_key_heads")
        dk, dv = _cfg(config, "linear_key_head_dim"), _cfg(config, "linear_value_head_dim")
        kernel = _cfg(config, "linear_conv_kernel_dim", default=4)
        conv_dim = 2 * nk * dk + nv * dv
        state_elems = conv_dim * kernel + nv * dk * dv
        # decay + delta update (~4 dk dv) and the readout q^T S (2 dk dv), per value head
        state_flops = 6 * nv * dk * dv
    else:
        kv_elems = 2 * kv_heads * head_dim
        attn_pair = 4 * heads * head_dim
    return LayerShape(
        kind=kind,
        mixer_matmul_params=_numel(mixer, matmul=True),
        mlp_dense_matmul_params=mlp_dense,
        small_params=small,
        expert_params=expert_params,
        num_experts=num_experts,
        experts_per_token=top_k,
        kv_elems_per_token=kv_elems,
        attn_flops_per_pair=attn_pair,
        state_elems_per_row=state_elems,
        state_flops_per_token=state_flops,
    )


def model_shape(model: torch.nn.Module) -> ModelShape:
    """Read a :class:`ModelShape` from a Hugging Face causal LM."""
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    decoder = model.get_decoder()
    layers = list(decoder.layers)
    kinds = list(getattr(config, "layer_types", None) or ["full_attention"] * len(layers))
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    norm = getattr(decoder, "norm", None)
    return ModelShape(
        architecture=type(model).__name__,
        num_params=sum(p.numel() for p in model.parameters()),
        hidden_size=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        embed_params=embed.weight.numel(),
        lm_head_params=head.weight.numel() if head is not None else 0,
        final_norm_params=sum(p.numel() for p in norm.parameters()) if norm is not None else 0,
        layers=tuple(_layer_shape(layer, kinds[i], config) for i, layer in enumerate(layers)),
    )
