"""The block drafter: a draft model proposes a whole block of drafts in ONE forward pass.

Block shape, context and rollback: ``docs/design/refserver.md``, section
``pytest_specenergy/refserver/block.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import draft_model
from .draft_model import DraftCache
from .rows import Row
from .runner import ModelRunner


class BlockDrafter(DraftCache):
    """One draft forward per step proposes ``block_size - 1`` drafts per row."""

    def __init__(self, runner: ModelRunner, block_size: int, pad_id: int) -> None:
        super().__init__(runner, block_size - 1, pad_id)
        self.block_size = block_size
        self.placeholder = pad_id

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
            block = [*p, *([self.placeholder] * k)]
            ids[b, : len(block)] = torch.tensor(block, dtype=torch.long)
            valid[b, : len(block)] = True
            r_idx.extend([b] * k)
            c_idx.extend(range(len(p) - 1, len(p) - 1 + k))
        snapshot = kv.snapshot_linear() if kv.has_linear else []
        out = self.runner.forward(kv, ids, valid, torch.tensor(r_idx), torch.tensor(c_idx), "draft", self.rids,
                                  capture_linear=kv.has_linear)
        assert out.logits is not None
        drafts = out.logits.view(n, k, -1).argmax(dim=-1).tolist()
        keep = [len(p) for p in pending]
        kv.keep_first_of_last(width, keep)
        if kv.has_linear:
            self.runner.rollback_linear(kv, snapshot, keep, width)
        self.cached = [len(r.tokens) for r in rows]
        kv.compact_if_needed(draft_model.COMPACT_SLACK)
        self.empty = [False] * n
        return [[int(t) for t in d] for d in drafts]

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Nothing to undo: the committed tokens are fed at the front of the next block."""
