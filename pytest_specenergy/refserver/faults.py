"""Fault switches: deliberate, named bugs that reproduce real failure classes.

They exist only so the plugin's own tests can prove that each of its checks catches the bug it is
for. Each one is a bug that shipped in a real engine (or is the obvious way to write one), and each
leaves *some* metric looking healthy, which is the point: only the right check sees it.
"""

from __future__ import annotations

from collections.abc import Iterable

FAULTS: dict[str, str] = {
    "skip-state-rollback": (
        "do not roll the linear-attention (recurrent + conv) state back after rejected drafts, as NGRAM "
        "on hybrid models in SGLang <= 0.5.13: output becomes incoherent while acceptance looks normal"
    ),
    "wrong-accept-count": (
        "count the bonus token as an accepted draft in meta_info (spec_num_correct_drafts and the "
        "histogram are inflated by one per verify step) while generating correctly"
    ),
    "stale-draft-cache": (
        "do not crop the draft model's KV cache (nor roll back its recurrent state) after a rejection, so "
        "later drafts see rejected tokens at shifted positions: acceptance shifts (on some prompts it "
        "drops, on repetitive ones it can rise), output stays correct"
    ),
    "accept-off-by-one": (
        "accept the first mismatching draft as well (an off-by-one in the verify comparison): tokens "
        "the target did not choose enter the output while acceptance looks better than it is"
    ),
}


def validate_faults(names: Iterable[str]) -> tuple[str, ...]:
    """Check fault names; return them de-duplicated in the given order.

    Raises ``ValueError`` naming the unknown ones and listing the valid ones.
    """
    out: list[str] = []
    unknown = []
    for name in names:
        if name not in FAULTS:
            unknown.append(name)
        elif name not in out:
            out.append(name)
    if unknown:
        valid = ", ".join(sorted(FAULTS))
        raise ValueError(f"unknown fault name(s) {', '.join(map(repr, unknown))}; valid faults: {valid}")
    return tuple(out)
