"""Coherence: score each arm's continuation under the target, for when exact equality cannot
hold (GPU numerics, sampling) and to name *how* broken a diverging arm is.

Scoring uses SGLang's input-logprob protocol on the non-speculative engine: send
``prompt_ids + continuation_ids`` with ``max_new_tokens=0``, ``return_logprob=True`` and
``logprob_start_len = len(prompt_ids) - 1``. ``input_token_logprobs[k]`` is the log-probability
of ``input_ids[start + k]`` given everything before it, and entry 0 is always None, so the
continuation's logprobs are entries 1 onwards.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any
from typing import Sequence

from pytest_specenergy.engines.client import EngineClient
from pytest_specenergy.measure.degeneracy import DegeneracyReport
from pytest_specenergy.measure.degeneracy import degeneracy
from pytest_specenergy.measure.equivalence import first_divergence


class CoherenceError(RuntimeError):
    """The engine's logprob answer does not have the documented shape."""


@dataclass(frozen=True)
class Coherence:
    """Per prompt, the mean log-probability under the target of each arm's continuation from
    the first divergence on (0.0 for both when the continuations are identical)."""

    baseline_logprob: tuple[float, ...]
    speculative_logprob: tuple[float, ...]
    degeneracy: DegeneracyReport
    diverged: tuple[bool, ...] = ()

    @property
    def gaps(self) -> tuple[float, ...]:
        """Per prompt: baseline mean logprob minus speculative (positive = speculative text is
        less likely under the target than the target's own greedy text)."""
        return tuple(b - s for b, s in zip(self.baseline_logprob, self.speculative_logprob))

    @property
    def mean_gap(self) -> float:
        """Gap averaged over the prompts that diverged (0.0 when none did)."""
        gaps = [g for g, d in zip(self.gaps, self.diverged) if d]
        return statistics.fmean(gaps) if gaps else 0.0

    @property
    def worst_gap(self) -> float:
        """The largest per-prompt gap."""
        return max(self.gaps, default=0.0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return {"baseline_logprob": list(self.baseline_logprob),
                "speculative_logprob": list(self.speculative_logprob),
                "diverged": list(self.diverged), "mean_gap": self.mean_gap, "worst_gap": self.worst_gap,
                "degeneracy": self.degeneracy.as_dict()}


def prompt_token_ids(client: EngineClient, prompts: Sequence[str],
                     return_prompt_token_ids: bool | None = None) -> list[list[int]]:
    """The engine's own tokenisation of each prompt (never re-tokenised here).

    ``return_prompt_token_ids=True`` asks ``/generate`` for ``prompt_token_ids`` (SGLang >=
    0.5.13 and the reference server). Otherwise (False, or None = unknown) the field is not
    sent, since older SGLang has no such field: the prompt is scored from its first token
    (``return_logprob``, ``logprob_start_len=0``) and the ids are read from
    ``input_token_logprobs``, whose entry k carries ``input_ids[k]`` on every release.
    """
    params = {"max_new_tokens": 0, "temperature": 0.0}
    if return_prompt_token_ids:
        answers = client.generate(text=list(prompts), sampling_params=params,
                                  return_prompt_token_ids=True)
        try:
            return [list(a["prompt_token_ids"]) for a in answers]
        except KeyError:
            raise CoherenceError("the engine did not return prompt_token_ids; it needs "
                                 "return_prompt_token_ids support (SGLang >= 0.5.13); pass "
                                 "return_prompt_token_ids=False to read them from "
                                 "input_token_logprobs") from None
    answers = client.generate(text=list(prompts), sampling_params=params, return_logprob=True,
                              logprob_start_len=0)
    out = []
    for i, answer in enumerate(answers):
        entries = (answer.get("meta_info") or {}).get("input_token_logprobs")
        try:
            out.append([int(e[1]) for e in entries])
        except (TypeError, IndexError, ValueError):
            raise CoherenceError(
                f"prompt {i}: input_token_logprobs should list (logprob, token_id, ...) for every "
                f"prompt token (logprob_start_len=0); got {str(entries)[:200]}") from None
        if not out[-1]:
            raise CoherenceError(f"prompt {i}: the engine returned no input_token_logprobs")
    return out


def continuation_logprobs(client: EngineClient, prompt_ids: Sequence[int],
                          continuation: Sequence[int]) -> list[float]:
    """Per-token log-probabilities of ``continuation`` after ``prompt_ids`` under the engine's model."""
    if not continuation:
        return []
    start = len(prompt_ids) - 1
    answer = client.generate([list(prompt_ids) + list(continuation)],
                             sampling_params={"max_new_tokens": 0, "temperature": 0.0},
                             return_logprob=True, logprob_start_len=start)[0]
    entries = answer.get("meta_info", {}).get("input_token_logprobs")
    # SGLang's entry 0 is (None, token_id, text); accept a bare None too.
    first_is_none = bool(entries) and (entries[0] is None or entries[0][0] is None)
    if entries is None or len(entries) != len(continuation) + 1 or not first_is_none:
        raise CoherenceError(f"input_token_logprobs should have {len(continuation) + 1} entries with "
                             f"entry 0 = None (logprob_start_len={start}); got {str(entries)[:200]}")
    return [float(e[0]) for e in entries[1:]]


def _suffix_mean(values: Sequence[float], start: int) -> float:
    tail = values[start:]
    return statistics.fmean(tail) if tail else 0.0


def measure_coherence(client: EngineClient, prompts: Sequence[str], baseline: Sequence[Sequence[int]],
                      speculative: Sequence[Sequence[int]], special_ids: Sequence[int] = (),
                      return_prompt_token_ids: bool | None = None) -> Coherence:
    """Score both arms' continuations on the (non-speculative) ``client`` engine.

    Each prompt is scored from its first divergence on: the shared prefix is equally likely
    in both arms and would only dilute the gap. Identical continuations are not rescored.
    ``return_prompt_token_ids``: whether the engine supports that ``/generate`` field (set it
    from the server's version, e.g. ``SGLangBackend.supports_prompt_token_ids``); None means
    unknown and is treated as no (see :func:`prompt_token_ids`).
    """
    if all(list(b) == list(s) for b, s in zip(baseline, speculative)):
        n = len(baseline)  # nothing diverged: nothing to score
        return Coherence((0.0,) * n, (0.0,) * n, degeneracy(baseline, speculative, special_ids), (False,) * n)
    prompt_ids = prompt_token_ids(client, prompts, return_prompt_token_ids)
    base_scores, spec_scores, diverged = [], [], []
    for ids, base, spec in zip(prompt_ids, baseline, speculative):
        diverged.append(list(spec) != list(base))
        if not diverged[-1]:
            base_scores.append(0.0)
            spec_scores.append(0.0)
            continue
        start = first_divergence(base, spec) or 0
        base_scores.append(_suffix_mean(continuation_logprobs(client, ids, base), start))
        spec_scores.append(_suffix_mean(continuation_logprobs(client, ids, spec), start))
    return Coherence(tuple(base_scores), tuple(spec_scores), degeneracy(baseline, speculative, special_ids),
                     tuple(diverged))
