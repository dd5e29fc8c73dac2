"""The reference engine: greedy, continuously batched decoding, optionally speculative, on HF models.

Why speculative output equals the plain engine's token for token: its section of ``docs/design/refserver.md``."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from .drafters import Drafter
from .drafters import NgramDrafter
from .drafters import ReplayDrafter
from .kv import BatchKV
from .models import LoadedModel
from .models import load_model
from .oracle import build_draft_pass_drafter
from .records import EngineConfig
from .records import FinishReason
from .records import GenerationRequest
from .records import GenerationResult
from .records import SamplingParams
from .rows import Row
from .rows import Ticket
from .runner import ModelRunner
from .scheduler import Scheduler
from .stats import EngineStats
from .tiny_models import default_draft_for
from .tiny_models import priced_as_for
from .trace import WorkTrace
from .verify import verify_step

VERSION = "reference-0.2.0"


class ReferenceEngine:
    """A real, continuously batched, greedy inference engine with SGLang's counters and a work trace."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.trace = WorkTrace()
        self.target: LoadedModel = load_model(config.model, config.dtype, config.device, config.seed)
        self.tokenizer = self.target.tokenizer
        self.runner = ModelRunner(self.target.model, "target", self.trace)
        if "numerical-noise" in config.faults:
            self.runner.noise_scale = config.numerical_noise_scale
            self.runner.seed = config.seed
        self.draft: LoadedModel | None = None
        self.draft_runner: ModelRunner | None = None
        if config.drafter in ("draft_model", "block"):
            self.draft = self._load_draft(config)
            self.draft_runner = ModelRunner(self.draft.model, "draft", self.trace)
        self.stats = EngineStats()
        self.lock = threading.Lock()  # held by the scheduler for each iteration
        self.scheduler = Scheduler(self, self.stats, config.max_running_requests, self.lock)

    def _load_draft(self, config: EngineConfig) -> LoadedModel:
        name = config.draft_model or default_draft_for(config.model)
        if name is None:
            raise ValueError(f"--drafter {config.drafter} needs --draft-model for {config.model!r}")
        # a self-draft shares the target's weights, not its cache
        draft = self.target if name == config.model else load_model(name, config.dtype, config.device, config.seed)
        if draft.vocab_size != self.target.vocab_size:
            hint = " (a random:* model's vocabulary is set with :vocab=N)" if "random:" in name + config.model else ""
            raise ValueError(f"draft model {name!r} has vocabulary {draft.vocab_size}, "
                             f"the target {self.target.vocab_size}: they must share a tokenizer{hint}")
        return draft

    # --------------------------------------------------------------------------------- public
    @property
    def draft_model_name(self) -> str | None:
        """Name of the draft model in use, if any."""
        return self.draft.name if self.draft is not None else None

    @property
    def busy(self) -> bool:
        """Whether any request is queued or running."""
        return self.scheduler.busy

    def warmup(self) -> None:
        """Run one small batch through every path (as SGLang does before it reports ready), keeping first-call costs
        (lazy allocations, kernel selection) out of the first measured request; then flush the since-flush counters
        (the trace and lifetime counters keep it)."""
        sampling = SamplingParams(max_new_tokens=8, ignore_eos=True)
        self.generate([GenerationRequest(p, sampling) for p in ((3, 4, 5, 6, 7), (8, 9))])
        self.flush_cache()

    def flush_cache(self) -> bool:
        """Reset the since-flush counters (``step_time_dict``, accept length); the trace and the lifetime
        counters stay. False while busy: as SGLang, only an idle engine flushes."""
        if self.busy:
            return False
        with self.lock:
            self.stats.flush()
        return True

    def submit(self, requests: Sequence[GenerationRequest]) -> Ticket:
        """Queue ``requests`` to join the running batch; ``Ticket.wait()`` gives their results."""
        limit = self.target.max_context
        for req in requests:
            if any(not 0 <= t < self.target.vocab_size for t in req.input_ids):
                raise ValueError(f"input_ids must be token ids in [0, {self.target.vocab_size})")
            if len(req.input_ids) + req.sampling.max_new_tokens > limit:
                raise ValueError(f"prompt ({len(req.input_ids)}) + max_new_tokens ({req.sampling.max_new_tokens}) "
                                 f"exceeds the model's context of {limit} tokens")
        k = self.config.num_draft_tokens if self.config.speculative else 0
        wrong = "wrong-accept-count" in self.config.faults
        rows = [Row(rid=req.rid or uuid.uuid4().hex, request=req, ticket=None, k=k, tokens=list(req.input_ids),
                    wrong_accept_count=wrong) for req in requests]
        ticket = Ticket(rows)
        for row in rows:
            row.ticket = ticket
        if rows:
            self.scheduler.submit(rows)
        return ticket

    def abort(self, rid: str | None = None) -> None:
        """Abort request ``rid``, or every request (None); each answers with what it has so far."""
        self.scheduler.abort(rid)

    def set_admission_cap(self, cap: int) -> None:
        """Admit at most ``cap`` running requests from the next iteration on (SGLang's
        ``max_running_requests``, changed at run time); at most the configured maximum."""
        if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= self.config.max_running_requests:
            raise ValueError(f"max_running_requests must be an integer from 1 to the engine's "
                             f"--max-running-requests ({self.config.max_running_requests}), got {cap!r}")
        self.scheduler.set_max_running(cap)

    def generate(self, requests: Sequence[GenerationRequest], timeout: float | None = None) -> list[GenerationResult]:
        """Run ``requests`` (joining whatever else runs); results in input order."""
        return self.submit(requests).wait(timeout)

    def close(self) -> None:
        """Stop the scheduler thread (queued requests fail)."""
        self.scheduler.close()

    # ------------------------------------------------------------------- driven by the scheduler
    def new_kv(self) -> BatchKV:
        """An empty target cache."""
        return BatchKV(self.target.model, 0)

    def new_drafter(self) -> Drafter | None:
        """The configured drafter, with no rows."""
        cfg = self.config
        pad = self.tokenizer.pad_token_id
        if cfg.drafter == "ngram":
            return NgramDrafter(cfg.num_draft_tokens, cfg.ngram_min_match_window, cfg.ngram_max_match_window)
        if cfg.drafter == "replay":
            return ReplayDrafter(cfg.num_draft_tokens)
        if cfg.drafter in ("draft_model", "block"):
            assert self.draft_runner is not None
            return build_draft_pass_drafter(self, cfg, self.draft_runner, pad)
        return None

    def prefill(self, rows: Sequence[Row]) -> BatchKV:
        """Prefill ``rows`` (prompts left-padded) in a fresh cache; commit each row's first token."""
        kv = BatchKV(self.target.model, len(rows))
        width = max(len(r.tokens) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        valid = torch.zeros((len(rows), width), dtype=torch.bool)
        r_idx: list[int] = []
        c_idx: list[int] = []
        spans: list[tuple[int, int]] = []  # per row: (first logit index, logit position in the row)
        for b, row in enumerate(rows):
            p = row.tokens
            pad = width - len(p)
            ids[b, pad:] = torch.tensor(p, dtype=torch.long)
            valid[b, pad:] = True
            first = width - 1
            if row.request.return_logprob:
                start = row.request.logprob_start_len
                start = len(p) - 1 if start < 0 else start
                first = min(pad + max(start, 0), width - 1)
            spans.append((len(r_idx), width - first))
            r_idx.extend([b] * (width - first))
            c_idx.extend(range(first, width))
        out = self.runner.forward(kv, ids, valid, torch.tensor(r_idx), torch.tensor(c_idx), "prefill",
                                  [r.rid for r in rows])
        assert out.logits is not None
        logp = self.logprobs_if_asked(rows, out.logits)
        eos = self.target.eos_token_ids
        for b, row in enumerate(rows):
            first, count = spans[b]
            last = first + count - 1
            token = int(out.logits[last].argmax())
            if logp is not None and row.request.return_logprob:
                self._input_logprobs(row, logp, first)
            if row.request.sampling.max_new_tokens == 0:  # scoring only
                row.finish = FinishReason("length", length=0)
                row.finish_time = time.perf_counter()
            else:
                row.commit(token, logp[last] if logp is not None else None, eos)
        return kv

    @staticmethod
    def _input_logprobs(row: Row, logp: torch.Tensor, first: int) -> None:
        # entry k is token input_ids[S+k] given everything before it (logits row first + k - 1); entry 0 has none
        toks = row.tokens
        start = row.request.logprob_start_len
        start = len(toks) - 1 if start < 0 else start
        head: list[tuple[float | None, int]] = [(None, toks[start])] if start < len(toks) else []
        later = range(1, len(toks) - start)
        row.input_lp = head + [(float(logp[first + k - 1, toks[start + k]]), toks[start + k]) for k in later]
        if row.request.top_logprobs_num > 0:
            row.input_top = [None] * len(head) + [row.top(logp[first + k - 1]) for k in later]

    @staticmethod
    def logprobs_if_asked(rows: Sequence[Row], logits: torch.Tensor) -> torch.Tensor | None:
        """log-softmax of ``logits`` in float64 when any row asked for logprobs (else None)."""
        if not any(r.request.return_logprob for r in rows):
            return None
        return torch.log_softmax(logits.double(), dim=-1)

    def decode(self, rows: Sequence[Row], kv: BatchKV) -> None:
        """One plain decode step: feed each row's last token, commit the argmax."""
        ids = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long)
        n = len(rows)
        out = self.runner.forward(kv, ids, None, torch.arange(n), torch.zeros(n, dtype=torch.long), "decode",
                                  [r.rid for r in rows])
        assert out.logits is not None
        nxt = out.logits.argmax(dim=-1).tolist()
        logp = self.logprobs_if_asked(rows, out.logits)
        eos = self.target.eos_token_ids
        for b, row in enumerate(rows):
            row.commit(int(nxt[b]), None if logp is None else logp[b], eos)

    verify = verify_step  # draft, verify ``[last, d1..dK]`` per row in one forward, accept, roll back, commit

    # -------------------------------------------------------------------------- server facts
    def avg_spec_accept_length(self) -> float | None:
        """Committed tokens per request per verify step since the last flush (None before any)."""
        return self.stats.avg_spec_accept_length()

    def server_info(self) -> dict[str, Any]:
        """The ``/server_info`` payload (SGLang field names where SGLang has them)."""
        cfg = self.config
        state: dict[str, Any] = {
            "effective_max_running_requests_per_dp": self.scheduler.max_running,
            "num_running_reqs": len(self.scheduler.running),
            "num_queue_reqs": self.scheduler.num_waiting,
            **self.stats.to_json(),
        }
        misses = getattr(self.scheduler.drafter, "misses", None)
        if (cfg.drafter == "replay" or cfg.replay_proposals) and misses is not None:
            state["spec_replay_misses"] = misses  # verify steps that had no (or a wrong-size) recorded draft
        return {
            "version": VERSION,
            "engine": "reference",
            "pid": os.getpid(),
            "scheduler": "continuous",
            "model_path": cfg.model,
            "dtype": str(self.target.dtype).replace("torch.", ""),
            "device": str(self.target.device),
            "random_seed": cfg.seed,
            "speculative_algorithm": cfg.speculative_algorithm,
            "speculative_num_draft_tokens": cfg.num_draft_tokens if cfg.speculative else None,
            "speculative_draft_model_path": self.draft_model_name,
            "speculative_block_size": cfg.block_size,
            "speculative_draft_accept_p": cfg.draft_accept_p,
            "speculative_replay_proposals": cfg.replay_proposals,
            "verified_per_step": cfg.verified_per_step,
            "speculative_ngram_min_match_window_size": cfg.ngram_min_match_window,
            "speculative_ngram_max_match_window_size": cfg.ngram_max_match_window,
            "max_running_requests": cfg.max_running_requests,
            # What POST /set_internal_state may change while the engine runs.
            "settable_internal_state": ["max_running_requests"],
            "faults": list(cfg.faults),
            "model_shape": self.runner.shape.to_json(),
            "draft_model_shape": self.draft_runner.shape.to_json() if self.draft_runner else None,
            "priced_as": priced_as_for(cfg.model, self.draft_model_name),  # real shapes to price the trace at
            "internal_states": [state],
        }
