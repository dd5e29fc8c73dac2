"""One request's mutable state while it is queued or running, and its SGLang-shaped result.

The row's life and its SGLang counters: its section of ``docs/reference-server.md#a-requests-counters``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from dataclasses import field

import torch

from .records import FinishReason
from .records import GenerationRequest
from .records import GenerationResult
from .records import RequestTimes
from .records import SpecStats

TopEntries = tuple[tuple[float, int], ...]


class Ticket:
    """The rows of one ``submit`` call; :meth:`wait` blocks until every one has finished."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows
        self.remaining = len(rows)
        self.error: BaseException | None = None
        self.done = threading.Event()
        if not rows:
            self.done.set()

    def row_finished(self) -> None:
        """Called by the scheduler thread once per finished row."""
        self.remaining -= 1
        if self.remaining <= 0:
            self.done.set()

    def fail(self, error: BaseException) -> None:
        """The engine could not run these rows; :meth:`wait` re-raises ``error``."""
        self.error = error
        self.done.set()

    def wait(self, timeout: float | None = None) -> list[GenerationResult]:
        """Results in submission order (raises what the engine raised)."""
        if not self.done.wait(timeout):
            raise TimeoutError(
                f"{self.remaining} of {len(self.rows)} requests still running after {timeout} s"
            )
        if self.error is not None:
            raise RuntimeError(
                f"the engine failed while running this request: {self.error!r}"
            ) from self.error
        return [row.result() for row in self.rows]


@dataclass(eq=False)
class Row:
    """Mutable state of one request (internal to the engine)."""

    rid: str
    request: GenerationRequest
    ticket: Ticket | None
    k: int  # drafts per verify step (0 for a plain engine)
    tokens: list[int]  # prompt + committed output
    submitted: float = field(default_factory=time.perf_counter)
    output: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    finish_time: float = 0.0
    verify_ct: int = 0
    correct: int = 0
    hist: list[int] = field(default_factory=list)
    drafts: list[tuple[int, ...]] = field(default_factory=list)  # verified drafts, if asked
    input_lp: list[tuple[float | None, int]] | None = None
    input_top: list[TopEntries | None] | None = None
    output_lp: list[tuple[float, int]] = field(default_factory=list)
    output_top: list[TopEntries] = field(default_factory=list)
    abort_requested: bool = False  # marked by Scheduler.abort; finished at the next iteration
    # Which prefill forward prefilled this row (the scheduler's count): rows that share it were
    # prefilled together, so a prefill-only rerun can repeat that grouping forward for forward.
    prefill_forward: int | None = None
    decode_s: float = 0.0  # wall seconds of the decode / verify steps this row was in (its own TBT)
    # SGLang's request time stats (perf_counter; 0: not yet): when its prefill forward began (one
    # value for every row of that forward, as SGLang's ``set_time_batch`` stamps it) and ended.
    forward_entry_time: float = 0.0
    prefill_finished_time: float = 0.0
    wrong_accept_count: bool = False  # fault: report the bonus token as an accepted draft
    stale_state: list[torch.Tensor] | None = None  # fault stale-state-after-empty-draft only

    def top(self, logp: torch.Tensor) -> TopEntries:
        """The top-N (logprob, id) of one position's log-softmax row, best first."""
        n = min(self.request.top_logprobs_num, int(logp.shape[-1]))
        values, ids = torch.topk(logp, n)
        return tuple((float(v), int(i)) for v, i in zip(values.tolist(), ids.tolist()))

    def commit(self, token: int, logp: torch.Tensor | None, eos_ids: tuple[int, ...]) -> bool:
        """Append one token (``logp``: its position's log-softmax row); True if the row finished
        (length is checked before stop tokens, as SGLang does)."""
        self.output.append(token)
        self.tokens.append(token)
        if logp is not None and self.request.return_logprob:
            self.output_lp.append((float(logp[token]), token))
            if self.request.top_logprobs_num > 0:
                self.output_top.append(self.top(logp))
        sp = self.request.sampling
        if len(self.output) >= sp.max_new_tokens:
            self.finish = FinishReason("length", length=sp.max_new_tokens)
        elif token in sp.stop_token_ids or (not sp.ignore_eos and token in eos_ids):
            self.finish = FinishReason("stop", matched=token)
        if self.finish is not None:
            self.finish_time = time.perf_counter()
            return True
        return False

    def count_verify(self, committed: int) -> None:
        """One verify step committed ``committed`` tokens (accepted drafts + bonus, cut at a
        finish)."""
        self.verify_ct += 1
        self.correct += committed - 1
        self.hist.extend([0] * (self.k + 1 - len(self.hist)))  # nothing when long enough
        self.hist[committed - 1] += 1

    def result(self) -> GenerationResult:
        """The finished request, with SGLang's counters."""
        spec = None
        if self.k and self.verify_ct > 0:
            correct, hist = self.correct, list(self.hist)
            if self.wrong_accept_count:
                # the classic slip: counting accept_lens (bonus included) as correct drafts
                correct += self.verify_ct
                hist = [0] + hist
            spec = SpecStats(
                verify_ct=self.verify_ct,
                num_correct_drafts=correct,
                num_proposed_drafts=self.verify_ct * self.k,
                correct_drafts_histogram=tuple(hist),
            )
        req = self.request
        return GenerationResult(
            rid=self.rid,
            input_ids=tuple(req.input_ids),
            output_ids=tuple(self.output),
            finish_reason=self.finish or FinishReason("length", length=req.sampling.max_new_tokens),
            e2e_latency=max(self.finish_time - self.submitted, 0.0),
            spec=spec,
            input_token_logprobs=tuple(self.input_lp) if self.input_lp is not None else None,
            output_token_logprobs=tuple(self.output_lp) if req.return_logprob else None,
            input_top_logprobs=tuple(self.input_top) if self.input_top is not None else None,
            output_top_logprobs=tuple(self.output_top)
            if req.return_logprob and req.top_logprobs_num
            else None,
            spec_drafts=tuple(self.drafts) if req.return_spec_drafts and self.k else None,
            prefill_forward=self.prefill_forward,
            decode_s=self.decode_s,
            times=RequestTimes(
                self.forward_entry_time, self.prefill_finished_time, self.finish_time
            ),
        )
