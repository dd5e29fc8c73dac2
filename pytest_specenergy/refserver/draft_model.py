"""Drafters that run a draft model: cache bookkeeping (:class:`DraftCache`), the chain and the block
drafter.

Prefilling joining rows, the block's shape, context and rollback: ``docs/reference-server.md``,
sections "The chain drafter" and "The block drafter"."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .kv import BatchKV
from .rows import Row
from .runner import ModelRunner

COMPACT_SLACK = 32  # holes per row tolerated before the draft cache is compacted


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class DraftCache:
    """A draft model's cache over the running batch (base of the draft-model drafters)."""

    def __init__(self, runner: ModelRunner, k: int, pad_id: int) -> None:
        self.runner = runner
        self.k = k
        self.pad_id = pad_id
        self.kv = BatchKV(runner.model, 0)
        self.rids: list[str] = []
        self.cached: list[int] = []
        self.empty: list[bool] = []

    def join(self, rows: Sequence[Row]) -> None:
        """Prefill the draft model on the new rows' prompts (one left-padded forward)."""
        if not rows:
            return
        prompts = [list(r.request.input_ids) for r in rows]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        valid = torch.zeros((len(rows), width), dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            valid[b, width - len(p) :] = True
        fresh = BatchKV(self.runner.model, len(rows))
        empty = torch.zeros(0, dtype=torch.long)
        rids = [r.rid for r in rows]
        self.runner.forward(fresh, ids, valid, empty, empty, "prefill", rids)
        self.kv.merge(fresh)
        self.rids.extend(rids)
        self.cached.extend(len(p) for p in prompts)

    def select_rows(self, keep: Sequence[int]) -> None:
        """Drop finished rows from the draft cache."""
        self.kv.select_rows(keep)
        self.rids = [self.rids[i] for i in keep]
        self.cached = [self.cached[i] for i in keep]


class DraftModelDrafter(DraftCache):
    """A small model drafting greedily, K batched one-token steps per verify (the schedule, and why
    no forward feeds padding: its section of ``docs/reference-server.md#the-chain-drafter``)."""

    def __init__(self, runner: ModelRunner, k: int, pad_id: int, stale_cache: bool = False) -> None:
        super().__init__(runner, k, pad_id)
        self.stale_cache = stale_cache  # fault "stale-draft-cache"
        self._round: (
            tuple[list[int], list[int], list[int], int, list[list[torch.Tensor]], list[list[int]]]
            | None
        )
        self._round = None

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """Run the draft model: ``max(pending) + K - 1`` one-token forwards."""
        kv = self.kv
        tokens = [r.tokens for r in rows]
        bsz = len(tokens)
        lengths = [len(t) for t in tokens]
        pending = [lengths[b] - self.cached[b] for b in range(bsz)]
        forwards = max(pending) + self.k - 1
        drafts: list[list[int]] = [[] for _ in range(bsz)]
        snapshots: list[list[torch.Tensor]] = []
        b_idx = torch.arange(bsz, dtype=torch.long)
        cols = torch.zeros(bsz, dtype=torch.long)
        for j in range(1, forwards + 1):
            column = [
                tokens[b][lengths[b] - pending[b] + j - 1]
                if j <= pending[b]
                else drafts[b][j - pending[b] - 1]
                for b in range(bsz)
            ]
            ids = torch.tensor(column, dtype=torch.long)[:, None]
            out = self.runner.forward(kv, ids, None, b_idx, cols, "draft", self.rids)
            assert out.logits is not None
            nxt = out.logits.argmax(dim=-1).tolist()
            for b in range(bsz):
                # a row past its K drafts keeps drafting: it has a token to feed
                if j >= pending[b]:
                    drafts[b].append(int(nxt[b]))
            if kv.has_linear and j < forwards:
                snapshots.append(kv.snapshot_linear())
        fed = [forwards - p for p in pending]  # drafts each row fed into the draft cache
        self._round = (lengths, pending, fed, forwards, snapshots, drafts)
        self.empty = [False] * bsz
        return [d[: self.k] for d in drafts]

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Turn drafts that were not committed into holes; roll hybrid draft state back, row by row
        (which drafts a row keeps: the section of ``docs/reference-server.md#the-chain-drafter``)."""
        kv = self.kv
        assert self._round is not None
        lengths, pending, fed, forwards, snapshots, drafts = self._round
        self._round = None
        keep = [
            min(int(a), f, common_prefix(d, c))
            for a, f, d, c in zip(accepted, fed, drafts, committed)
        ]
        if not self.stale_cache:
            kv.drop_last([f - v for f, v in zip(fed, keep)])
            if kv.has_linear:
                # state after forward number pending+keep; the last forward's state is the live one
                for j in range(1, forwards):
                    sel = torch.tensor(
                        [p + v == j for p, v in zip(pending, keep)], device=kv.device
                    )
                    if bool(sel.any()):
                        kv.restore_linear_rows(snapshots[j - 1], sel)
        self.cached = [n + v for n, v in zip(lengths, keep)]
        kv.compact_if_needed(COMPACT_SLACK)


class BlockDrafter(DraftCache):
    """One draft forward per step proposes ``block_size - 1`` drafts per row."""

    def __init__(self, runner: ModelRunner, block_size: int, pad_id: int) -> None:
        super().__init__(runner, block_size - 1, pad_id)

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """Feed ``pending + placeholders`` per row in one forward; read the drafts off it."""
        kv = self.kv
        n, k = len(rows), self.k
        pending = [r.tokens[c:] for r, c in zip(rows, self.cached)]
        width = max(len(p) for p in pending) + k
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        valid = torch.zeros((n, width), dtype=torch.bool)
        r_idx: list[int] = []
        c_idx: list[int] = []
        for b, p in enumerate(pending):
            block = [*p, *([self.pad_id] * k)]  # the pending tokens, then k placeholders
            ids[b, : len(block)] = torch.tensor(block, dtype=torch.long)
            valid[b, : len(block)] = True
            r_idx.extend([b] * k)
            c_idx.extend(range(len(p) - 1, len(p) - 1 + k))
        snapshot = kv.snapshot_linear() if kv.has_linear else []
        out = self.runner.forward(
            kv,
            ids,
            valid,
            torch.tensor(r_idx),
            torch.tensor(c_idx),
            "draft",
            self.rids,
            capture_linear=kv.has_linear,
        )
        assert out.logits is not None
        drafts = out.logits.view(n, k, -1).argmax(dim=-1).tolist()
        keep = [len(p) for p in pending]
        kv.keep_first_of_last(width, keep)
        if kv.has_linear:
            self.runner.rollback_linear(kv, snapshot, keep, width)
        self.cached = [len(r.tokens) for r in rows]
        kv.compact_if_needed(COMPACT_SLACK)
        self.empty = [False] * n
        return [[int(t) for t in d] for d in drafts]

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Nothing to undo: the committed tokens are fed at the front of the next block."""
