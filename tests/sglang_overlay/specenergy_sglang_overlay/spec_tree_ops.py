"""CPU versions of the three ``sgl_kernel`` draft-tree ops SGLang 0.5.23's NGRAM verify step calls
on a CPU engine. Written for pytest-specenergy from the semantics of SGLang's own Triton kernels
(named on each function); no code here is SGLang's. Outputs are written in place.

Index conventions, as in SGLang: a request's draft tree has ``n`` nodes (node 0 is the last
verified token, the root); a node's *retrieve index* is its flat index ``b * n + node`` into the
batch's ``(bs, n)`` tensors; ``-1`` means "none".
"""

from __future__ import annotations

import torch


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """From each request's ``n x n`` ancestor mask (``tree_mask[b, i, j]``: node j is an ancestor
    of node i, read for j < i only), fill: position = depth + verified length; retrieve index =
    ``b * n + node``; next token = the node's first child; next sibling = the next node with the
    same parent (none for the root).

    SGLang's reference: ``_reconstruct_tree_mask_kernel`` (Triton, ``sglang/kernels/ops/
    speculative/reconstruct_tree.py``, whose docstring states this contract); its CPU caller is
    ``NGRAMWorker._prepare_for_speculative_decoding``."""
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).to(torch.bool)
    nodes = torch.arange(n)
    below = nodes[None, :] < nodes[:, None]  # [i, j]: j < i
    ancestors = mask & below  # strict ancestors only: the diagonal and above are ignored
    depth = ancestors.sum(dim=2)
    positions.view(-1)[: bs * n] = (depth + verified_seq_len[:bs].to(torch.int64)[:, None]).view(-1)
    retrieve_index.view(-1)[: bs * n] = torch.arange(bs * n)
    # parent = the nearest (largest-index) strict ancestor, -1 for the root
    parent = torch.where(ancestors, nodes[None, None, :], -1).amax(dim=2)
    # first child of t = the smallest k with t among k's ancestors
    child_of = torch.where(ancestors, nodes[None, :, None], n).amin(dim=1)
    next_token = torch.where(child_of < n, child_of, -1)
    # next sibling of t = the smallest k > t with the same parent; none for the root
    same_parent = (parent[:, :, None] == parent[:, None, :]) & below[None]  # [b, k, t]: k > t
    sibling = torch.where(same_parent, nodes[None, :, None], n).amin(dim=1)
    next_sibling = torch.where((parent >= 0) & (sibling < n), sibling, -1)
    retrieve_next_token.view(-1)[: bs * n] = next_token.reshape(-1)
    retrieve_next_sibling.view(-1)[: bs * n] = next_sibling.reshape(-1)


def _walk(
    candidates: list[int],
    retrieve_index: list[int],
    next_token: list[int],
    next_sibling: list[int],
    target: list[int],
    steps: int,
) -> list[int]:
    """One request's greedy walk: the accepted retrieve indices, root first. ``target`` is the
    whole batch's flat target prediction, indexed by retrieve index."""
    accepted = [retrieve_index[0]]
    node = 0
    for _ in range(1, steps):
        node = next_token[node]
        wanted = target[accepted[-1]]
        matched = False
        # The node, then its siblings in order; at most n tries per level, as in the kernel.
        for _ in range(len(candidates)):
            if node == -1:
                break
            if candidates[node] == wanted:
                accepted.append(retrieve_index[node])
                matched = True
                break
            node = next_sibling[node]
        if not matched:
            break
    return accepted


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy verification of each request's draft tree: from the root, step to the first child,
    then along its siblings, to the node whose draft token equals the target's prediction at the
    last accepted node; accept it and go on, up to ``accept_index.shape[1] - 1`` drafts. Writes
    the accepted retrieve indices (root first) into ``accept_index[b]``, their count (drafts only)
    into ``accept_token_num[b]``, and the target's prediction at every accepted node, the last
    (the bonus token) included, into ``predicts``.

    SGLang's reference: ``verify_tree_greedy_kernel_triton`` (Triton, ``sglang/kernels/ops/
    speculative/spec_tree.py``); its CPU caller is ``verify_tree_greedy_func`` there (the
    ``retrive_*`` keyword names are SGLang's)."""
    bs = candidates.shape[0]
    steps = accept_index.shape[1]
    target = target_predict.reshape(-1).tolist()
    flat_predicts = predicts.view(-1)
    for b in range(bs):
        accepted = _walk(
            candidates[b].tolist(),
            retrive_index[b].tolist(),
            retrive_next_token[b].tolist(),
            retrive_next_sibling[b].tolist(),
            target,
            steps,
        )
        for slot, index in enumerate(accepted):
            accept_index[b, slot] = index
        # Each accepted node's prediction is the token that follows it: the next accepted draft,
        # or for the last one the bonus token.
        for index in accepted:
            flat_predicts[index] = target[index]
        accept_token_num[b] = len(accepted) - 1


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact the cache locations of the accepted nodes: for every entry p of the flat
    ``accept_index`` that is not -1, in order, ``accept_out_cache_loc[k] =
    out_cache_loc[accept_index[p]]`` where k counts the accepted entries before p.

    SGLang's reference: ``fill_accept_out_cache_loc`` (Triton, ``sglang/kernels/ops/speculative/
    eagle.py``); its CPU caller ``fill_accept_out_cache_loc_func`` runs it over
    ``accept_index.numel()`` entries."""
    flat = accept_index.reshape(-1).to(torch.int64)
    counted = flat != -1  # the kernel counts entries that are not -1 ...
    dst = torch.cumsum(counted.to(torch.int64), dim=0) - counted.to(torch.int64)
    written = flat > -1  # ... and writes those above -1
    accept_out_cache_loc[dst[written]] = out_cache_loc[flat[written]].to(accept_out_cache_loc.dtype)
