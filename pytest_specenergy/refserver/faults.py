"""Fault switches: deliberate, named bugs that reproduce real failure classes.

Why they exist, and why each leaves some metric looking healthy: its section of
``docs/reference-server.md#fault-switches``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

FAULTS: dict[str, str] = {
    "skip-state-rollback": "do not roll the linear-attention (recurrent + conv) state back after "
    "rejected drafts, as NGRAM on hybrid models in SGLang <= 0.5.13: "
    "output becomes incoherent while acceptance looks normal",
    "wrong-accept-count": "count the bonus token as an accepted draft in meta_info "
    "(spec_num_correct_drafts and the histogram are inflated by one per "
    "verify step) while generating correctly",
    "stale-draft-cache": "do not crop the draft model's KV cache (nor roll back its recurrent "
    "state) after a rejection, so later drafts see rejected tokens at "
    "shifted positions: acceptance shifts (on some prompts it drops, on "
    "repetitive ones it can rise), output stays correct",
    "accept-off-by-one": "accept the first mismatching draft as well (an off-by-one in the "
    "verify comparison): tokens the target did not choose enter the output "
    "while acceptance looks better than it is",
    "numerical-noise": "perturb the target's logits in their last bits, differently for every "
    "step shape (as bf16 kernels round differently at different batch and "
    "query sizes; relative size --numerical-noise-scale, a bf16 ulp by "
    "default): greedy output diverges from the baseline only where the top-2 "
    "logits nearly tie, a numerical tie and not a speculation bug",
    "stale-state-after-empty-draft": "hybrid models: a verify step whose drafter found nothing "
    "(n-gram miss, filler drafts) right after a step that "
    "accepted drafts reads the recurrent state of the previous "
    "step's first position, as if the accepted drafts never "
    "happened (vLLM #39273, fixed in vLLM PR #52942 and SGLang "
    "PR #26351): output turns incoherent on hybrids only, "
    "counters stay consistent",
    "dead-drafter": "every draft is rejected, as a draft head loaded with the wrong weights or "
    "without its token map (EAGLE3 heads run as EAGLE, SGLang #21272; accept length stuck at 1 "
    "after an upgrade, SGLang #24795): each verify step commits only the target's own "
    "token, so the output stays exact and the counters consistent, accept length 1.00",
    "partial-accept-state": "hybrid models: a verify step that accepted some but not all of its "
    "drafts keeps the linear-attention (recurrent + conv) state the "
    "verify forward left, rejected drafts included, as if all were "
    "accepted; steps that accept every draft or none are handled right "
    "(the rollback written for the all-rejected case only): output "
    "diverges on hybrids only, counters stay consistent",
}


#: Faults that change the target's own decode, so a non-speculative engine runs them too; every
#: other fault acts only where speculation does (drafts, verify, accept, rollback, counters), so the
#: twin starts without it and a faulted case shares its baseline arm with the healthy case of the
#: same settings.
TARGET_FAULTS = frozenset({"numerical-noise"})


def validate_faults(names: Iterable[str]) -> tuple[str, ...]:
    """Check fault names (``ValueError`` names the unknown and the valid ones); return them
    de-duplicated, in order."""
    names = list(names)
    unknown = [name for name in names if name not in FAULTS]
    if unknown:
        valid = ", ".join(sorted(FAULTS))
        raise ValueError(
            f"unknown fault name(s) {', '.join(map(repr, unknown))}; valid faults: {valid}"
        )
    return tuple(dict.fromkeys(names))


def numerical_noise(logits: Any, scale: float, key: tuple[Any, ...]) -> Any:
    """Fault ``numerical-noise``: ``logits * (1 + scale * u)``, ``u`` uniform in [-1/2, 1/2) seeded
    by ``key`` (seed, phase, step shape), so each step shape rounds its own way (why: the section of
    ``docs/reference-server.md#fault-switches``)."""
    import hashlib

    import torch

    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    gen = torch.Generator(device="cpu").manual_seed(
        int.from_bytes(digest, "little") & ((1 << 63) - 1)
    )
    u = torch.rand(logits.shape, generator=gen, dtype=torch.float64) - 0.5
    return logits * (1 + scale * u.to(device=logits.device, dtype=logits.dtype))


def dead_drafter(match: Any) -> Any:
    """Fault ``dead-drafter``: the verify comparison of ``[rows, K]`` draft matches with every draft
    rejected (zeros), so no draft is ever accepted and each step commits the target's token."""
    return match * 0
