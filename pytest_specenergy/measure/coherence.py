"""Coherence: score each arm's continuation under the target, for when exact equality cannot hold
(GPU numerics, sampling) and to name *how* broken a diverging arm is (the scoring protocol:
``docs/methodology.md#coherence-scoring``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any
from typing import Sequence

from pytest_specenergy.document import CoherenceFacts
from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.engines.prompts import Prompt
from pytest_specenergy.measure.degeneracy import DegeneracyReport
from pytest_specenergy.measure.degeneracy import degeneracy
from pytest_specenergy.measure.equivalence import DivergenceMargin
from pytest_specenergy.measure.equivalence import first_divergence

#: Mean log-probability gap (nats/token, from the first divergence on) beyond which diverging text
#: is incoherent: a near-tie's two continuations are greedy paths of (almost) one model and score
#: within hundredths of a nat per token; the skip-state-rollback fault scores 0.69-0.80 below on
#: tiny:hybrid (benchmarks/fault_figures.py).
DEFAULT_MAX_LOGPROB_GAP = 0.25


class CoherenceError(RuntimeError):
    """The engine's logprob answer does not have the documented shape."""


@dataclass(frozen=True)
class Coherence:
    """Per prompt, each arm's mean log-probability under the target from the first divergence on
    (0.0: identical)."""

    baseline_logprob: tuple[float, ...]
    speculative_logprob: tuple[float, ...]
    degeneracy: DegeneracyReport
    diverged: tuple[bool, ...] = ()
    #: Per prompt, the baseline's top-2 at the first divergence (None where the arms agree).
    margins: tuple[DivergenceMargin | None, ...] = ()

    @property
    def gaps(self) -> tuple[float, ...]:
        """Per prompt: baseline mean logprob minus speculative (positive: the speculative text is
        less likely)."""
        return tuple(b - s for b, s in zip(self.baseline_logprob, self.speculative_logprob))

    @property
    def mean_gap(self) -> float:
        """Gap averaged over the prompts that diverged (0.0 when none did)."""
        gaps = [g for g, d in zip(self.gaps, self.diverged) if d]
        return statistics.fmean(gaps) if gaps else 0.0

    def mean_gap_without(self, prompts: set[int] | frozenset[int]) -> float:
        """:attr:`mean_gap` over the diverged prompts not in ``prompts`` (those that diverged at a
        numerical tie: another greedy path of the target, no evidence of a bug)."""
        gaps = [
            g for i, (g, d) in enumerate(zip(self.gaps, self.diverged)) if d and i not in prompts
        ]
        return statistics.fmean(gaps) if gaps else 0.0

    def off_greedy(self, tie_margin: float) -> list[tuple[int, DivergenceMargin]]:
        """(prompt, margin) of each scored prompt whose speculative text, from its first divergence
        on, commits a token more than ``tie_margin`` nats below the target's best (``later_gap``):
        not greedy up to a tie."""
        return [
            (i, m) for i, m in enumerate(self.margins) if m is not None and m.later_gap > tie_margin
        ]

    @property
    def worst_gap(self) -> float:
        """The largest per-prompt gap."""
        return max(self.gaps, default=0.0)

    def record(self) -> CoherenceFacts:
        """As the run document stores it."""
        return CoherenceFacts.from_dict(self.as_dict(), "coherence")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {
            "baseline_logprob": list(self.baseline_logprob),
            "speculative_logprob": list(self.speculative_logprob),
            "diverged": list(self.diverged),
            "mean_gap": self.mean_gap,
            "worst_gap": self.worst_gap,
            "margins": [None if m is None else m.as_dict() for m in self.margins],
            "degeneracy": self.degeneracy.as_dict(),
        }


def prompt_token_ids(
    client: EngineClient, prompts: Sequence[Prompt], return_prompt_token_ids: bool | None = None
) -> list[list[int]]:
    """The engine's own tokenisation of each prompt (a token-id prompt is its own): ``prompt_token_ids``
    when ``return_prompt_token_ids`` (SGLang >= 0.5.13, the reference server); else (False, or None =
    unknown: older SGLang lacks the field) the prompt is scored from its first token, ids read from
    ``input_token_logprobs`` (entry k is ``input_ids[k]`` everywhere)."""
    if all(not isinstance(p, str) for p in prompts):
        return [list(p) for p in prompts]  # sent as ids (a chat-templated pool): nothing to ask
    params = {"max_new_tokens": 0, "temperature": 0.0}
    if return_prompt_token_ids:
        answers = client.generate(
            text=list(prompts), sampling_params=params, return_prompt_token_ids=True
        )
        try:
            return [list(a["prompt_token_ids"]) for a in answers]
        except KeyError:
            raise CoherenceError(
                "the engine did not return prompt_token_ids; it needs return_prompt_token_ids "
                "support (SGLang >= 0.5.13); pass return_prompt_token_ids=False to read them from "
                "input_token_logprobs"
            ) from None
    answers = client.generate(
        text=list(prompts), sampling_params=params, return_logprob=True, logprob_start_len=0
    )
    out = []
    for i, answer in enumerate(answers):
        entries = (answer.get("meta_info") or {}).get("input_token_logprobs")
        try:
            out.append([int(e[1]) for e in entries])
        except (TypeError, IndexError, ValueError):
            raise CoherenceError(
                f"prompt {i}: input_token_logprobs should list (logprob, token_id, ...) for every "
                f"prompt token (logprob_start_len=0); got {str(entries)[:200]}"
            ) from None
        if not out[-1]:
            raise CoherenceError(f"prompt {i}: the engine returned no input_token_logprobs")
    return out


#: One position's top-N under the engine's model: (logprob, token id) pairs, best first.
TopEntries = tuple[tuple[float, int], ...]


def score_continuation(
    client: EngineClient,
    prompt_ids: Sequence[int],
    continuation: Sequence[int],
    top_logprobs_num: int = 0,
) -> tuple[list[float], list[TopEntries]]:
    """Per-token log-probabilities of ``continuation`` after ``prompt_ids`` and, with
    ``top_logprobs_num=N``, the model's N best tokens at each position (``tops[k]``: the
    distribution ``continuation[k]`` was drawn from)."""
    if not continuation:
        return [], []
    start = len(prompt_ids) - 1
    # The field is sent only when asked for: a client or engine without it still scores.
    top = {"top_logprobs_num": top_logprobs_num} if top_logprobs_num else {}
    answer = client.generate(
        [list(prompt_ids) + list(continuation)],
        sampling_params={"max_new_tokens": 0, "temperature": 0.0},
        return_logprob=True,
        logprob_start_len=start,
        **top,
    )[0]
    meta = answer.get("meta_info", {})
    entries = meta.get("input_token_logprobs")
    # SGLang's entry 0 is (None, token_id, text); accept a bare None too.
    first_is_none = bool(entries) and (entries[0] is None or entries[0][0] is None)
    if entries is None or len(entries) != len(continuation) + 1 or not first_is_none:
        raise CoherenceError(
            f"input_token_logprobs should have {len(continuation) + 1} entries with "
            f"entry 0 = None (logprob_start_len={start}); got {str(entries)[:200]}"
        )
    logprobs = [float(e[0]) for e in entries[1:]]
    tops = (
        _top_entries(meta.get("input_top_logprobs"), len(continuation), top_logprobs_num, start)
        if top
        else []
    )
    return logprobs, tops


def _top_entries(positions: Any, n: int, top_n: int, start: int) -> list[TopEntries]:
    """``input_top_logprobs`` (entry 0 None, then per position [[logprob, id, text], ...] best
    first) as (logprob, id) tuples for the ``n`` continuation positions."""
    shape = (
        f"input_top_logprobs should have {n + 1} entries, entry 0 None and each other a list of "
        f"{top_n} [logprob, token_id, text] best first (top_logprobs_num={top_n}, "
        f"logprob_start_len={start})"
    )
    if not isinstance(positions, list) or len(positions) != n + 1:
        raise CoherenceError(f"{shape}; got {str(positions)[:200]}")
    out = []
    for k, top in enumerate(positions[1:], start=1):
        try:
            entries = tuple((float(e[0]), int(e[1])) for e in top)
        except (TypeError, IndexError, ValueError):
            entries = None
        if (
            entries is None
            or len(entries) < min(top_n, 2)
            or any(a[0] < b[0] for a, b in zip(entries, entries[1:]))
        ):
            raise CoherenceError(f"{shape}; entry {k} is {str(top)[:200]}")
        out.append(entries)
    return out


def later_gap(
    spec_logprobs: Sequence[float], spec_best: Sequence[TopEntries], start: int
) -> tuple[float, int | None]:
    """Largest shortfall of a speculative token below the target's best, from ``start`` on, and
    where (0.0, None)."""
    gaps = [
        (best[0][0] - lp, k)
        for k, (lp, best) in enumerate(zip(spec_logprobs, spec_best))
        if k >= start
    ]
    gap, index = max(gaps, default=(0.0, None))
    return max(gap, 0.0), index


def _suffix_mean(values: Sequence[float], start: int) -> float:
    tail = values[start:]
    return statistics.fmean(tail) if tail else 0.0


def measure_coherence(
    client: EngineClient,
    prompts: Sequence[Prompt],
    baseline: Sequence[Sequence[int]],
    speculative: Sequence[Sequence[int]],
    special_ids: Sequence[int] = (),
    return_prompt_token_ids: bool | None = None,
    tie_margins: bool = False,
) -> Coherence:
    """Score both arms' continuations on the (non-speculative) ``client`` engine, each diverging
    prompt from its first divergence on (the shared prefix would only dilute the gap).
    ``return_prompt_token_ids``: whether the engine has that field (None: unknown, treated as no).
    ``tie_margins``: also score each divergence's baseline top-2 (``margins``); without it every
    divergence stays unclassified, which equivalence judges as real. Identical continuations are
    not scored again: they cannot differ."""
    diverged = [i for i, (b, s) in enumerate(zip(baseline, speculative)) if list(b) != list(s)]
    if not diverged:
        n = len(baseline)  # nothing diverged: nothing to score
        return Coherence(
            (0.0,) * n,
            (0.0,) * n,
            degeneracy(baseline, speculative, special_ids),
            (False,) * n,
            (None,) * n,
        )
    # Only the diverged prompts are tokenised by the engine: each costs a prefill, the pool's others
    # are not scored.
    ids_of = dict(
        zip(
            diverged,
            prompt_token_ids(client, [prompts[i] for i in diverged], return_prompt_token_ids),
        )
    )
    # Per prompt: baseline score, speculative score, diverged, margin.
    rows: list[tuple[float, float, bool, DivergenceMargin | None]] = []
    for i, (base, spec) in enumerate(zip(baseline, speculative)):
        ids = ids_of.get(i)
        if ids is None:
            rows.append((0.0, 0.0, False, None))
            continue
        start = first_divergence(base, spec) or 0
        base_lp, base_top = score_continuation(
            client, ids, base, top_logprobs_num=2 if tie_margins else 0
        )
        spec_lp, spec_best = score_continuation(
            client, ids, spec, top_logprobs_num=1 if tie_margins else 0
        )
        margin = (
            _margin_at(
                client,
                ids,
                list(base),
                list(spec),
                start,
                base_top,
                special_ids,
                later_gap(spec_lp, spec_best, start),
            )
            if tie_margins
            else None
        )
        rows.append((_suffix_mean(base_lp, start), _suffix_mean(spec_lp, start), True, margin))
    base_scores, spec_scores, diverged, margins = zip(*rows)
    return Coherence(
        base_scores, spec_scores, degeneracy(baseline, speculative, special_ids), diverged, margins
    )


def _margin_at(
    client: EngineClient,
    prompt_ids: Sequence[int],
    base: list[int],
    spec: list[int],
    at: int,
    base_top: list[TopEntries],
    stop_ids: Sequence[int],
    later: tuple[float, int | None],
) -> DivergenceMargin:
    """The baseline model's top-2 at position ``at`` given the common prefix ``base[:at]`` and
    whether the arms' tokens are those two. A ``None`` token: that arm's answer ended there, so the
    other top-2 entry must be one of ``stop_ids`` (without them, no tie can be shown). ``later``:
    :func:`later_gap` of the speculative text."""
    if at < len(base):  # the baseline's own scoring already holds that position
        top, base_token, spec_token = base_top[at], base[at], (spec[at] if at < len(spec) else None)
    else:
        # The baseline's answer ended here (its stop token not in output_ids): score the common
        # prefix plus the speculative arm's next token, which puts the position in the input.
        top = score_continuation(client, prompt_ids, base + [spec[at]], top_logprobs_num=2)[1][at]
        base_token, spec_token = None, spec[at]
    (best_lp, best), (second_lp, second) = top[0], top[1]
    pair = {best, second}
    if base_token is not None and spec_token is not None:
        between = {base_token, spec_token} == pair
    else:
        other = base_token if base_token is not None else spec_token
        between = other in pair and bool((pair - {other}) & set(stop_ids))
    return DivergenceMargin(best_lp - second_lp, (best, second), between, *later)
