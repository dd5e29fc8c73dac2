"""A TARGET_VERIFY path for SGLang 0.5.23's ``torch_native`` attention backend, which has none.

In a verify step the target runs the ``n`` draft tokens of each request at once. SGLang's own CPU
backend (``intel_amx_backend.py`` ``_build_extend_metadata``, which needs the compiled sgl-kernel)
defines what that means: every request extends its cached prefix (``forward_batch.seq_lens``,
which excludes the draft tokens) by ``n`` tokens; the prefix is visible to every draft token; among
the draft tokens, a token sees the tokens the speculative input's ``custom_mask`` marks (its tree
ancestors and itself), or all earlier ones (causal) when the drafts form a chain
(``spec_info.tree_topk == 1``) or there is no mask. This module computes exactly that with
``scaled_dot_product_attention``, reading the prefix's keys and values through ``req_to_token``
and the draft tokens' at ``out_cache_loc``, where this forward has just written them. Written for
pytest-specenergy; no code here is SGLang's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention


def draft_visibility(
    custom_mask: torch.Tensor | None, batch: int, draft_tokens: int, tree_topk: int
) -> torch.Tensor:
    """``(batch, n, n)`` bool: which draft tokens each draft token attends to."""
    n = draft_tokens
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if tree_topk == 1 or custom_mask is None or custom_mask.numel() == 0:
        return causal.expand(batch, n, n)
    # SGLang's CPU workers build an n x n mask per request (USE_FULL_MASK is off on CPU); a
    # token always sees itself.
    mask = custom_mask.reshape(-1)[: batch * n * n].view(batch, n, n).to(torch.bool)
    return mask | torch.eye(n, dtype=torch.bool)


def verify_attention(
    query: torch.Tensor,
    output: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    draft_cache_loc: torch.Tensor,
    visibility: torch.Tensor,
    scaling: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """Attention of each request's ``n`` draft tokens (``query`` rows ``b*n .. b*n+n-1``, shape
    ``[tokens, heads, dim]``) over its cached prefix and the draft tokens ``visibility[b]``
    allows; written into ``output`` (``[tokens, heads, v_dim]``) and returned."""
    batch, n, _ = visibility.shape
    for b in range(batch):
        prefix = int(prefix_lens[b])
        row = int(req_pool_indices[b])
        slots = torch.cat(
            [req_to_token[row, :prefix].to(torch.int64), draft_cache_loc[b * n : (b + 1) * n]]
        )
        q = query[b * n : (b + 1) * n].movedim(0, 1)  # [heads, n, dim]
        k = k_cache[slots].movedim(0, 1).to(q.dtype)  # [kv_heads, prefix + n, dim]
        v = v_cache[slots].movedim(0, 1).to(q.dtype)
        mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool), visibility[b]], dim=1)
        out = scaled_dot_product_attention(
            q.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=mask,
            scale=scaling,
            enable_gqa=enable_gqa,
        )
        output[b * n : (b + 1) * n] = out.squeeze(0).movedim(0, 1)
    return output


class UnsupportedVerify(NotImplementedError):
    """A layer this verify path was not written for (cross attention, encoder-only, a sliding
    window): refused rather than computed wrongly."""


def forward_target_verify(
    backend: Any,
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool,
    write_loc: Any,
) -> torch.Tensor:
    """``TorchNativeAttnBackend.forward_extend`` for a TARGET_VERIFY batch: store the draft
    tokens' keys and values at ``out_cache_loc`` as the backend's extend does (``write_loc`` is
    SGLang's ``KVWriteLoc`` for it), then :func:`verify_attention`."""
    window = getattr(layer, "sliding_window_size", None)
    if layer.is_cross_attention or (window is not None and window > -1):
        raise UnsupportedVerify(
            f"the specenergy overlay's TARGET_VERIFY path has no cross attention or sliding "
            f"window (layer {layer.layer_id}); it was written for the tests' tiny Llama"
        )
    if layer.qk_head_dim != layer.v_head_dim:
        o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
    else:
        o = torch.empty_like(q)
    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(layer, write_loc, k, v)
    spec = forward_batch.spec_info
    batch = int(forward_batch.batch_size)
    visibility = draft_visibility(spec.custom_mask, batch, spec.draft_token_num, spec.tree_topk)
    verify_attention(
        q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
        o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        backend.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices,
        forward_batch.seq_lens,
        forward_batch.out_cache_loc.to(torch.int64),
        visibility,
        layer.scaling,
        layer.tp_q_head_num != layer.tp_k_head_num,
    )
    return o
