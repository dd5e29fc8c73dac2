"""Drafters: propose exactly K tokens per running row per speculative step.

* :class:`NgramDrafter` - prompt lookup in each request's own tokens (no forward pass).
* :class:`ReplayDrafter` - the drafts a request brought with it (``spec_replay_drafts``), recorded
  from an earlier speculative run: the same verify steps with no draft passes at all.
* :class:`~.draft_model.DraftModelDrafter` - a second, smaller model, K sequential greedy steps.
* :class:`~.block.BlockDrafter` - a draft model proposing a whole block in one forward.
* :class:`~.oracle.ControlledAcceptance` - any draft-pass drafter whose proposals are replaced by
  the target's own greedy continuation, corrupted with a seeded probability.
* :class:`~.oracle.ReplayedProposals` - any draft-pass drafter whose proposals are replaced by the
  recorded drafts a :class:`ReplayDrafter` would verify (the draft passes still run).

The scheduler keeps one drafter for the running batch, whose rows change every step: ``join``
appends the rows admitted in this step (prefilled; ``row.tokens`` ends with the first output
token), ``propose`` runs before each verify, ``after_verify`` reports what each row accepted and
committed, and ``select_rows`` drops the rows that finished.
"""

from __future__ import annotations

from collections.abc import Sequence
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
        self.empty: list[bool] = []
        self.matched_steps = 0  # proposals that came from a real match (the rest are filler)
        self.filler_steps = 0

    def join(self, rows: Sequence[Row]) -> None:
        """Index every new row's tokens."""
        self.indexes.extend(NgramIndex(r.tokens, self.min_window, self.max_window) for r in rows)

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """Look every row up in its own index."""
        out = []
        self.empty = []
        for index in self.indexes:
            drafts, matched = index.propose(self.k)
            if matched:
                self.matched_steps += 1
            else:
                self.filler_steps += 1
            self.empty.append(not matched)
            out.append(drafts)
        return out

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Index the newly committed tokens."""
        for index, new in zip(self.indexes, committed):
            index.extend(new)

    def select_rows(self, keep: Sequence[int]) -> None:
        """Drop finished rows."""
        self.indexes = [self.indexes[i] for i in keep]


class ReplayDrafter:
    """Verify-only runs: step ``i`` of a request verifies the ``i``-th drafts it brought along.

    Given the same drafts over the same committed context, the target accepts the same number,
    so the run repeats the recorded run's verify steps exactly, minus every draft pass (and the
    draft model's prefill). Recorded drafts shorter than K are padded with their last token, and
    a request that runs out (or brought none) gets filler (its last token); both are counted in
    :attr:`misses` (``spec_replay_misses`` in ``/server_info``): a replay that misses is no longer
    a like-for-like verify-only run. Record with the same K (or block size) as the replay.
    """

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
