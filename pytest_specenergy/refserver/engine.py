"""The reference engine: greedy, continuously batched decoding, optionally speculative, on HF
models.

Why speculative output equals the plain engine's token for token: its section of
``docs/reference-server.md#the-speculative-step``."""

from __future__ import annotations

import dataclasses
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
from .early_exit import early_exit_view
from .early_exit import is_early_exit
from .early_exit import parse_early_exit
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

VERSION = "reference-0.2.0"


class ReferenceEngine:
    """A real, continuously batched, greedy inference engine with SGLang's counters and a work
    trace."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.trace = WorkTrace()
        self.target: LoadedModel = load_model(
            config.model, config.dtype, config.device, config.seed
        )
        self.tokenizer = self.target.tokenizer
        self.runner = ModelRunner(self.target.model, "target", self.trace)
        if "numerical-noise" in config.faults:
            self.runner.noise_scale = config.numerical_noise_scale
            self.runner.seed = config.seed
        self.draft = (
            self._load_draft(config) if config.drafter in ("draft_model", "block") else None
        )
        self.draft_runner = (
            ModelRunner(self.draft.model, "draft", self.trace) if self.draft is not None else None
        )
        self._oracle: ModelRunner | None = None
        self.stats = EngineStats()
        self.lock = threading.Lock()  # held by the scheduler for each iteration
        self.scheduler = Scheduler(self, self.stats, config.max_running_requests, self.lock)

    def _load_draft(self, config: EngineConfig) -> LoadedModel:
        name = config.draft_model or default_draft_for(config.model)
        if name is None:
            raise ValueError(f"--drafter {config.drafter} needs --draft-model for {config.model!r}")
        # a self-draft shares the target's weights, not its cache
        if is_early_exit(name):
            return self._early_exit_draft(name)
        draft = (
            self.target
            if name == config.model
            else load_model(name, config.dtype, config.device, config.seed)
        )
        if draft.vocab_size != self.target.vocab_size:
            hint = (
                " (a random:* model's vocabulary is set with :vocab=N)"
                if "random:" in name + config.model
                else ""
            )
            raise ValueError(
                f"draft model {name!r} has vocabulary {draft.vocab_size}, "
                f"the target {self.target.vocab_size}: they must share a tokenizer{hint}"
            )
        return draft

    def _early_exit_draft(self, name: str) -> LoadedModel:
        """``early-exit:K``: the target's first K layers and its head (:mod:`.early_exit`)."""
        target = self.target
        layers = len(target.model.get_decoder().layers)
        view = early_exit_view(target.model, parse_early_exit(name, layers))
        return dataclasses.replace(target, name=name, model=view)

    # --------------------------------------------------------------------------------- public
    @property
    def draft_model_name(self) -> str | None:
        """Name of the draft model in use, if any."""
        return self.draft.name if self.draft is not None else None

    def warmup(self) -> None:
        """Run one small batch (as SGLang does before it reports ready): first-call costs (lazy
        allocations, kernel selection) stay out of the first measured request; only the trace and
        lifetime counters keep it."""
        sampling = SamplingParams(max_new_tokens=8, ignore_eos=True)
        self.generate([GenerationRequest(p, sampling) for p in ((3, 4, 5, 6, 7), (8, 9))])
        self.flush_cache()

    def flush_cache(self) -> bool:
        """Reset the since-flush counters (``step_time_dict``, accept length); the trace and the
        lifetime counters stay. False while busy: as SGLang, only an idle engine flushes."""
        if self.scheduler.busy:
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
                raise ValueError(
                    f"prompt ({len(req.input_ids)}) + max_new_tokens "
                    f"({req.sampling.max_new_tokens}) exceeds the model's context of {limit} "
                    "tokens"
                )
        k = self.config.num_draft_tokens if self.config.speculative else 0
        wrong = "wrong-accept-count" in self.config.faults
        rows = [
            Row(
                rid=req.rid or uuid.uuid4().hex,
                request=req,
                ticket=None,
                k=k,
                tokens=list(req.input_ids),
                wrong_accept_count=wrong,
            )
            for req in requests
        ]
        ticket = Ticket(rows)
        queued = []
        for row in rows:
            row.ticket = ticket
            if row.request.sampling.max_new_tokens or row.request.return_logprob:
                queued.append(row)
            # no token and no logprob (coherence's tokenisation): the prompt's ids answer it, no
            # forward
            else:
                row.finish, row.finish_time = FinishReason("length", length=0), time.perf_counter()
                self.stats.finished(1)
                ticket.row_finished()
        if queued:
            self.scheduler.submit(queued)
        return ticket

    def abort(self, rid: str | None = None) -> None:
        """Abort request ``rid``, or every request (None); each answers with what it has so far."""
        self.scheduler.abort(rid)

    def set_admission_cap(self, cap: int) -> None:
        """SGLang's ``max_running_requests`` set at run time (from the next iteration; at most the
        configured one)."""
        if (
            not isinstance(cap, int)
            or isinstance(cap, bool)
            or not 1 <= cap <= self.config.max_running_requests
        ):
            raise ValueError(
                f"max_running_requests must be an integer from 1 to the engine's "
                f"--max-running-requests ({self.config.max_running_requests}), got {cap!r}"
            )
        self.scheduler.set_max_running(cap)

    def generate(
        self, requests: Sequence[GenerationRequest], timeout: float | None = None
    ) -> list[GenerationResult]:
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
        if cfg.drafter == "ngram":
            return NgramDrafter(
                cfg.num_draft_tokens, cfg.ngram_min_match_window, cfg.ngram_max_match_window
            )
        if cfg.drafter == "replay":
            return ReplayDrafter(cfg.num_draft_tokens)
        if cfg.drafter in ("draft_model", "block"):
            assert self.draft_runner is not None
            self_draft = cfg.drafter == "draft_model" and self.draft is self.target
            return build_draft_pass_drafter(
                cfg,
                self.draft_runner,
                self.tokenizer.pad_token_id,
                self.target.vocab_size,
                None if self_draft else self._oracle_runner,
            )
        return None

    def _oracle_runner(self) -> ModelRunner:
        """The target's untraced runner that controlled acceptance drafts its truth with: made
        once, shared by every drafter this engine builds (a flush builds a new one)."""
        if self._oracle is None:
            self._oracle = ModelRunner(self.target.model, "oracle", None)
        return self._oracle

    def prefill(self, rows: Sequence[Row]) -> BatchKV:
        """Prefill ``rows`` (prompts left-padded) in a fresh cache; commit each row's first token."""
        kv = BatchKV(self.target.model, len(rows))
        width = max(len(r.tokens) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        valid = torch.zeros((len(rows), width), dtype=torch.bool)
        r_idx: list[int] = []
        c_idx: list[int] = []
        spans: list[
            tuple[int, int, int]
        ] = []  # per row: first logit index, logits, first logprob position
        for b, row in enumerate(rows):
            p = row.tokens
            pad = width - len(p)
            ids[b, pad:] = torch.tensor(p, dtype=torch.long)
            valid[b, pad:] = True
            start = (
                len(p) - 1 if row.request.logprob_start_len < 0 else row.request.logprob_start_len
            )
            first = min(pad + max(start, 0), width - 1) if row.request.return_logprob else width - 1
            spans.append((len(r_idx), width - first, start))
            r_idx.extend([b] * (width - first))
            c_idx.extend(range(first, width))
        out = self.runner.forward(
            kv,
            ids,
            valid,
            torch.tensor(r_idx),
            torch.tensor(c_idx),
            "prefill",
            [r.rid for r in rows],
        )
        assert out.logits is not None
        logp = self.logprobs_if_asked(rows, out.logits)
        eos = self.target.eos_token_ids
        for b, row in enumerate(rows):
            first, count, start = spans[b]
            last = first + count - 1
            token = int(out.logits[last].argmax())
            if logp is not None and row.request.return_logprob:
                self._input_logprobs(row, logp, first, start)
            if row.request.sampling.max_new_tokens == 0:  # scoring only
                row.finish = FinishReason("length", length=0)
                row.finish_time = time.perf_counter()
            else:
                row.commit(token, logp[last] if logp is not None else None, eos)
        return kv

    @staticmethod
    def _input_logprobs(row: Row, logp: torch.Tensor, first: int, start: int) -> None:
        # entry k is token input_ids[start+k] given everything before it (logits row first + k - 1);
        # entry 0 has none
        toks = row.tokens
        head: list[tuple[float | None, int]] = [(None, toks[start])] if start < len(toks) else []
        later = range(1, len(toks) - start)
        row.input_lp = head + [
            (float(logp[first + k - 1, toks[start + k]]), toks[start + k]) for k in later
        ]
        if row.request.top_logprobs_num > 0:
            row.input_top = [None] * len(head) + [row.top(logp[first + k - 1]) for k in later]

    @staticmethod
    def logprobs_if_asked(rows: Sequence[Row], logits: torch.Tensor) -> torch.Tensor | None:
        """log-softmax of ``logits`` in float64 when any row asked for logprobs (else None)."""
        return (
            torch.log_softmax(logits.double(), dim=-1)
            if any(r.request.return_logprob for r in rows)
            else None
        )

    def decode(self, rows: Sequence[Row], kv: BatchKV) -> None:
        """One plain decode step: feed each row's last token, commit the argmax."""
        ids = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long)
        n = len(rows)
        out = self.runner.forward(
            kv,
            ids,
            None,
            torch.arange(n),
            torch.zeros(n, dtype=torch.long),
            "decode",
            [r.rid for r in rows],
        )
        assert out.logits is not None
        nxt = out.logits.argmax(dim=-1).tolist()
        logp = self.logprobs_if_asked(rows, out.logits)
        eos = self.target.eos_token_ids
        for b, row in enumerate(rows):
            row.commit(int(nxt[b]), None if logp is None else logp[b], eos)

    def verify(self, rows: Sequence[Row], kv: BatchKV, drafter: Drafter) -> None:
        """One speculative step over ``rows`` (the running batch, in cache order): draft, verify
        ``[last, d1..dK]`` per row in one forward, accept, roll back, commit (its section of
        ``docs/reference-server.md#the-speculative-step``)."""
        k, faults = self.config.num_draft_tokens, self.config.faults
        drafts = drafter.propose(rows)
        n = len(rows)
        ids = torch.tensor([[r.tokens[-1], *d] for r, d in zip(rows, drafts)], dtype=torch.long)
        stale_fault = kv.has_linear and "stale-state-after-empty-draft" in faults
        if stale_fault:
            # the fault: a zero-draft step reads slot 0 of the previous verify's states, not its
            # last accepted token's (vLLM #39273): wrong only after a step that accepted drafts,
            # which then vanish from the state
            for b, row in enumerate(rows):
                if drafter.empty[b] and row.stale_state is not None:
                    kv.set_row_state(b, row.stale_state)
        snapshot = kv.snapshot_linear() if kv.has_linear else []
        rows_idx, cols_idx = torch.arange(n).repeat_interleave(k + 1), torch.arange(k + 1).repeat(n)
        out = self.runner.forward(
            kv,
            ids,
            None,
            rows_idx,
            cols_idx,
            "verify",
            [r.rid for r in rows],
            capture_linear=kv.has_linear,
        )
        assert out.logits is not None
        logits = out.logits.view(n, k + 1, -1)
        greedy = logits.argmax(dim=-1)  # [n, K+1]: the target's choice after each fed token
        match = (greedy[:, :k] == ids[:, 1:].to(greedy.device)).long()
        if "dead-drafter" in faults:
            from .faults import dead_drafter

            match = dead_drafter(match)
        accepted = match.cumprod(dim=1).sum(dim=1).tolist()
        if "accept-off-by-one" in faults:
            # the off-by-one: the first mismatching draft is accepted too, so a token the
            # target did not choose enters the output while acceptance looks better
            accepted = [min(a + 1, k) for a in accepted]
        kv.drop_last([k - a for a in accepted])
        if kv.has_linear and "skip-state-rollback" not in faults:
            if stale_fault:
                self._remember_slot0_state(rows, kv, snapshot, accepted, k + 1)
            # fed tokens whose recurrent update each row keeps: the last committed one and its
            # accepted drafts
            keep = [a + 1 for a in accepted]
            if "partial-accept-state" in faults:
                # the slip: only an all-rejected step is rolled back; a partial accept keeps every
                # fed token
                keep = [1 if a == 0 else k + 1 for a in accepted]
            self.runner.rollback_linear(kv, snapshot, keep, k + 1)
        logp = self.logprobs_if_asked(rows, logits.reshape(n * (k + 1), -1))
        greedy_l = greedy.tolist()
        eos = self.target.eos_token_ids
        committed_all: list[list[int]] = []
        for b, row in enumerate(rows):
            a = int(accepted[b])
            new = [int(t) for t in drafts[b][:a]] + [int(greedy_l[b][a])]
            committed: list[int] = []
            for j, token in enumerate(new):
                committed.append(token)
                if row.commit(token, None if logp is None else logp[b * (k + 1) + j], eos):
                    break
            row.count_verify(len(committed))
            if row.request.return_spec_drafts:
                row.drafts.append(tuple(int(t) for t in drafts[b]))
            self.stats.verified(len(committed))
            committed_all.append(committed)
        drafter.after_verify(accepted, committed_all)

    def _remember_slot0_state(
        self,
        rows: Sequence[Row],
        kv: BatchKV,
        snapshot: Sequence[torch.Tensor],
        accepted: Sequence[int],
        width: int,
    ) -> None:
        # Slot 0's state: restore the pre-verify snapshot and replay one token, then put the live
        # state back.
        live = kv.snapshot_linear()
        self.runner.rollback_linear(kv, snapshot, [1] * len(rows), width, keep_inputs=True)
        for b, row in enumerate(rows):
            row.stale_state = kv.row_state(b) if accepted[b] > 0 else None
        kv.restore_linear_rows(live, torch.ones(kv.batch_size, dtype=torch.bool, device=kv.device))

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
            state["spec_replay_misses"] = (
                misses  # verify steps that had no (or a wrong-size) recorded draft
            )
        # real shapes to price the trace at
        return {
            "version": VERSION,
            "engine": "reference",
            "pid": os.getpid(),
            "scheduler": "continuous",
            "model_path": cfg.model,
            "dtype": str(self.target.dtype).replace("torch.", ""),
            # fault numerical-noise: the rounding the logits carry, as a dtype states it (the
            # plugin's tie rule reads it)
            "logit_noise_scale": (
                cfg.numerical_noise_scale if "numerical-noise" in cfg.faults else None
            ),
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
            "priced_as": priced_as_for(cfg.model, self.draft_model_name),
            "internal_states": [state],
        }
