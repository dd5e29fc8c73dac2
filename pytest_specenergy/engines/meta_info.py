"""Reading SGLang's per-request ``meta_info`` and ``/server_info`` across releases, whose key names
changed; an absent speculative counter stays ``None``. See docs/engines.md#reading-sglangs-answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from typing import Mapping
from typing import Sequence


class MetaInfoError(ValueError):
    """A ``meta_info`` or ``/server_info`` payload lacks what every SGLang release sends."""


@dataclass(frozen=True)
class RequestCounters:
    """One request's counters, under canonical (0.5.23) names. ``spec_num_correct_drafts`` excludes
    the bonus token; ``correct_drafts_histogram[k]`` is the number of verify steps that accepted
    ``k`` drafts."""

    rid: str | None
    #: Prompt tokens: SGLang's count, else the caller's (the request it sent), else 0 for a request
    #: never prefilled; None only for a queued abort with output whose prompt nobody counted.
    prompt_tokens: int | None
    completion_tokens: int
    finish_type: str | None
    finish_detail: Any
    e2e_latency: float | None
    spec_verify_ct: int | None = None
    spec_num_correct_drafts: int | None = None
    spec_num_proposed_drafts: int | None = None
    correct_drafts_histogram: tuple[int, ...] | None = None
    cached_tokens: int | None = None
    #: Times SGLang retracted the request (KV pool full): its ``num_retractions``, or at least 1 for
    #: a request answered from the waiting queue with output (only a retraction puts a running
    #: request back there; that answer carries no count); None where the release reports none.
    retractions: int | None = None
    #: Answered from SGLang's waiting queue ("Abort in waiting queue": no ``prompt_tokens``).
    queued_abort: bool = False
    #: Reference server only: the engine's number of the prefill forward that prefilled the request
    #: (requests sharing it were prefilled together) and the wall seconds of the decode / verify
    #: steps it ran in; None from SGLang.
    prefill_forward: int | None = None
    decode_seconds: float | None = None
    #: Exact per-verify-step statistics where the release sends them (``speculative_decoding_stats``
    #: or top-level ``verify_lengths`` / ``accept_lengths``; none in 0.5.23): per step, the tokens
    #: verified and those accepted. Read where present, never required.
    verify_lengths: tuple[int, ...] | None = None
    accept_lengths: tuple[int, ...] | None = None
    #: Why this request's ``spec_num_proposed_drafts`` cannot be trusted (ragged speculation: the
    #: drafts per step varied, while SGLang books ``verify_ct x (num_draft_tokens - 1)`` from the
    #: static config); None where nothing says so. Such a count is kept in
    #: ``nominal_proposed_drafts``, and ``spec_num_proposed_drafts`` is None: no acceptance rate
    #: is computed from it.
    ragged: str | None = None
    nominal_proposed_drafts: int | None = None
    #: SGLang's time stats (``--enable-metrics``; wall-clock seconds, None where not sent): when the
    #: prefill forward that prefilled the request began (``forward_entry_time``: one stamp for every
    #: request of that forward) and ended (``prefill_finished_time``: its first token), and when the
    #: request finished (``request_finished_ts``).
    forward_entry_time: float | None = None
    prefill_finished_time: float | None = None
    finished_time: float | None = None

    def problems(self) -> list[str]:
        """Internal inconsistencies (histogram and per-step statistics vs totals); empty when the
        counters agree."""
        out = self._step_problems()
        hist = self.correct_drafts_histogram
        if (
            hist is not None
            and self.spec_verify_ct is not None
            and sum(hist) != self.spec_verify_ct
        ):
            out.append(
                f"request {self.rid}: histogram counts {sum(hist)} verify steps, "
                f"spec_verify_ct says {self.spec_verify_ct}"
            )
        if hist is not None and self.spec_num_correct_drafts is not None:
            weighted = sum(k * n for k, n in enumerate(hist))
            if weighted != self.spec_num_correct_drafts:
                out.append(
                    f"request {self.rid}: histogram sums to {weighted} accepted drafts, "
                    f"spec_num_correct_drafts says {self.spec_num_correct_drafts}"
                )
        if (
            self.spec_num_correct_drafts is not None
            and self.spec_num_proposed_drafts is not None
            and self.spec_num_correct_drafts > self.spec_num_proposed_drafts
        ):
            out.append(
                f"request {self.rid}: {self.spec_num_correct_drafts} accepted drafts "
                f"exceed {self.spec_num_proposed_drafts} proposed"
            )
        return out

    def _step_problems(self) -> list[str]:
        """The per-step statistics against the totals: one entry per verify step, the accepted
        ones summing to the accepted drafts (or, where a release counts the bonus token, to the
        accepted drafts plus one per step), none above its step's verified tokens."""
        verify, accept, steps = self.verify_lengths, self.accept_lengths, self.spec_verify_ct
        out = []
        for name, values in (("verify_lengths", verify), ("accept_lengths", accept)):
            if values is not None and steps is not None and len(values) != steps:
                out.append(
                    f"request {self.rid}: {name} lists {len(values)} verify steps, "
                    f"spec_verify_ct says {steps}"
                )
        correct = self.spec_num_correct_drafts
        if accept is not None and correct is not None and steps is not None:
            if sum(accept) not in (correct, correct + steps):
                out.append(
                    f"request {self.rid}: accept_lengths sum to {sum(accept)}, neither "
                    f"spec_num_correct_drafts ({correct}) nor that plus one bonus token per "
                    f"verify step ({correct + steps})"
                )
        if verify is not None and accept is not None:
            over = [i for i, (v, a) in enumerate(zip(verify, accept)) if a > v]
            if over:
                out.append(
                    f"request {self.rid}: verify step {over[0]} accepted {accept[over[0]]} "
                    f"tokens of {verify[over[0]]} verified"
                )
        return out


# Canonical field -> accepted key names, canonical first.
_SPEC_KEYS: dict[str, tuple[str, ...]] = {
    "spec_verify_ct": ("spec_verify_ct",),
    "spec_num_correct_drafts": (
        "spec_num_correct_drafts",
        "spec_accepted_drafts",
        "spec_accept_token_num",
    ),
    "spec_num_proposed_drafts": (
        "spec_num_proposed_drafts",
        "spec_proposed_drafts",
        "spec_draft_token_num",
    ),
    "correct_drafts_histogram": ("spec_correct_drafts_histogram", "spec_accept_histogram"),
}
_RETRACTION_KEYS = ("num_retractions", "total_retractions")
#: Keys SGLang sends only in ragged-verify ("cap") mode (0.5.16+, ``tokenizer_manager.py``): drafts
#: per step then vary and accepted drafts can exceed committed tokens.
RAGGED_KEYS = (
    "spec_cap_length",
    "spec_cap_lens_histogram",
    "spec_num_cap_tokens",
    "spec_block_accept_length",
    "spec_num_block_accept_tokens",
)
#: Where a release sends exact per-step statistics (none does in 0.5.23).
STEP_STATS_KEY = "speculative_decoding_stats"


def parse_meta_info(meta: Mapping[str, Any], prompt_tokens: int | None = None) -> RequestCounters:
    """Counters from one response's ``meta_info``, whichever release produced it. ``prompt_tokens``:
    the prompt length of the request the caller sent, used where SGLang reports none (an abort
    answered from its waiting queue, ``tokenizer_manager.py`` ``_handle_abort_req``)."""
    if not isinstance(meta, Mapping):
        raise MetaInfoError(f"meta_info must be a JSON object, got {type(meta).__name__}")
    finish_type, finish_detail = _finish(meta.get("finish_reason"))
    if meta.get("completion_tokens") is None:
        raise MetaInfoError(
            "meta_info lacks completion_tokens (every SGLang release sends it); keys present: "
            f"{', '.join(sorted(meta)) or 'none'}"
        )
    completion = int(meta["completion_tokens"])
    # Answered from SGLang's waiting queue: an abort without prompt_tokens. Never admitted, it made
    # 0 tokens; retracted first (KV pool full), it keeps the output it made while running, so
    # completion_tokens can be anything (docs/engines.md#reading-sglangs-answers).
    queued = finish_type == "abort" and meta.get("prompt_tokens") is None
    if meta.get("prompt_tokens") is not None:
        prompt: int | None = int(meta["prompt_tokens"])
    elif not queued:
        raise MetaInfoError(
            "meta_info lacks prompt_tokens (every SGLang release sends it, except for a request "
            "aborted in its waiting queue); keys present: "
            f"{', '.join(sorted(meta)) or 'none'}"
        )
    elif prompt_tokens is not None:
        prompt = int(prompt_tokens)
    else:
        prompt = 0 if completion == 0 else None  # never prefilled: no prompt token ran
    spec = {field: _first(meta, keys, field) for field, keys in _SPEC_KEYS.items()}
    hist = spec.pop("correct_drafts_histogram")
    verify_lengths, accept_lengths = _step_stats(meta)
    ragged = _ragged(meta, verify_lengths)
    nominal = None
    if ragged is not None:
        nominal = spec["spec_num_proposed_drafts"]
        spec["spec_num_proposed_drafts"] = None  # nominal: no acceptance rate from it
    retractions = _or_none(int, _first(meta, _RETRACTION_KEYS, "retractions"))
    if retractions is None and queued and completion > 0:
        retractions = 1  # only a retraction sends a request with output back to the queue
    return RequestCounters(
        rid=_or_none(str, meta.get("id")),
        prompt_tokens=prompt,
        completion_tokens=completion,
        finish_type=finish_type,
        finish_detail=finish_detail,
        e2e_latency=_or_none(float, meta.get("e2e_latency")),
        correct_drafts_histogram=None if hist is None else tuple(int(n) for n in hist),
        cached_tokens=_or_none(int, meta.get("cached_tokens")),
        retractions=retractions,
        queued_abort=queued,
        prefill_forward=_or_none(int, meta.get("prefill_forward")),
        decode_seconds=_or_none(float, meta.get("decode_seconds")),
        verify_lengths=verify_lengths,
        accept_lengths=accept_lengths,
        ragged=ragged,
        nominal_proposed_drafts=_or_none(int, nominal),
        forward_entry_time=_or_none(float, meta.get("forward_entry_time")),
        prefill_finished_time=_or_none(float, meta.get("prefill_finished_time")),
        finished_time=_or_none(float, meta.get("request_finished_ts")),
        **{k: _or_none(int, v) for k, v in spec.items()},
    )


def _step_stats(meta: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(verify_lengths, accept_lengths) from ``speculative_decoding_stats`` or the top level, each
    None where absent; a present one that is not a list of whole numbers is an error."""
    stats = meta.get(STEP_STATS_KEY)
    if stats is not None and not isinstance(stats, Mapping):
        raise MetaInfoError(
            f"meta_info {STEP_STATS_KEY} must be a JSON object, got {type(stats).__name__}"
        )
    source = {**meta, **(stats or {})}
    out = []
    for key in ("verify_lengths", "accept_lengths"):
        values = source.get(key)
        if values is None:
            out.append(None)
            continue
        if not isinstance(values, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
        ):
            raise MetaInfoError(
                f"meta_info {key} must list one whole number >= 0 per verify step, got "
                f"{str(values)[:80]}"
            )
        out.append(tuple(values))
    return out[0], out[1]


def _ragged(meta: Mapping[str, Any], verify_lengths: tuple[int, ...] | None) -> str | None:
    """Why drafts per step varied in this request (so SGLang's nominal proposed count is wrong), or
    None: ragged-verify keys present, or per-step verify lengths that differ."""
    present = [key for key in RAGGED_KEYS if meta.get(key) is not None]
    if present:
        return f"ragged-verify mode ({', '.join(present)} present)"
    if verify_lengths and len(set(verify_lengths)) > 1:
        return (
            f"verify lengths varied per step ({min(verify_lengths)} to {max(verify_lengths)} "
            "tokens)"
        )
    return None


def adaptive_speculation(server_info: Mapping[str, Any]) -> str | None:
    """Why an engine's drafts per step vary (``speculative_adaptive`` on, or an adaptive config in
    ``/server_info``), or None: SGLang then books ``spec_num_proposed_drafts`` from the static
    config all the same, so it is not the drafts proposed."""
    if not isinstance(server_info, Mapping):
        return None
    if server_info.get("speculative_adaptive"):
        return "adaptive speculation (/server_info speculative_adaptive is on)"
    config = server_info.get("speculative_adaptive_config")
    if config:
        return f"adaptive speculation (/server_info speculative_adaptive_config {config!r})"
    return None


def _finish(finish: Any) -> tuple[str | None, Any]:
    """(type, detail) of a ``finish_reason``: length -> the cap, stop -> the matched token or
    string, abort -> the message."""
    if isinstance(finish, Mapping):
        detail = {k: v for k, v in finish.items() if k != "type"}
        return finish.get("type"), (
            next(iter(detail.values())) if len(detail) == 1 else (detail or None)
        )
    return (finish, None) if isinstance(finish, str) else (None, None)


def _first(meta: Mapping[str, Any], keys: Sequence[str], field: str) -> Any:
    """The value under the first key present; old and new spellings must agree."""
    found = [(k, meta[k]) for k in keys if meta.get(k) is not None]
    if not found:
        return None
    key, value = found[0]
    for other, other_value in found[1:]:
        if _normal(other_value) != _normal(value):
            raise MetaInfoError(
                f"meta_info has {key}={value!r} and its alias {other}={other_value!r}; they must "
                f"be equal ({field})"
            )
    return value


def _normal(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _or_none(kind: Any, value: Any) -> Any:
    return None if value is None else kind(value)


def parse_concurrency(server_info: Mapping[str, Any]) -> dict[str, Any]:
    """How many requests actually ran per decode/verify step, from
    ``internal_states[*].step_time_dict`` in ``/server_info`` (data-parallel ranks merged; None when
    no steps were recorded), over the engine's life."""
    states = server_info.get("internal_states") if isinstance(server_info, Mapping) else None
    steps: dict[int, int] | None = None
    cap = None
    for state in states or []:
        if not isinstance(state, Mapping):
            continue
        cap = state.get("effective_max_running_requests_per_dp", cap)
        table = state.get("step_time_dict")
        if not isinstance(table, Mapping):
            continue
        steps = {} if steps is None else steps
        for rows, times in table.items():
            count = len(times) if isinstance(times, (list, tuple)) else int(times)
            steps[int(rows)] = steps.get(int(rows), 0) + count
    return _summary(steps, cap)


def concurrency_between(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`parse_concurrency` over only the steps recorded between two ``/server_info`` reads."""
    first, second = parse_concurrency(before), parse_concurrency(after)
    if second["steps_by_running"] is None:
        return second
    old = first["steps_by_running"] or {}
    delta = {rows: n - old.get(rows, 0) for rows, n in second["steps_by_running"].items()}
    if any(n < 0 for n in delta.values()):
        raise MetaInfoError(
            "step_time_dict shrank between the two /server_info reads: the engine restarted or its "
            "step record was reset; measure both reads on one engine"
        )
    return _summary({r: n for r, n in delta.items() if n}, second["max_running_requests"])


def merge_concurrency(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One summary over several windows' (:func:`concurrency_between`) step records; None when any
    window lacks a record: a mean over only the windows that recorded steps would hide the others."""
    steps: dict[int, int] = {}
    cap = None
    for summary in summaries:
        table = summary.get("steps_by_running")
        if table is None:
            return _summary(None, summary.get("max_running_requests", cap))
        cap = summary.get("max_running_requests", cap)
        for rows, n in table.items():
            steps[int(rows)] = steps.get(int(rows), 0) + int(n)
    return _summary(steps if summaries else None, cap)


def _summary(steps: dict[int, int] | None, cap: Any) -> dict[str, Any]:
    total = sum(steps.values()) if steps else 0
    return {
        "steps_by_running": None if steps is None else dict(sorted(steps.items())),
        "steps": None if steps is None else total,
        "min_running": min(steps) if steps else None,
        "max_running": max(steps) if steps else None,
        "mean_running": sum(r * n for r, n in steps.items()) / total if steps else None,
        "max_running_requests": cap,
    }


def cuda_graph_setting(
    server_info: Mapping[str, Any], options: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Every ``*cuda_graph*`` setting of an engine: its ``/server_info`` and the case's engine
    options, or None: CUDA graphs change the result (paper), so any difference makes runs
    incomparable."""
    found: dict[str, Any] = {}
    for source in (server_info, options):
        found.update({str(k): v for k, v in source.items() if "cuda_graph" in str(k)})
    return dict(sorted(found.items())) or None
