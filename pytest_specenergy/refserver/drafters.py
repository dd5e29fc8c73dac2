"""Drafters: propose exactly K tokens per running row per speculative step.

The :class:`Drafter` protocol and the drafters without draft passes (n-gram, replay); the drafter
catalogue and the ``join``/``propose``/``after_verify``/``select_rows`` cycle: its section of
``docs/reference-server.md#drafters``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Protocol

from .ngram import NgramIndex
from .rows import Row


class Drafter(Protocol):
    """What the scheduler needs from a drafter. Row order is the running batch's order."""

    empty: list[bool]  # after propose: rows whose proposal is filler (nothing was really drafted)

    def join(self, rows: Sequence[Row]) -> None:
        """Append newly admitted rows (for a draft model: prefill it on their prompts)."""

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """``K`` drafts per row, continuing ``rows[b].tokens`` (all committed tokens)."""

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Row ``b`` accepted ``accepted[b]`` drafts and committed ``committed[b]`` (drafts +
        bonus)."""

    def select_rows(self, keep: Sequence[int]) -> None:
        """Only rows ``keep`` stay in the batch (in that order)."""


@dataclass(eq=False)
class NgramDrafter:
    """Prompt lookup over each request's own prompt and output."""

    k: int
    min_window: int
    max_window: int
    indexes: list[NgramIndex] = field(default_factory=list)
    empty: list[bool] = field(default_factory=list)

    def join(self, rows: Sequence[Row]) -> None:
        """Index every new row's tokens."""
        self.indexes.extend(NgramIndex(r.tokens, self.min_window, self.max_window) for r in rows)

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """Look every row up in its own index."""
        proposals = [index.propose(self.k) for index in self.indexes]
        self.empty = [not matched for _, matched in proposals]
        return [drafts for drafts, _ in proposals]

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Index the newly committed tokens."""
        for index, new in zip(self.indexes, committed):
            index.extend(new)

    def select_rows(self, keep: Sequence[int]) -> None:
        """Drop finished rows."""
        self.indexes = [self.indexes[i] for i in keep]


class ReplayDrafter:
    """Verify-only runs: step ``i`` of a request verifies the ``i``-th drafts it brought along
    (missing or short drafts: the section of ``docs/reference-server.md#drafters``; they count in
    :attr:`misses`, ``spec_replay_misses``)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.recorded: list[tuple[tuple[int, ...], ...]] = []
        self.cursor: list[int] = []
        self.empty: list[bool] = []
        self.misses = 0

    def join(self, rows: Sequence[Row]) -> None:
        """Take each new row's recorded drafts."""
        for row in rows:
            self.recorded.append(row.request.sampling.replay_drafts or ())
            self.cursor.append(0)

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """The next recorded drafts of every row."""
        out: list[list[int]] = []
        self.empty = []
        for b, row in enumerate(rows):
            step = self.cursor[b]
            drafts = list(self.recorded[b][step][: self.k]) if step < len(self.recorded[b]) else []
            self.empty.append(not drafts)
            if len(drafts) != self.k:  # none left, or recorded with another K: not like for like
                self.misses += 1
            fill = drafts[-1] if drafts else row.tokens[-1]
            out.append(drafts + [fill] * (self.k - len(drafts)))
        return out

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Advance every row to its next recorded step."""
        self.cursor = [c + 1 for c in self.cursor]

    def select_rows(self, keep: Sequence[int]) -> None:
        """Drop finished rows."""
        self.recorded = [self.recorded[i] for i in keep]
        self.cursor = [self.cursor[i] for i in keep]
