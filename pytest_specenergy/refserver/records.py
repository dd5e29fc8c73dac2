"""Frozen records of the reference engine's API: configuration, requests and results.

The result records carry SGLang's field names and semantics (``reference/sglang-api.md`` sections
2 and 6) so that :mod:`.protocol` can turn them into ``/generate`` answers without arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .faults import validate_faults

DRAFTERS = ("none", "ngram", "draft_model")
DTYPES = ("auto", "float64", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class EngineConfig:
    """Everything that defines one engine (one server process)."""

    model: str = "tiny:dense"
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

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {DRAFTERS}, got {self.drafter!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
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
        object.__setattr__(self, "faults", validate_faults(self.faults))

    @property
    def speculative(self) -> bool:
        """Whether this engine drafts and verifies."""
        return self.drafter != "none"

    @property
    def speculative_algorithm(self) -> str | None:
        """SGLang's name for the algorithm (``None`` for a plain engine)."""
        return {"none": None, "ngram": "NGRAM", "draft_model": "DRAFT_MODEL"}[self.drafter]


@dataclass(frozen=True)
class SamplingParams:
    """The supported subset of SGLang's sampling parameters (greedy only)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature != 0:
            raise ValueError(f"temperature must be 0 (the reference engine decodes greedily), got {self.temperature}")


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete."""

    input_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output logprobs only (SGLang's default)
    rid: str | None = None

    def __post_init__(self) -> None:
        if len(self.input_ids) == 0:
            raise ValueError("input_ids must not be empty")
        if self.return_logprob and self.logprob_start_len > len(self.input_ids):
            raise ValueError(
                f"logprob_start_len ({self.logprob_start_len}) is larger than the prompt ({len(self.input_ids)} tokens)"
            )


@dataclass(frozen=True)
class FinishReason:
    """SGLang's ``finish_reason``: ``length`` (with the limit) or ``stop`` (with the matched id)."""

    type: str  # "length" | "stop"
    length: int | None = None
    matched: int | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"type": "length", "length": N}`` or ``{"type": "stop", "matched": id}``."""
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "stop", "matched": self.matched}


@dataclass(frozen=True)
class SpecStats:
    """Per-request speculative counters, as SGLang reports them."""

    verify_ct: int
    num_correct_drafts: int  # accepted drafts, bonus excluded
    num_proposed_drafts: int  # verify_ct * K
    correct_drafts_histogram: tuple[int, ...]  # index k: verify steps that accepted exactly k drafts


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

    @property
    def completion_tokens(self) -> int:
        """Generated tokens (the first one comes from prefill)."""
        return len(self.output_ids)
