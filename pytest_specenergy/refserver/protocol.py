"""SGLang's ``/generate`` protocol subset: parse request bodies, shape answers.

A rejection is a :class:`ProtocolError` naming the field, what was given and what is expected (HTTP
400). Where parsing is strict and where lenient, and why: its section of
``docs/reference-server.md#the-http-protocol``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .records import GenerationRequest
from .records import GenerationResult
from .records import RequestTimes
from .records import SamplingParams
from .tokenizer import TokenizerLike

SUPPORTED_SAMPLING = (
    "max_new_tokens",
    "temperature",
    "ignore_eos",
    "stop_token_ids",
    "spec_replay_drafts",
)
# Sampling keys accepted only with a value that cannot change greedy output (None: any value, as the
# seed is irrelevant for greedy decoding and the others change only the text).
NEUTRAL_SAMPLING: dict[str, tuple[Any, ...] | None] = {
    "top_p": (1,),
    "top_k": (-1, 0, 1),
    "min_p": (0,),
    "n": (1,),
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "repetition_penalty": (1,),
    "min_new_tokens": (0,),
    "stop": (None, "", []),
    "sampling_seed": None,
    "skip_special_tokens": None,
    "spaces_between_special_tokens": None,
    "no_stop_trim": None,
}
TOP_LEVEL = (
    "input_ids",
    "text",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "return_prompt_token_ids",
    "return_text_in_logprobs",
    "rid",
    "stream",
    "top_logprobs_num",
    "return_spec_drafts",
)


class ProtocolError(ValueError):
    """A request the server must answer with HTTP 400."""


@dataclass(frozen=True)
class ParsedGenerate:
    """A validated ``/generate`` body."""

    requests: tuple[GenerationRequest, ...]
    batched: bool  # answer with a list (batch input) or a single dict
    return_prompt_token_ids: bool
    return_text_in_logprobs: bool


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _sampling(raw: Any, where: str) -> SamplingParams:
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where} must be a JSON object, got {type(raw).__name__}")
    for key, value in raw.items():
        if key in SUPPORTED_SAMPLING:
            continue
        if key not in NEUTRAL_SAMPLING:
            raise ProtocolError(
                f"{where}.{key} is not supported by the reference server; supported: "
                f"{', '.join(SUPPORTED_SAMPLING)} (plus neutral values of "
                f"{', '.join(NEUTRAL_SAMPLING)})"
            )
        neutral = NEUTRAL_SAMPLING[key]
        if neutral is not None and value not in neutral:
            raise ProtocolError(
                f"{where}.{key}={value!r} would change greedy decoding; only neutral values "
                "are accepted"
            )
    mnt = raw.get("max_new_tokens", 128)
    if not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 0:
        raise ProtocolError(f"{where}.max_new_tokens must be an integer >= 0, got {mnt!r}")
    temp = raw.get("temperature", 0.0)
    if not isinstance(temp, (int, float)) or isinstance(temp, bool) or temp != 0:
        raise ProtocolError(
            f"{where}.temperature must be 0: the reference server decodes greedily only, got "
            f"{temp!r}"
        )
    ignore_eos = raw.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ProtocolError(f"{where}.ignore_eos must be true or false, got {ignore_eos!r}")
    stops = raw.get("stop_token_ids") or []
    if not _is_int_list(stops):
        raise ProtocolError(
            f"{where}.stop_token_ids must be a list of integer token ids, got {stops!r}"
        )
    replay = raw.get("spec_replay_drafts")
    if replay is not None and not (
        isinstance(replay, list) and all(_is_int_list(d) for d in replay)
    ):
        raise ProtocolError(
            f"{where}.spec_replay_drafts must be a list (one per verify step) of lists of token "
            "ids, as meta_info.spec_drafts returns them"
        )
    return SamplingParams(
        max_new_tokens=mnt,
        temperature=0.0,
        ignore_eos=ignore_eos,
        stop_token_ids=tuple(stops),
        replay_drafts=tuple(tuple(d) for d in replay) if replay is not None else None,
    )


def _flag(body: dict[str, Any], key: str) -> bool:
    """A boolean top-level field (absent or null = False)."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ProtocolError(f"{key} must be true or false, got {value!r}")
    return bool(value)


def parse_generate(body: Any, tokenizer: TokenizerLike) -> ParsedGenerate:
    """Validate a ``/generate`` JSON body and build the engine requests."""
    _check_top_level(body)
    prompts, batched = _prompts(body, tokenizer)
    sps = _sampling_per_prompt(body.get("sampling_params"), len(prompts))
    top_n, ret_lp, start = _logprob_request(body, prompts)
    rids = _rids(body.get("rid"), len(prompts))
    return_drafts = _flag(body, "return_spec_drafts")
    requests = tuple(
        GenerationRequest(
            input_ids=tuple(p),
            sampling=sps[i],
            return_logprob=ret_lp,
            logprob_start_len=start,
            rid=rids[i] if rids else None,
            top_logprobs_num=top_n,
            return_spec_drafts=return_drafts,
        )
        for i, p in enumerate(prompts)
    )
    return ParsedGenerate(
        requests=requests,
        batched=batched,
        return_prompt_token_ids=_flag(body, "return_prompt_token_ids"),
        return_text_in_logprobs=_flag(body, "return_text_in_logprobs"),
    )


def _check_top_level(body: Any) -> None:
    """A JSON object of fields the server knows (an unknown one set to anything but an empty
    value is refused: it would change what SGLang answers), not streamed."""
    if not isinstance(body, dict):
        raise ProtocolError(
            'the body must be a JSON object like {"input_ids": [[...]], "sampling_params": {...}}'
        )
    for key, value in body.items():
        if key not in TOP_LEVEL and value not in (None, False, [], {}):
            raise ProtocolError(
                f"field {key!r} is not supported by the reference server; supported: "
                f"{', '.join(TOP_LEVEL)}"
            )
    if _flag(body, "stream"):
        raise ProtocolError(
            "stream=true is not supported by the reference server; send stream=false"
        )


def _prompts(body: dict[str, Any], tokenizer: TokenizerLike) -> tuple[list[list[int]], bool]:
    """Every prompt's token ids (``input_ids``, or ``text`` tokenised here), and whether the body
    was a batch (its answer is then a list)."""
    has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
    if has_ids == has_text:
        raise ProtocolError(
            "give exactly one of 'input_ids' (list of ints, or list of lists) and 'text' "
            "(string or list)"
        )
    if has_ids:
        ids = body["input_ids"]
        if _is_int_list(ids) and ids:
            prompts, batched = [ids], False
        elif isinstance(ids, list) and ids and all(_is_int_list(p) for p in ids):
            prompts, batched = [list(p) for p in ids], True
        else:
            raise ProtocolError(
                "input_ids must be a non-empty list of token ids or a non-empty list of such lists"
            )
    else:
        text = body["text"]
        if isinstance(text, str):
            prompts, batched = [tokenizer.encode(text)], False
        elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            prompts, batched = [tokenizer.encode(t) for t in text], True
        else:
            raise ProtocolError("text must be a string or a non-empty list of strings")
    for i, p in enumerate(prompts):
        if not p:
            raise ProtocolError(
                f"prompt {i} is empty; every request needs at least one input token"
            )
    return prompts, batched


def _sampling_per_prompt(raw: Any, count: int) -> list[SamplingParams]:
    """One ``sampling_params`` for every prompt, or one per prompt."""
    if not isinstance(raw, list):
        return [_sampling(raw, "sampling_params")] * count
    if len(raw) != count:
        raise ProtocolError(
            f"sampling_params has {len(raw)} entries for {count} prompts; give one "
            "or one per prompt"
        )
    return [_sampling(sp, f"sampling_params[{i}]") for i, sp in enumerate(raw)]


def _logprob_request(body: dict[str, Any], prompts: list[list[int]]) -> tuple[int, bool, int]:
    """``top_logprobs_num``, ``return_logprob`` and ``logprob_start_len`` (-1: none), checked
    against each other and against every prompt, as SGLang takes them."""
    top_n = body.get("top_logprobs_num") or 0
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise ProtocolError(f"top_logprobs_num must be an integer >= 0, got {top_n!r}")
    ret_lp = _flag(body, "return_logprob")
    if top_n and not ret_lp:
        raise ProtocolError(
            "top_logprobs_num needs return_logprob=true (SGLang returns top logprobs only then)"
        )
    start = -1 if body.get("logprob_start_len") is None else body["logprob_start_len"]
    if not isinstance(start, int) or isinstance(start, bool) or start < -1:
        raise ProtocolError(f"logprob_start_len must be an integer >= -1, got {start!r}")
    too_long = [i for i, p in enumerate(prompts) if ret_lp and start > len(p)]
    if too_long:
        i = too_long[0]
        raise ProtocolError(
            f"logprob_start_len={start} is larger than prompt {i} ({len(prompts[i])} tokens)"
        )
    return top_n, ret_lp, start


def _rids(raw: Any, count: int) -> list[str] | None:
    """The request ids: a string for a single input, or one per prompt (None: none given)."""
    if raw is None:
        return None
    rids = [raw] if isinstance(raw, str) else raw
    if not (
        isinstance(rids, list) and len(rids) == count and all(isinstance(r, str) for r in rids)
    ):
        raise ProtocolError(
            "rid must be a string (single input) or a list of strings, one per prompt"
        )
    return rids


def _lp_entries(entries: Any, tokenizer: TokenizerLike, with_text: bool) -> list[list[Any]]:
    return [
        [lp, tid, tokenizer.decode([tid], skip_special_tokens=False) if with_text else None]
        for lp, tid in entries
    ]


#: perf_counter to wall-clock seconds, as SGLang's ``convert_time_to_realtime`` converts its stamps.
_REALTIME_OFFSET = time.time() - time.perf_counter()


def _time_stats(times: RequestTimes | None) -> dict[str, float]:
    """SGLang's per-request time stats under their ``meta_info`` names (SGLang sends them with
    ``--enable-metrics``; ``observability/req_time_stats.py``), in wall-clock seconds: the start of
    the prefill forward that prefilled the request (one stamp per forward), its end, and the
    request's finish. A stamp never reached is left out."""
    if times is None:
        return {}
    stamps = {
        "forward_entry_time": times.forward_entry,
        "prefill_finished_time": times.prefill_finished,
        "request_finished_ts": times.finished,
    }
    return {key: at + _REALTIME_OFFSET for key, at in stamps.items() if at > 0}


def result_json(
    result: GenerationResult,
    tokenizer: TokenizerLike,
    return_prompt_token_ids: bool = False,
    return_text_in_logprobs: bool = False,
) -> dict[str, Any]:
    """One ``/generate`` answer entry with SGLang's keys (``reference/sglang-api.md`` section 2)."""
    meta: dict[str, Any] = {
        "id": result.rid,
        "finish_reason": result.finish_reason.to_json(),
        "prompt_tokens": len(result.input_ids),
        "completion_tokens": result.completion_tokens,
        "cached_tokens": 0,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "e2e_latency": result.e2e_latency,
    }
    # Reference-server extensions (SGLang has neither): which prefill forward prefilled the
    # request, and the wall time of the decode / verify steps it ran in.
    if result.prefill_forward is not None:
        meta["prefill_forward"] = result.prefill_forward
    if result.decode_s is not None:
        meta["decode_seconds"] = result.decode_s
    meta.update(_time_stats(result.times))
    spec = result.spec
    if spec is not None and spec.verify_ct > 0:
        meta["spec_verify_ct"] = spec.verify_ct
        meta["spec_num_correct_drafts"] = spec.num_correct_drafts
        meta["spec_num_proposed_drafts"] = proposed = spec.num_proposed_drafts
        meta["spec_accept_rate"] = spec.num_correct_drafts / proposed if proposed else 0.0
        meta["spec_accept_length"] = result.completion_tokens / spec.verify_ct
        meta["spec_correct_drafts_histogram"] = list(spec.correct_drafts_histogram)
    if result.input_token_logprobs is not None:
        meta["input_token_logprobs"] = _lp_entries(
            result.input_token_logprobs, tokenizer, return_text_in_logprobs
        )
    if result.output_token_logprobs is not None:
        meta["output_token_logprobs"] = _lp_entries(
            result.output_token_logprobs, tokenizer, return_text_in_logprobs
        )
        meta["output_token_logprobs_length"] = len(result.output_token_logprobs)
    # top logprobs: per position a list of [logprob, id, text-or-None], best first; a None position
    # stays None
    for key in ("input_top_logprobs", "output_top_logprobs"):
        positions = getattr(result, key)
        if positions is not None:
            meta[key] = [
                None if top is None else _lp_entries(top, tokenizer, return_text_in_logprobs)
                for top in positions
            ]
    if result.spec_drafts is not None:
        meta["spec_drafts"] = [list(d) for d in result.spec_drafts]
    out: dict[str, Any] = {
        "text": tokenizer.decode(result.output_ids),
        "output_ids": list(result.output_ids),
        "meta_info": meta,
    }
    if return_prompt_token_ids:
        out["prompt_token_ids"] = list(result.input_ids)
    return out
