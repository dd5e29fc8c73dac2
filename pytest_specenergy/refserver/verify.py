"""One speculative step over the running batch: draft, verify in one target forward, accept, commit.

The step's shape, acceptance and rollback: its section of ``docs/design/refserver.md``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .drafters import Drafter
from .kv import BatchKV
from .rows import Row

if TYPE_CHECKING:
    from .engine import ReferenceEngine


def verify_step(engine: ReferenceEngine, rows: Sequence[Row], kv: BatchKV, drafter: Drafter) -> None:
    """Run one draft + verify step over ``rows`` (the running batch, in cache order)."""
    cfg = engine.config
    k = cfg.num_draft_tokens
    faults = cfg.faults
    drafts = drafter.propose(rows)
    n = len(rows)
    ids = torch.tensor([[r.tokens[-1], *d] for r, d in zip(rows, drafts)], dtype=torch.long)
    stale_fault = kv.has_linear and "stale-state-after-empty-draft" in faults
    if stale_fault:
        _read_stale_state(rows, kv, drafter.empty)
    snapshot = kv.snapshot_linear() if kv.has_linear else []
    out = engine.runner.forward(kv, ids, None, torch.arange(n).repeat_interleave(k + 1), torch.arange(k + 1).repeat(n),
                                "verify", [r.rid for r in rows], capture_linear=kv.has_linear)
    assert out.logits is not None
    logits = out.logits.view(n, k + 1, -1)
    greedy = logits.argmax(dim=-1)  # [n, K+1]: the target's choice after each fed token
    match = (greedy[:, :k] == ids[:, 1:].to(greedy.device)).long()
    accepted = match.cumprod(dim=1).sum(dim=1).tolist()
    if "accept-off-by-one" in faults:
        # the off-by-one: the first mismatching draft is accepted too, so a token the
        # target did not choose enters the output while acceptance looks better
        accepted = [min(a + 1, k) for a in accepted]
    kv.drop_last([k - a for a in accepted])
    if kv.has_linear and "skip-state-rollback" not in faults:
        if stale_fault:
            _remember_slot0_state(engine, rows, kv, snapshot, accepted, k + 1)
        # fed tokens whose recurrent update each row keeps: the last committed one and its accepted drafts
        keep = [a + 1 for a in accepted]
        if "partial-accept-state" in faults:
            # the slip: only an all-rejected step is rolled back; a partial accept keeps every fed token
            keep = [1 if a == 0 else k + 1 for a in accepted]
        engine.runner.rollback_linear(kv, snapshot, keep, k + 1)
    logp = engine.logprobs_if_asked(rows, logits.reshape(n * (k + 1), -1))
    greedy_l = greedy.tolist()
    eos = engine.target.eos_token_ids
    committed_all: list[list[int]] = []
    for b, row in enumerate(rows):
        a = int(accepted[b])
        new = [int(t) for t in drafts[b][:a]] + [int(greedy_l[b][a])]
        committed: list[int] = []
        for j, token in enumerate(new):
            committed.append(token)
            if row.commit(token, None if logp is None else logp[b * (k + 1) + j], eos):
                break
        row.count_verify(len(committed))
        if row.request.return_spec_drafts:
            row.drafts.append(tuple(int(t) for t in drafts[b]))
        engine.stats.verified(len(committed))
        committed_all.append(committed)
    drafter.after_verify(accepted, committed_all)


def _read_stale_state(rows: Sequence[Row], kv: BatchKV, empty: Sequence[bool]) -> None:
    """Fault ``stale-state-after-empty-draft``: a zero-draft step reads slot 0 of the previous verify's per-position
    states, not its last accepted token's (vLLM #39273, fixed in vLLM #52942 and SGLang #26351): wrong only after a
    step that accepted drafts, which then vanish from the state."""
    for b, row in enumerate(rows):
        if empty[b] and row.stale_state is not None:
            kv.set_row_state(b, row.stale_state)


def _remember_slot0_state(engine: ReferenceEngine, rows: Sequence[Row], kv: BatchKV, snapshot: Sequence[torch.Tensor],
                          accepted: Sequence[int], width: int) -> None:
    # Slot 0's state: restore the pre-verify snapshot and replay one token, then put the live state back.
    live = kv.snapshot_linear()
    engine.runner.rollback_linear(kv, snapshot, [1] * len(rows), width, keep_inputs=True)
    for b, row in enumerate(rows):
        row.stale_state = kv.row_state(b) if accepted[b] > 0 else None
    kv.restore_linear_rows(live, torch.ones(kv.batch_size, dtype=torch.bool, device=kv.device))
