"""CPU versions of the three ``sgl_kernel`` cache-index ops SGLang 0.5.23 calls on a speculative CPU
engine. Written for pytest-specenergy from the semantics of SGLang's own Triton kernels (named on
each function); no code here is SGLang's. Each writes its outputs in place, as the kernel does.
"""

from __future__ import annotations

import ctypes

import torch


def _segments(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(start, end, out_offset)`` per request: request i's tokens sit in a packed output buffer
    after those of requests 0..i-1, as the Triton kernels compute with their prefix sum."""
    starts = [int(s) for s in start_offset.tolist()]
    ends = [int(e) for e in end_offset.tolist()]
    out, segments = 0, []
    for start, end in zip(starts, ends):
        segments.append((start, end, out))
        out += end - start
    return segments


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write request i's slice of the packed ``out_cache_loc`` into its row of ``req_to_token``,
    columns ``start_offset[i]:end_offset[i]``.

    SGLang's reference: ``assign_req_to_token_pool`` (Triton, ``sglang/srt/mem_cache/
    allocation.py``); its CPU caller is ``assign_req_to_token_pool_func`` there."""
    flat = req_to_token.view(-1)  # the kernel addresses rows as req_to_token + row * pool_len
    rows = [int(r) for r in req_pool_indices.tolist()]
    for row, (start, end, out) in zip(rows, _segments(start_offset, end_offset)):
        if end > start:
            base = row * pool_len
            flat[base + start : base + end] = out_cache_loc[out : out + end - start]


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse of :func:`assign_req_to_token_pool_cpu`: gather columns
    ``start_offset[i]:end_offset[i]`` of request i's ``req_to_token`` row into the packed
    ``out_cache_loc``.

    SGLang's reference: ``assign_extend_cache_locs`` (Triton, ``sglang/kernels/ops/speculative/
    cache_locs.py``); its CPU caller is ``assign_extend_cache_locs_func`` there."""
    flat = req_to_token.view(-1)
    rows = [int(r) for r in req_pool_indices.tolist()]
    for row, (start, end, out) in zip(rows, _segments(start_offset, end_offset)):
        if end > start:
            base = row * pool_len
            out_cache_loc[out : out + end - start] = flat[base + start : base + end]


def _rows_at(address: int, row_bytes: int, rows: int) -> torch.Tensor:
    """A ``(rows, row_bytes)`` uint8 view of the memory at ``address`` (no copy). SGLang passes
    the KV buffers as raw base pointers, so the view is made from the address, as the kernel's
    pointer arithmetic does."""
    buffer = (ctypes.c_uint8 * (rows * row_bytes)).from_address(address)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(rows, row_bytes)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every KV buffer b (base address ``data_ptrs[b]``, ``strides[b]`` bytes a slot), copy
    slot ``src_loc[i]`` to slot ``tgt_loc[i]``. All sources are read before any target is
    written, so overlapping source and target sets copy the old values, as the tiled kernel's
    load-then-store does.

    SGLang's reference: ``copy_all_layer_kv_cache_tiled`` (Triton, ``sglang/kernels/ops/kvcache/
    cache_move.py``); its CPU caller ``copy_all_layer_kv_cache_func`` passes ``tgt_loc`` and
    ``src_loc`` already cut to ``num_locs``."""
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        view = _rows_at(int(address), int(row_bytes), rows)
        view[tgt] = view[src]  # view[src] is gathered into a new tensor first
