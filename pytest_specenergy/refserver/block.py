"""The block drafter: a draft model proposes a whole block of drafts in ONE forward pass.

This is the shape of DFlash and DSpark drafters. With block size ``B`` the target verifies ``B``
positions per request and step (the last committed token + ``B - 1`` drafts, so
``verified_per_step == B`` and ``num_draft_tokens == B - 1``), and the draft model runs one
forward per step that feeds, per row, the block ``[last committed, P x (B - 1)]`` - ``P`` a
placeholder token (the pad id) standing for the positions still to be predicted. A causal HF
model reads draft ``j`` off position ``j - 1`` (the last committed token predicts ``d1``,
placeholder ``j - 1`` predicts ``d_j``), so the last placeholder's logits go unused; DFlash reads
draft ``j`` off placeholder ``j``: the same ``B`` positions fed, the same cost. With random tiny
weights drafts after the first are mostly wrong: acceptance is low, which is fine for the machinery.

Context: the draft cache holds every committed token but the ones committed by the last verify
(``pending``: the accepted drafts and the bonus token). Those are fed at the front of the next
block, so a step's draft forward feeds ``pending + B - 1`` tokens per row (``B`` after a step that
accepted nothing). DFlash gets that context from the target's hidden states instead; a tiny draft
model has to run the tokens, in the same single pass. Rows are right-padded to one width, so
padding only ever follows a row's real tokens.

Rollback: placeholders and padding never stay. After the forward each row keeps exactly its
pending tokens in the draft KV (the rest become holes) and, for a hybrid draft model, its
recurrent state is restored from the snapshot taken before the forward and the pending tokens are
replayed (:meth:`.runner.ModelRunner.rollback_linear`). So the next block starts from exactly the
committed context, whatever was accepted.
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
        out = self.runner.forward(
            kv, ids, valid, torch.tensor(r_idx), torch.tensor(c_idx), "draft", self.rids, capture_linear=kv.has_linear
        )
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
