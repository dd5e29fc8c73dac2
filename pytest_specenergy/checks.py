"""Validity checks run on every pair: each is a named flag in the result and the table.

``fail`` checks are controls that fail closed - a broken drafter or engine must never pass
silently because a number looked normal (paper s.10); by default the plugin fails the test
when one trips. ``warn`` checks mark a row the reader should not take at face value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Sequence

from pytest_specenergy.degeneracy import repeated_suffix_fraction
from pytest_specenergy.engines.meta_info import RequestCounters

if TYPE_CHECKING:
    from pytest_specenergy.results import PairResult

#: Mean log-probability gap (nats/token) beyond which diverging text counts as incoherent.
DEFAULT_MAX_LOGPROB_GAP = 1.0


@dataclass(frozen=True)
class Check:
    """One tripped check."""

    name: str
    severity: str  # "fail" | "warn"
    message: str

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"


def counter_problems(counters: Sequence[RequestCounters], drafted_per_step: int) -> list[str]:
    """Speculative counters that contradict the tokens the engine committed.

    Every verify step commits its accepted drafts plus one bonus token, and the first token
    comes from prefill, so per request ``completion - 1 - verify_ct`` drafts were accepted;
    only the final step may be cut by ``max_new_tokens`` or EOS, by at most ``drafted_per_step``.
    """
    problems = []
    for index, c in enumerate(counters):
        problems += c.problems()
        if c.spec_verify_ct is None or c.spec_num_correct_drafts is None:
            continue
        implied = c.completion_tokens - 1 - c.spec_verify_ct
        if not implied <= c.spec_num_correct_drafts <= implied + drafted_per_step:
            problems.append(
                f"request {index}: {c.spec_num_correct_drafts} accepted drafts reported, but "
                f"{c.completion_tokens} tokens over {c.spec_verify_ct} verify steps allow "
                f"{max(implied, 0)} to {implied + drafted_per_step}")
        if c.spec_num_proposed_drafts is not None and \
                c.spec_num_proposed_drafts != c.spec_verify_ct * drafted_per_step:
            problems.append(f"request {index}: {c.spec_num_proposed_drafts} proposed drafts "
                            f"reported for {c.spec_verify_ct} steps of {drafted_per_step}")
    return problems


def pair_checks(pair: PairResult, max_logprob_gap: float = DEFAULT_MAX_LOGPROB_GAP) -> list[Check]:
    """Every check that trips on ``pair``."""
    found: list[Check] = []
    spec, base, case = pair.speculative, pair.baseline, pair.case
    k = case.drafter.num_draft_tokens
    verify = spec._pooled("verify_steps")
    if verify is None:
        found.append(Check("missing-counters", "fail", "the speculative engine reported no "
                           "spec_verify_ct / spec_num_correct_drafts for the measured requests"))
    elif verify == 0:
        found.append(Check("no-verify-steps", "fail", "the speculative arm ran zero verify steps: "
                           "speculation never happened"))
    for problem in spec.counter_problems:
        found.append(Check("counters-inconsistent", "fail", problem))
    accept = pair.accept_length
    if accept is not None and case.drafter.name == "ngram" and accept == 1.0:
        loops = [repeated_suffix_fraction(o) for o in base.outputs]
        if loops and max(loops) >= 0.3:
            found.append(Check("accept-length-1-on-repetition", "fail",
                               f"n-gram accepted nothing although the baseline output repeats "
                               f"itself ({max(loops):.0%} of a prompt's answer is a loop)"))
    if case.drafter.draft_model == case.model and accept is not None and accept < k + 1 - 0.25:
        found.append(Check("self-draft-not-exact", "fail",
                           f"drafting with the target itself must accept every draft "
                           f"(accept length {k + 1}), got {accept:.3f}"))
    coherence = pair.coherence
    if coherence is not None and not pair.equivalence.exact_fraction == 1.0:
        if coherence.mean_gap > max_logprob_gap:
            found.append(Check("incoherent", "fail",
                               f"speculative text scores {coherence.mean_gap:.2f} nats/token below the "
                               f"baseline's under the target (limit {max_logprob_gap:.2f})"))
        for problem in coherence.degeneracy.problems():
            found.append(Check("degenerate-output", "fail", problem))
    for run in (base, spec):
        top = run.concurrency.get("max_running")
        if top is not None and top < case.batch:
            found.append(Check("concurrency-below-batch", "warn",
                               f"{run.arm} arm ran at most {top} requests at once, not {case.batch}"))
        if not run.outputs_stable:
            found.append(Check("outputs-unstable", "warn",
                               f"{run.arm} arm's outputs changed between repeats"))
    short = sum(1 for o, f in zip(base.outputs, base.finish_reasons)
                if f == "stop" and len(o) < case.generation.max_new_tokens // 2)
    if short * 2 > len(base.outputs):
        found.append(Check("answers-cut-short", "warn",
                           f"{short} of {len(base.outputs)} baseline answers ended before half of "
                           f"max_new_tokens: the window measures little decode"))
    return found
