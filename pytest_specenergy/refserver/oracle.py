"""Drafters with draft passes, and controlled acceptance for calibration (``--draft-accept-p P``).

:class:`ControlledAcceptance` and :class:`ReplayedProposals`, their oracle and its consequences for
meters: its section of ``docs/reference-server.md#controlled-acceptance-and-its-oracle``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from collections.abc import Sequence

from .draft_model import BlockDrafter
from .draft_model import DraftModelDrafter
from .drafters import Drafter
from .drafters import ReplayDrafter
from .records import EngineConfig
from .rows import Row
from .runner import ModelRunner


def build_draft_pass_drafter(
    cfg: EngineConfig,
    runner: ModelRunner,
    pad: int,
    vocab_size: int,
    oracle_runner: Callable[[], ModelRunner] | None,
) -> Drafter:
    """The chain or block drafter over ``runner``'s draft model, wrapped when acceptance is
    controlled. ``oracle_runner`` gives the target's own runner for controlled acceptance's
    truth source (asked only when acceptance is controlled); None where the draft model is the
    target itself, whose drafts are then the truth."""
    shape: DraftModelDrafter | BlockDrafter
    if cfg.drafter == "block":
        assert cfg.block_size is not None
        shape = BlockDrafter(runner, cfg.block_size, pad)
    else:
        shape = DraftModelDrafter(
            runner, cfg.num_draft_tokens, pad, stale_cache="stale-draft-cache" in cfg.faults
        )
    if cfg.replay_proposals:
        return ReplayedProposals(shape, ReplayDrafter(cfg.num_draft_tokens))
    if cfg.draft_accept_p is None:
        return shape
    oracle = None
    if oracle_runner is not None:
        oracle = DraftModelDrafter(oracle_runner(), cfg.num_draft_tokens, pad)
    return ControlledAcceptance(shape, oracle, cfg.draft_accept_p, cfg.seed, vocab_size)


class ControlledAcceptance:
    """Proposals = the target's greedy continuation, each token kept with probability ``p``."""

    def __init__(
        self,
        shape: DraftModelDrafter | BlockDrafter,
        oracle: Drafter | None,
        p: float,
        seed: int,
        vocab_size: int,
    ) -> None:
        self.shape = shape
        # the truth source; None: the shape drafter is the target itself, its drafts are the
        # oracle's
        self.oracle = oracle
        self.drafters = [shape] if oracle is None else [shape, oracle]
        self.k = shape.k
        self.p = p
        self.seed = seed
        self.vocab_size = vocab_size
        self.keys: list[bytes] = []
        self.empty: list[bool] = []

    def join(self, rows: Sequence[Row]) -> None:
        """New rows: the wrapped drafter prefills (traced); so does the oracle (untraced)."""
        for drafter in self.drafters:
            drafter.join(rows)
        for row in rows:
            prompt = b"".join(t.to_bytes(4, "little") for t in row.request.input_ids)
            self.keys.append(
                hashlib.blake2b(prompt, digest_size=16, key=str(self.seed).encode()).digest()
            )

    def corrupt(self, row: int, context_len: int, tokens: Sequence[int]) -> list[int]:
        """Keep each token with probability ``p``; otherwise swap in a different one (seeded)."""
        out = []
        for j, token in enumerate(tokens):
            key = self.keys[row] + context_len.to_bytes(8, "little") + j.to_bytes(4, "little")
            raw = hashlib.blake2b(key, digest_size=16).digest()
            u = int.from_bytes(raw[:8], "little") / 2.0**64
            if u < self.p:
                out.append(int(token))
            else:
                shift = 1 + int.from_bytes(raw[8:], "little") % (self.vocab_size - 1)
                out.append((int(token) + shift) % self.vocab_size)
        return out

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """Run the wrapped drafter (its cost), then propose the corrupted oracle continuation."""
        own = self.shape.propose(rows)
        truth = own if self.oracle is None else self.oracle.propose(rows)
        # a replayed truth can be filler (nothing recorded); an oracle's never is
        self.empty = [False] * len(rows) if self.oracle is None else list(self.oracle.empty)
        return [self.corrupt(b, len(r.tokens), truth[b]) for b, r in enumerate(rows)]

    def after_verify(self, accepted: Sequence[int], committed: Sequence[Sequence[int]]) -> None:
        """Both drafters keep the committed prefix of their own drafts."""
        for drafter in self.drafters:
            drafter.after_verify(accepted, committed)

    def select_rows(self, keep: Sequence[int]) -> None:
        """Drop finished rows."""
        for drafter in self.drafters:
            drafter.select_rows(keep)
        self.keys = [self.keys[i] for i in keep]


class ReplayedProposals(ControlledAcceptance):
    """Proposals = the drafts each request brought (``spec_replay_drafts``), verified unchanged; the
    wrapped drafter's passes run, the truth is a :class:`~.drafters.ReplayDrafter`, not an oracle."""

    def __init__(self, shape: DraftModelDrafter | BlockDrafter, replay: ReplayDrafter) -> None:
        super().__init__(shape, replay, 1.0, 0, 0)
        self.replay = replay

    @property
    def misses(self) -> int:
        """Verify steps without a recorded draft of the right size (``spec_replay_misses``)."""
        return self.replay.misses

    def corrupt(self, row: int, context_len: int, tokens: Sequence[int]) -> list[int]:
        """Keep every token: the recording already holds whatever was verified."""
        return [int(t) for t in tokens]
