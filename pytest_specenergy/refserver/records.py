"""Frozen records of the reference engine's API: configuration, requests and results.

The result records carry SGLang's field names and semantics (``reference/sglang-api.md`` sections
2 and 6) so that :mod:`.protocol` can turn them into ``/generate`` answers without arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any

from .faults import validate_faults
from .names import DEVICES
from .names import DRAFTERS
from .names import DTYPES

# random_models (and the tokenizer it builds on) load at the end of EngineConfig.__post_init__.


@dataclass(frozen=True)
class EngineConfig:
    """Everything that defines one engine (one server process)."""

    model: str = "tiny:dense"  # tiny:*, random:NAME[:key=value,...] or a checkpoint directory
    drafter: str = "none"
    num_draft_tokens: int = 4  # K: drafted tokens per step; the target verifies K + 1
    ngram_min_match_window: int = 1
    ngram_max_match_window: int = 12
    draft_model: str | None = None  # default: the registered draft of a tiny model
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    max_running_requests: int = 32
    faults: tuple[str, ...] = ()
    block_size: int | None = (
        None  # block drafter: positions verified per step (drafts = block_size - 1)
    )
    draft_accept_p: float | None = (
        None  # controlled acceptance: P(a drafted token is the target's own)
    )
    # fault "numerical-noise": relative logit noise (bf16 ulp)
    numerical_noise_scale: float = 2.0**-8
    # verify the drafts each request brings (spec_replay_drafts) while the drafter's passes still
    # run
    replay_proposals: bool = False

    def __post_init__(self) -> None:
        self._check_choices()
        object.__setattr__(self, "faults", validate_faults(self.faults))
        self._resolve_block()
        self._check_drafts_source()
        if not 0.0 < self.numerical_noise_scale < 1.0:
            raise ValueError(
                f"numerical_noise_scale must be in (0, 1), got {self.numerical_noise_scale}"
            )
        # A bad random:* name or override fails here, in milliseconds, not after a target has
        # loaded.
        from .random_models import is_random_model
        from .random_models import parse_random_model

        specs = {
            name: parse_random_model(name)
            for name in (self.model, self.draft_model)
            if is_random_model(name)
        }
        if self.drafter in ("draft_model", "block") and len(specs) == 2:
            target, draft = specs[self.model], specs[self.draft_model]  # type: ignore[index]
            if target.vocab != draft.vocab:
                raise ValueError(
                    f"draft model {draft.name!r} has vocabulary {draft.vocab}, the target "
                    f"{target.name!r} {target.vocab}: they must share a tokenizer (set both with "
                    ":vocab=N)"
                )

    def _check_choices(self) -> None:
        """Every named setting one of its choices, every count in range."""
        for name, choices in (("drafter", DRAFTERS), ("dtype", DTYPES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if not (self.device in DEVICES or self.device.startswith("cuda:")):
            raise ValueError(f"device must be one of {DEVICES} (or cuda:N), got {self.device!r}")
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if not 1 <= self.ngram_min_match_window <= self.ngram_max_match_window:
            raise ValueError(
                "need 1 <= ngram_min_match_window <= ngram_max_match_window, got "
                f"{self.ngram_min_match_window} and {self.ngram_max_match_window}"
            )
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")

    def _resolve_block(self) -> None:
        """A block drafter's size and its drafts per step, each from the other."""
        if self.block_size is not None:
            if self.drafter not in ("block", "replay"):
                raise ValueError(
                    f"block_size is for the block (or replay) drafter, not {self.drafter!r}"
                )
            if self.block_size < 2:
                raise ValueError(
                    f"block_size must be >= 2 (the last committed token + >= 1 draft), "
                    f"got {self.block_size}"
                )
            # a block of B positions verifies the last committed token and B - 1 drafts
            object.__setattr__(self, "num_draft_tokens", self.block_size - 1)
        elif self.drafter == "block":
            object.__setattr__(self, "block_size", self.num_draft_tokens + 1)

    def _check_drafts_source(self) -> None:
        """Where verified drafts come from: the drafter, controlled acceptance's oracle, or recorded
        proposals; never two at once."""
        if self.draft_accept_p is not None:
            if self.drafter not in ("draft_model", "block"):
                raise ValueError(
                    "draft_accept_p needs a drafter with draft passes (draft_model or block), "
                    f"not {self.drafter!r}"
                )
            if not 0.0 <= self.draft_accept_p <= 1.0:
                raise ValueError(f"draft_accept_p must be in [0, 1], got {self.draft_accept_p}")
        if self.replay_proposals and self.drafter not in ("draft_model", "block"):
            raise ValueError(
                "replay_proposals replays recorded drafts through a drafter with draft passes "
                f"(draft_model or block), not {self.drafter!r}; drafter 'replay' verifies recorded "
                "drafts with no draft passes"
            )
        if self.replay_proposals and self.draft_accept_p is not None:
            raise ValueError(
                "replay_proposals and draft_accept_p are mutually exclusive: the verified drafts "
                "are either the recorded ones or the oracle's"
            )

    @property
    def speculative(self) -> bool:
        """Whether this engine drafts and verifies."""
        return self.drafter != "none"

    @property
    def speculative_algorithm(self) -> str | None:
        """SGLang's name for the algorithm (``None`` for a plain engine)."""
        return None if self.drafter == "none" else self.drafter.upper()

    @property
    def verified_per_step(self) -> int | None:
        """Tokens the target verifies per request per step: the last committed token + K drafts (a
        block's size)."""
        return self.num_draft_tokens + 1 if self.speculative else None


@dataclass(frozen=True)
class SamplingParams:
    """The supported subset of SGLang's sampling parameters (greedy only)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # drafts to verify, one tuple per verify step (the ``replay`` drafter; ``spec_replay_drafts``)
    replay_drafts: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature != 0:
            raise ValueError(
                "temperature must be 0 (the reference engine decodes greedily), got "
                f"{self.temperature}"
            )


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete."""

    input_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output logprobs only (SGLang's default)
    rid: str | None = None
    top_logprobs_num: int = 0  # > 0: also the top-N logprobs per position (with return_logprob)
    return_spec_drafts: bool = False  # report the drafts of every verify step (for a replay run)

    def __post_init__(self) -> None:
        if len(self.input_ids) == 0:
            raise ValueError("input_ids must not be empty")
        if self.return_logprob and self.logprob_start_len > len(self.input_ids):
            raise ValueError(
                f"logprob_start_len ({self.logprob_start_len}) is larger than the prompt "
                f"({len(self.input_ids)} tokens)"
            )


@dataclass(frozen=True)
class FinishReason:
    """SGLang's ``finish_reason``: ``length`` (with the limit), ``stop`` (with the matched id) or
    ``abort`` (with a message: ``/abort_request`` cut the request; its output so far is returned)."""

    type: str  # "length" | "stop" | "abort"
    length: int | None = None
    matched: int | None = None
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"type": "length", "length": N}``, ``{"type": "stop", "matched": id}`` or ``{"type":
        "abort", ...}``."""
        detail = {"length": "length", "stop": "matched", "abort": "message"}[self.type]
        return {"type": self.type, detail: getattr(self, detail)}


@dataclass(frozen=True)
class SpecStats:
    """Per-request speculative counters, as SGLang reports them."""

    verify_ct: int
    num_correct_drafts: int  # accepted drafts, bonus excluded
    num_proposed_drafts: int  # verify_ct * K
    # index k: verify steps that accepted exactly k drafts
    correct_drafts_histogram: tuple[int, ...]


@dataclass(frozen=True)
class RequestTimes:
    """A request's time stats as SGLang reports them with ``--enable-metrics`` (perf_counter
    seconds; 0: never reached): its prefill forward's start, shared by every request of that
    forward, the forward's end (its first token), and its finish."""

    forward_entry: float = 0.0
    prefill_finished: float = 0.0
    finished: float = 0.0


@dataclass(frozen=True)
class GenerationResult:
    """One finished request."""

    rid: str
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: FinishReason
    e2e_latency: float
    spec: SpecStats | None = None  # None for a plain engine or when no verify step ran
    input_token_logprobs: tuple[tuple[float | None, int], ...] | None = None
    output_token_logprobs: tuple[tuple[float, int], ...] | None = None
    # per position: the top-N (logprob, token id) pairs, best first; input position 0 is None
    input_top_logprobs: tuple[tuple[tuple[float, int], ...] | None, ...] | None = None
    output_top_logprobs: tuple[tuple[tuple[float, int], ...], ...] | None = None
    spec_drafts: tuple[tuple[int, ...], ...] | None = None  # drafts verified per step, if asked
    prefill_forward: int | None = (
        None  # the engine's count of the prefill forward that prefilled it
    )
    decode_s: float | None = None  # wall seconds of the decode / verify steps it ran in
    times: RequestTimes | None = None

    @property
    def completion_tokens(self) -> int:
        """Generated tokens (the first one comes from prefill)."""
        return len(self.output_ids)
