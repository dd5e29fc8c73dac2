"""Drafters: propose exactly K tokens per running row per speculative step.

* :class:`NgramDrafter` - prompt lookup in each request's own tokens (no forward pass).
* :class:`DraftModelDrafter` - a second, smaller model run K sequential greedy batched steps, with
  its own :class:`~.kv.BatchKV` kept in sync with what the target accepted.

The engine calls ``start`` once a batch has been prefilled (every row's token list then ends with
the first generated token), ``propose`` before each verify step, ``after_verify`` with the number of
drafts each row accepted, and ``select_rows`` when finished rows leave the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .kv import BatchKV
from .ngram import NgramIndex
from .runner import ModelRunner

COMPACT_SLACK = 32  # holes per row tolerated before the draft cache is compacted


class Drafter(Protocol):
    """What the engine needs from a drafter."""

    def start(self, rids: Sequence[str], tokens: Sequence[Sequence[int]]) -> None:
        """A new batch: ``tokens[b]`` = prompt + first generated token of row ``b``."""

    def propose(self, tokens: Sequence[Sequence[int]]) -> list[list[int]]:
        """``K`` drafts per row, continuing ``tokens[b]`` (all committed tokens)."""

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Row ``b`` accepted ``accepted[b]`` drafts and committed ``committed[b]`` (drafts + bonus)."""

    def select_rows(self, keep: Sequence[int]) -> None:
        """Only rows ``keep`` stay in the batch (in that order)."""


class NgramDrafter:
    """Prompt lookup over each request's own prompt and output."""

    def __init__(self, k: int, min_window: int, max_window: int) -> None:
        self.k = k
        self.min_window = min_window
        self.max_window = max_window
        self.indexes: list[NgramIndex] = []
        self.matched_steps = 0  # proposals that came from a real match (the rest are filler)
        self.filler_steps = 0

    def start(self, rids: Sequence[str], tokens: Sequence[Sequence[int]]) -> None:
        """Index every row's tokens."""
        self.indexes = [NgramIndex(t, self.min_window, self.max_window) for t in tokens]

    def propose(self, tokens: Sequence[Sequence[int]]) -> list[list[int]]:
        """Look every row up in its own index."""
        out = []
        for index in self.indexes:
            drafts, matched = index.propose(self.k)
            if matched:
                self.matched_steps += 1
            else:
                self.filler_steps += 1
            out.append(drafts)
        return out

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Index the newly committed tokens."""
        for index, new in zip(self.indexes, committed):
            index.extend(new)

    def select_rows(self, keep: Sequence[int]) -> None:
        """Drop finished rows."""
        self.indexes = [self.indexes[i] for i in keep]


class DraftModelDrafter:
    """A small model drafting greedily, K batched one-token steps per verify.

    Bookkeeping per row: ``cached[b]`` committed tokens are in the draft cache; the rest (1 token,
    or 2 after a step that accepted all K drafts) are fed first. A round runs
    ``F = max(pending) + K - 1`` one-token forwards; a row that has produced its K drafts before
    the last forward feeds its own K-th draft, so the draft cache is as far ahead as possible and
    no forward ever feeds padding (padding would corrupt a recurrent state). After the verify, the
    row's rejected drafts become holes in the draft cache and, for a hybrid draft, its recurrent
    state is taken from the per-forward snapshot after its last accepted token.
    """

    def __init__(self, runner: ModelRunner, k: int, pad_id: int, stale_cache: bool = False) -> None:
        self.runner = runner
        self.k = k
        self.pad_id = pad_id
        self.stale_cache = stale_cache  # fault "stale-draft-cache"
        self.kv: BatchKV | None = None
        self.rids: list[str] = []
        self.cached: list[int] = []
        self._round: tuple[list[int], list[int], list[int], int, list[list[torch.Tensor]]] | None = None

    def start(self, rids: Sequence[str], tokens: Sequence[Sequence[int]]) -> None:
        """Prefill the draft model with every row's prompt (everything but the first output token)."""
        self.rids = list(rids)
        self.kv = BatchKV(self.runner.model, len(rids))
        prompts = [list(t[:-1]) for t in tokens]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        valid = torch.zeros((len(prompts), width), dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            valid[b, width - len(p) :] = True
        empty = torch.zeros(0, dtype=torch.long)
        self.runner.forward(self.kv, ids, valid, empty, empty, "prefill", self.rids)
        self.cached = [len(p) for p in prompts]

    def propose(self, tokens: Sequence[Sequence[int]]) -> list[list[int]]:
        """Run the draft model; see the class docstring for the schedule."""
        kv = self.kv
        assert kv is not None
        bsz = len(tokens)
        lengths = [len(t) for t in tokens]
        pending = [lengths[b] - self.cached[b] for b in range(bsz)]
        forwards = max(pending) + self.k - 1
        drafts: list[list[int]] = [[] for _ in range(bsz)]
        snapshots: list[list[torch.Tensor]] = []
        rows = torch.arange(bsz, dtype=torch.long)
        cols = torch.zeros(bsz, dtype=torch.long)
        for j in range(1, forwards + 1):
            column = [
                tokens[b][lengths[b] - pending[b] + j - 1] if j <= pending[b] else drafts[b][j - pending[b] - 1]
                for b in range(bsz)
            ]
            ids = torch.tensor(column, dtype=torch.long)[:, None]
            out = self.runner.forward(kv, ids, None, rows, cols, "draft", self.rids)
            assert out.logits is not None
            nxt = out.logits.argmax(dim=-1).tolist()
            for b in range(bsz):
                if j >= pending[b] and len(drafts[b]) < self.k:
                    drafts[b].append(int(nxt[b]))
            if kv.has_linear and j < forwards:
                snapshots.append(kv.snapshot_linear())
        fed = [forwards - p for p in pending]  # drafts each row fed into the draft cache
        self._round = (lengths, pending, fed, forwards, snapshots)
        return drafts

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Turn rejected drafts into holes and roll hybrid draft state back, row by row."""
        kv = self.kv
        assert kv is not None and self._round is not None
        lengths, pending, fed, forwards, snapshots = self._round
        self._round = None
        keep = [min(int(a), f) for a, f in zip(accepted, fed)]
        if not self.stale_cache:
            kv.drop_last([f - v for f, v in zip(fed, keep)])
            if kv.has_linear:
                # state after forward number pending+keep; the last forward's state is the live one
                for j in range(1, forwards):
                    rows = torch.tensor([p + v == j for p, v in zip(pending, keep)], device=kv.device)
                    if bool(rows.any()):
                        kv.restore_linear_rows(snapshots[j - 1], rows)
        self.cached = [n + v for n, v in zip(lengths, keep)]
        kv.compact_if_needed(COMPACT_SLACK)

    def select_rows(self, keep: Sequence[int]) -> None:
        """Drop finished rows from the draft cache."""
        if self.kv is not None:
            self.kv.select_rows(keep)
        self.rids = [self.rids[i] for i in keep]
        self.cached = [self.cached[i] for i in keep]
