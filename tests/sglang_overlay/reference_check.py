"""Check every op of the overlay against SGLang 0.5.23's own reference on random inputs.

    TRITON_INTERPRET=1 .sglang-envs/0.5.23/bin/python tests/sglang_overlay/reference_check.py

Runs in the 0.5.23 environment (tests/sglang/test_sglang_overlay.py starts it). Each ``sgl_kernel``
op is compared with the Triton kernel SGLang runs in its place on a GPU, executed by Triton's
interpreter on the CPU (``TRITON_INTERPRET=1``), on the same seeded random inputs; every output
tensor must be equal. The TARGET_VERIFY attention is compared with SGLang's own ``torch_native``
extend (``TorchNativeAttnBackend._run_sdpa_forward_extend``, unpatched): a draft chain verified at
once must equal extending the prefix by the chain, and a draft-tree node must equal extending the
prefix by that node's path from the root.

Each comparison also runs on a *mutant*, the overlay's op with one plausible bug, and must report
it: a check that passes a broken op proves nothing. ``changed`` counts the cases where SGLang's
kernel changed an output at all (so that equal outputs are not two no-ops). Finally the overlay is
activated here, as in a server, and its names are read back from ``sgl_kernel`` and SGLang's
backend. Prints one JSON object: ``{"ops": {name: {"cases", "mismatches", "changed", "first"}},
"mutants": {name: mismatches}, "activation": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from typing import Callable

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from specenergy_sglang_overlay import kv_cache_ops  # noqa: E402
from specenergy_sglang_overlay import spec_tree_ops  # noqa: E402
from specenergy_sglang_overlay import verify_attention as va  # noqa: E402

CASES = 12
Case = dict[str, torch.Tensor]


def pow2(n: int) -> int:
    """SGLang's ``next_power_of_2``."""
    return 1 << max(n - 1, 0).bit_length()


def clone(case: Case) -> Case:
    return {k: v.clone() for k, v in case.items()}


def differences(ours: Case, theirs: Case, outputs: tuple[str, ...]) -> list[str]:
    """The output tensors that differ, with both values."""
    return [
        f"{name}: overlay {ours[name].tolist()} vs SGLang {theirs[name].tolist()}"
        for name in outputs
        if not torch.equal(ours[name], theirs[name])
    ]


# -- cache-index ops --------------------------------------------------------------------------
def index_case(g: torch.Generator, gather: bool) -> Case:
    bs = int(torch.randint(1, 7, (1,), generator=g))
    rows, pool_len = 8, 64
    starts = torch.randint(0, 40, (bs,), generator=g)
    ends = starts + torch.randint(0, 12, (bs,), generator=g)
    total = int((ends - starts).sum())
    return {
        "req_pool_indices": torch.randperm(rows, generator=g)[:bs],
        "req_to_token": (
            torch.randint(0, 10_000, (rows, pool_len), generator=g, dtype=torch.int32)
            if gather
            else torch.zeros(rows, pool_len, dtype=torch.int32)
        ),
        "start_offset": starts,
        "end_offset": ends,
        "out_cache_loc": (
            torch.zeros(total, dtype=torch.int64)
            if gather
            else torch.randint(0, 10_000, (total,), generator=g)
        ),
    }


def run_assign(case: Case, op: Callable[..., None]) -> None:
    op(*case.values(), case["req_to_token"].shape[1])


def triton_assign(case: Case) -> None:
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    bs = case["req_pool_indices"].numel()
    assign_req_to_token_pool[(bs,)](*case.values(), case["req_to_token"].shape[1], pow2(bs))


def triton_extend_locs(case: Case) -> None:
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs

    bs = case["req_pool_indices"].numel()
    assign_extend_cache_locs[(bs,)](*case.values(), case["req_to_token"].shape[1], pow2(bs))


def copy_case(g: torch.Generator) -> Case:
    slots = 40
    buffers = [
        torch.randn(slots, 2, 8, generator=g).to(dtype)
        for dtype in (torch.float32, torch.float32, torch.bfloat16, torch.bfloat16)
    ]
    count = int(torch.randint(1, 12, (1,), generator=g))
    return {
        **{f"buffer{i}": b for i, b in enumerate(buffers)},
        "tgt_loc": torch.randperm(slots, generator=g)[:count],  # targets never repeat
        "src_loc": torch.randint(0, slots, (count,), generator=g),
    }


def pointers(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    buffers = [v for k, v in case.items() if k.startswith("buffer")]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.dtype.itemsize for b in buffers])
    return ptrs, strides


def run_copy(case: Case, op: Callable[..., None]) -> None:
    op(*pointers(case), case["tgt_loc"], case["src_loc"])


def triton_copy(case: Case) -> None:
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_tiled

    ptrs, strides = pointers(case)
    count = case["tgt_loc"].numel()
    tile = 128  # SGLang's small tile; a row here is 64 or 32 bytes, one tile
    grid = (ptrs.numel(), (int(strides.max()) + tile - 1) // tile)
    copy_all_layer_kv_cache_tiled[grid](
        ptrs, strides, case["tgt_loc"], case["src_loc"], count, pow2(count), BYTES_PER_TILE=tile
    )


# -- draft-tree ops ---------------------------------------------------------------------------
def random_tree(g: torch.Generator, n: int) -> list[int]:
    """A parent per node (node 0 the root): chains, bushes and everything between."""
    shape = int(torch.randint(0, 3, (1,), generator=g))
    if shape == 0:
        return [-1] + list(range(n - 1))  # a chain, as NGRAM at breadth 1 drafts
    return [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]


def ancestor_mask(parents: list[int], noise: torch.Tensor) -> torch.Tensor:
    """``[i, j]``: j is i or an ancestor of i; above the diagonal, random noise the ops ignore."""
    n = len(parents)
    mask = noise.clone().triu(1).to(torch.bool)
    for i in range(n):
        node = i
        while node != -1:
            mask[i, node] = True
            node = parents[node]
    return mask


def tree_case(g: torch.Generator) -> tuple[Case, list[list[int]]]:
    bs = int(torch.randint(1, 5, (1,), generator=g))
    n = int(torch.randint(2, 9, (1,), generator=g))
    trees = [random_tree(g, n) for _ in range(bs)]
    masks = [ancestor_mask(p, torch.randint(0, 2, (n, n), generator=g)) for p in trees]
    case = {
        "tree_mask": torch.stack(masks).reshape(-1),
        "verified_seq_len": torch.randint(1, 100, (bs,), generator=g),
        "positions": torch.zeros(bs * n, dtype=torch.int64),
        "retrieve_index": torch.zeros(bs, n, dtype=torch.int64),
        "retrieve_next_token": torch.zeros(bs, n, dtype=torch.int64),
        "retrieve_next_sibling": torch.zeros(bs, n, dtype=torch.int64),
    }
    return case, trees


def run_reconstruct(case: Case, op: Callable[..., None]) -> None:
    bs, n = case["retrieve_index"].shape
    op(*case.values(), bs, n)


def triton_reconstruct(case: Case) -> None:
    from sglang.kernels.ops.speculative.reconstruct_tree import (
        reconstruct_indices_from_tree_mask_triton,
    )

    bs, n = case["retrieve_index"].shape
    reconstruct_indices_from_tree_mask_triton(*case.values(), bs, n)


def verify_case(g: torch.Generator) -> Case:
    """A tree from the SGLang-checked reconstruction, candidates from a small vocabulary and
    target predictions that often follow a child, so walks accept 0 to n-1 drafts."""
    tree, _ = tree_case(g)
    triton_reconstruct(tree)
    bs, n = tree["retrieve_index"].shape
    steps = int(torch.randint(2, n + 1, (1,), generator=g))
    candidates = torch.randint(0, 4, (bs, n), generator=g)
    target = torch.randint(0, 4, (bs, n), generator=g)
    return {
        "predicts": torch.zeros(bs * n, dtype=torch.int32),
        "accept_index": torch.full((bs, steps), -1, dtype=torch.int32),
        "accept_token_num": torch.zeros(bs, dtype=torch.int32),
        "candidates": candidates,
        "retrive_index": tree["retrieve_index"],
        "retrive_next_token": tree["retrieve_next_token"],
        "retrive_next_sibling": tree["retrieve_next_sibling"],
        "target_predict": target,
    }


def run_verify(case: Case, op: Callable[..., None]) -> None:
    op(**case)


def triton_verify(case: Case) -> None:
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    args = {k.replace("retrive_", "retrieve_"): v for k, v in case.items()}
    verify_tree_greedy_triton(**args)


def accept_case(g: torch.Generator) -> Case:
    bs = int(torch.randint(1, 6, (1,), generator=g))
    steps = int(torch.randint(1, 6, (1,), generator=g))
    index = torch.full((bs, steps), -1, dtype=torch.int32)
    for b in range(bs):
        accepted = int(torch.randint(1, steps + 1, (1,), generator=g))
        index[b, :accepted] = torch.randperm(bs * 8, generator=g)[:accepted].to(torch.int32)
    return {
        "accept_index": index,
        "out_cache_loc": torch.randint(0, 10_000, (bs * 8,), generator=g),
        "accept_out_cache_loc": torch.zeros(bs * steps, dtype=torch.int64),
    }


def run_accept(case: Case, op: Callable[..., None]) -> None:
    op(*case.values())


def triton_accept(case: Case) -> None:
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc

    size = case["accept_index"].numel()
    fill_accept_out_cache_loc[(size,)](*case.values(), pow2(size))


# -- mutants: each op with one plausible bug --------------------------------------------------
def mutant_assign(*args: Any) -> None:
    """Request i's slice taken from offset 0 (the prefix sum forgotten)."""
    req, table, start, end, out, pool_len = args
    flat = table.view(-1)
    for row, s, e in zip(req.tolist(), start.tolist(), end.tolist()):
        flat[row * pool_len + s : row * pool_len + e] = out[: e - s]


def mutant_extend_locs(*args: Any) -> None:
    """Gathers one column late."""
    req, table, start, end, out, pool_len = args
    kv_cache_ops.assign_extend_cache_locs_cpu(req, table, start + 1, end + 1, out, pool_len)


def mutant_copy(ptrs: Any, strides: Any, tgt: Any, src: Any) -> None:
    """Copies in the wrong direction."""
    kv_cache_ops.copy_all_layer_kv_cache_cpu(ptrs, strides, src, tgt)


def mutant_reconstruct(mask: Any, lens: Any, *rest: Any) -> None:
    """Reads the whole mask row, the diagonal and the noise above it included."""
    bs, n = rest[-2], rest[-1]
    spec_tree_ops.reconstruct_indices_from_tree_mask(mask, lens, *rest)
    depth = mask.view(bs, n, n).to(torch.int64).sum(dim=2)
    rest[0].view(-1)[: bs * n] = (depth + lens[:, None]).view(-1)


def mutant_verify(**case: Any) -> None:
    """Forgets the bonus token's prediction at the last accepted node."""
    predicts = case["predicts"]
    before = predicts.clone()
    spec_tree_ops.verify_tree_greedy_cpu(**case)
    for b in range(case["accept_index"].shape[0]):
        last = int(case["accept_index"][b, int(case["accept_token_num"][b])])
        predicts[last] = before[last]


def mutant_accept(index: Any, out: Any, accepted: Any) -> None:
    """Keeps each request's padding slots (no compaction)."""
    flat = index.reshape(-1).to(torch.int64)
    keep = flat > -1
    positions = torch.arange(flat.numel())[keep]
    accepted[positions] = out[flat[keep]]


# -- TARGET_VERIFY attention ------------------------------------------------------------------
def sglang_extend(query: torch.Tensor, kv: dict[str, Any], row: torch.Tensor, prefix: int):
    """SGLang's own torch_native extend of one request (unpatched): ``query`` rows extend the
    prefix of ``row``'s first ``prefix`` slots; returns its output rows."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    length = prefix + query.shape[0]
    table = torch.zeros(1, 256, dtype=torch.int64)
    table[0, :length] = row[:length]
    output = torch.empty(query.shape[0], query.shape[1], kv["k"].shape[2])
    # The method reads nothing of its backend but the sliding-window helper, unused here.
    backend = object.__new__(TorchNativeAttnBackend)
    return backend._run_sdpa_forward_extend(
        query,
        output,
        kv["k"],
        kv["v"],
        table,
        torch.tensor([0]),
        torch.tensor([length]),
        torch.tensor([prefix]),
        torch.tensor([query.shape[0]]),
        scaling=kv["scale"],
        enable_gqa=True,
        causal=True,
    )


def attention_case(g: torch.Generator) -> dict[str, Any]:
    bs = int(torch.randint(1, 4, (1,), generator=g))
    n = int(torch.randint(2, 7, (1,), generator=g))
    heads, kv_heads, dim, slots = 4, 2, 8, 256
    prefixes = torch.randint(1, 30, (bs,), generator=g)
    table = torch.stack([torch.randperm(slots, generator=g)[:64] for _ in range(bs)])
    trees = [random_tree(g, n) for _ in range(bs)]
    masks = torch.stack([ancestor_mask(t, torch.zeros(n, n)) for t in trees])
    return {
        "query": torch.randn(bs * n, heads, dim, generator=g),
        "k": torch.randn(slots, kv_heads, dim, generator=g),
        "v": torch.randn(slots, kv_heads, dim, generator=g),
        "scale": 0.35,
        "table": table,
        "prefixes": prefixes,
        "draft_loc": torch.cat([table[b, p : p + n] for b, p in enumerate(prefixes.tolist())]),
        "trees": trees,
        "custom_mask": masks.reshape(-1),
        "n": n,
    }


def overlay_attention(case: dict[str, Any], visibility: torch.Tensor, prefix_shift: int = 0):
    output = torch.empty_like(case["query"])
    return va.verify_attention(
        case["query"],
        output,
        case["k"],
        case["v"],
        case["table"],
        torch.arange(case["table"].shape[0]),
        case["prefixes"] + prefix_shift,
        case["draft_loc"],
        visibility,
        case["scale"],
        True,
    )


def attention_differences(case: dict[str, Any], ours: torch.Tensor) -> list[str]:
    """Each draft node's output against SGLang extending the prefix by the node's root path."""
    n, problems = case["n"], []
    for b, parents in enumerate(case["trees"]):
        prefix = int(case["prefixes"][b])
        for node in range(n):
            path = [node]
            while parents[path[-1]] != -1:
                path.append(parents[path[-1]])
            path.reverse()
            row = torch.cat(
                [case["table"][b, :prefix], case["table"][b, prefix + torch.tensor(path)]]
            )
            theirs = sglang_extend(case["query"][[b * n + p for p in path]], case, row, prefix)[-1]
            if not torch.allclose(ours[b * n + node], theirs, atol=1e-5, rtol=1e-5):
                problems.append(f"request {b} node {node} (path {path}): differs")
    return problems


def check_attention(mutant: str | None, cases: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    mismatches, trees, first = 0, 0, None
    for _ in range(cases):
        case = attention_case(g)
        # a case with a real tree (not only chains), where the mask matters
        trees += any(t != [-1, *range(case["n"] - 1)] for t in case["trees"])
        bs, n = case["table"].shape[0], case["n"]
        visibility = va.draft_visibility(case["custom_mask"], bs, n, tree_topk=-1)
        if mutant == "causal-only":  # the tree mask ignored: a chain's path, a tree's not
            visibility = va.draft_visibility(case["custom_mask"], bs, n, tree_topk=1)
        ours = overlay_attention(
            case, visibility, prefix_shift=-1 if mutant == "short-prefix" else 0
        )
        problems = attention_differences(case, ours)
        mismatches += bool(problems)
        first = first or (problems[:3] or None)
    return {"cases": cases, "mismatches": mismatches, "changed": trees, "first": first}


# -- the run ----------------------------------------------------------------------------------
OPS: dict[str, tuple[Callable[..., Any], Callable, Callable, Callable, tuple[str, ...]]] = {
    # name: (make a case, run an implementation, SGLang's kernel, the mutant, outputs)
    "assign_req_to_token_pool_cpu": (
        lambda g: index_case(g, gather=False),
        run_assign,
        triton_assign,
        mutant_assign,
        ("req_to_token",),
    ),
    "assign_extend_cache_locs_cpu": (
        lambda g: index_case(g, gather=True),
        run_assign,
        triton_extend_locs,
        mutant_extend_locs,
        ("out_cache_loc",),
    ),
    "copy_all_layer_kv_cache_cpu": (
        copy_case,
        run_copy,
        triton_copy,
        mutant_copy,
        ("buffer0", "buffer1", "buffer2", "buffer3"),
    ),
    "speculative.reconstruct_indices_from_tree_mask": (
        lambda g: tree_case(g)[0],
        run_reconstruct,
        triton_reconstruct,
        mutant_reconstruct,
        ("positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling"),
    ),
    "verify_tree_greedy_cpu": (
        verify_case,
        run_verify,
        triton_verify,
        mutant_verify,
        ("predicts", "accept_index", "accept_token_num"),
    ),
    "fill_accept_out_cache_loc_cpu": (
        accept_case,
        run_accept,
        triton_accept,
        mutant_accept,
        ("accept_out_cache_loc",),
    ),
}
OVERLAY = {
    "assign_req_to_token_pool_cpu": kv_cache_ops.assign_req_to_token_pool_cpu,
    "assign_extend_cache_locs_cpu": kv_cache_ops.assign_extend_cache_locs_cpu,
    "copy_all_layer_kv_cache_cpu": kv_cache_ops.copy_all_layer_kv_cache_cpu,
    "speculative.reconstruct_indices_from_tree_mask": spec_tree_ops.reconstruct_indices_from_tree_mask,
    "verify_tree_greedy_cpu": spec_tree_ops.verify_tree_greedy_cpu,
    "fill_accept_out_cache_loc_cpu": spec_tree_ops.fill_accept_out_cache_loc_cpu,
}


def check_op(name: str, implementation: Callable[..., Any], cases: int) -> dict[str, Any]:
    make, run, kernel, _, outputs = OPS[name]
    g = torch.Generator().manual_seed(11)
    mismatches, changed, first = 0, 0, None
    for _ in range(cases):
        case = make(g)
        ours, theirs = clone(case), clone(case)
        run(ours, implementation)
        kernel(theirs)
        problems = differences(ours, theirs, outputs)
        mismatches += bool(problems)
        changed += bool(differences(case, theirs, outputs))
        first = first or (problems or None)
    return {"cases": cases, "mismatches": mismatches, "changed": changed, "first": first}


def activation() -> dict[str, Any]:
    """Activate the overlay in this process, as its sitecustomize does in a server, and read back
    what SGLang will see: each ``sgl_kernel`` name and the backend's ``forward_extend``."""
    import importlib

    import specenergy_sglang_overlay as overlay

    overlay.activate()
    import sgl_kernel

    installed = {}
    for attribute, (module_name, function_name) in overlay.OPS.items():
        *parents, leaf = attribute.split(".")
        owner = importlib.import_module(".".join(["sgl_kernel", *parents]))
        expected = getattr(
            importlib.import_module(f"{overlay.__name__}.{module_name}"), function_name
        )
        installed[attribute] = getattr(getattr(owner, leaf), "__wrapped__", None) is expected
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    extend = TorchNativeAttnBackend.forward_extend
    return {
        "ops_installed": installed,
        "standin": sgl_kernel.__file__,
        # functools.wraps copies the name and module; the code object says whose it is
        "forward_extend_patched": Path(extend.__code__.co_filename).parent
        == Path(overlay.__file__).parent,
    }


def main() -> None:
    started = time.perf_counter()
    report: dict[str, Any] = {"ops": {}, "mutants": {}}
    for name, implementation in OVERLAY.items():
        report["ops"][name] = check_op(name, implementation, CASES)
        report["mutants"][name] = check_op(name, OPS[name][3], CASES)["mismatches"]
    report["ops"]["TorchNativeAttnBackend TARGET_VERIFY"] = check_attention(None, CASES)
    for mutant in ("causal-only", "short-prefix"):
        report["mutants"][f"TARGET_VERIFY {mutant}"] = check_attention(mutant, CASES)["mismatches"]
    report["activation"] = activation()
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
