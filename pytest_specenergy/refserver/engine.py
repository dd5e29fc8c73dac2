"""The reference engine: greedy batched decoding, optionally speculative, on HF transformers models.

One call of :meth:`ReferenceEngine.generate` runs its requests as one batch (in waves of
``max_running_requests``). A wave is prefilled in one forward (prompts left-padded), then every
iteration advances every running row:

* plain engine: one ``decode`` forward feeding each row's last committed token;
* speculative engine: the drafter proposes K tokens per row, and one ``verify`` forward feeds
  ``[last committed, d1..dK]`` for every row. Row ``b`` accepts the longest prefix of drafts that
  equals the target's own greedy choices plus one bonus token (ragged acceptance inside the
  batch); its rejected slots become holes in the KV cache, and for linear attention its recurrent
  state is rolled back (see :meth:`.runner.ModelRunner.rollback_linear`).

Because the target's greedy choice at every committed position is computed from exactly the
committed prefix, speculative output equals the plain engine's token for token (the tests prove it
for every drafter, K and batch size). Finished rows leave the batch at once, so every forward
contains only running rows, and the work trace and ``step_time_dict`` record what really ran.

Counting follows SGLang: the first output token comes from prefill (not a verify step); per verify
step a row commits ``c`` tokens (accepted drafts + bonus, cut at a finish) and counts ``c - 1``
correct drafts, so ``completion_tokens == 1 + spec_verify_ct + spec_num_correct_drafts``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .drafters import Drafter, DraftModelDrafter, NgramDrafter
from .kv import BatchKV
from .models import LoadedModel, load_model
from .records import EngineConfig, FinishReason, GenerationRequest, GenerationResult, SamplingParams, SpecStats
from .runner import ModelRunner
from .tiny_models import default_draft_for
from .trace import WorkTrace

VERSION = "reference-0.1.0"
COMPACT_SLACK = 32  # holes per row tolerated before the target cache is compacted


@dataclass
class _Row:
    """Mutable state of one running request (internal)."""

    index: int  # position in the generate() call
    rid: str
    request: GenerationRequest
    tokens: list[int]  # prompt + committed output
    output: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    finish_time: float = 0.0
    verify_ct: int = 0
    correct: int = 0
    hist: list[int] = field(default_factory=list)
    input_lp: list[tuple[float | None, int]] | None = None
    output_lp: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class _Metrics:
    """Engine-lifetime metrics that ``flush_cache`` resets (SGLang's ``internal_states``)."""

    step_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    accept_tokens: int = 0  # tokens committed by verify steps, summed over rows
    verify_row_steps: int = 0  # verify steps, summed over rows


class ReferenceEngine:
    """A real, batched, greedy inference engine with SGLang-compatible counters and a work trace."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.trace = WorkTrace()
        self.target: LoadedModel = load_model(config.model, config.dtype, config.device, config.seed)
        self.tokenizer = self.target.tokenizer
        self.runner = ModelRunner(self.target.model, "target", self.trace)
        self.draft: LoadedModel | None = None
        self.draft_runner: ModelRunner | None = None
        if config.drafter == "draft_model":
            name = config.draft_model or default_draft_for(config.model)
            if name is None:
                raise ValueError(f"--drafter draft_model needs --draft-model for {config.model!r}")
            if name == config.model:
                self.draft = self.target  # self-draft shares the weights, not the cache
            else:
                self.draft = load_model(name, config.dtype, config.device, config.seed)
            if self.draft.vocab_size != self.target.vocab_size:
                raise ValueError(
                    f"draft model {name!r} has vocabulary {self.draft.vocab_size}, "
                    f"the target {self.target.vocab_size}: they must share a tokenizer"
                )
            self.draft_runner = ModelRunner(self.draft.model, "draft", self.trace)
        self.metrics = _Metrics()
        self.lock = threading.Lock()

    # --------------------------------------------------------------------------------- public
    @property
    def draft_model_name(self) -> str | None:
        """Name of the draft model in use, if any."""
        return self.draft.name if self.draft is not None else None

    def warmup(self) -> None:
        """Run one small batch through every path (as SGLang does before it reports ready).

        First calls pay one-time costs (lazy allocations, kernel selection); doing them here keeps
        them out of the first measured request. Metrics are flushed afterwards; the steps stay in
        the work trace, which meters read by cursor.
        """
        sampling = SamplingParams(max_new_tokens=8, ignore_eos=True)
        prompts = [(3, 4, 5, 6, 7), (8, 9)]
        self.generate([GenerationRequest(p, sampling) for p in prompts])
        self.flush_cache()

    def flush_cache(self) -> None:
        """Reset per-engine metrics (``step_time_dict``, average accept length); the trace stays."""
        with self.lock:
            self.metrics = _Metrics()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Run ``requests`` as one batch (waves of ``max_running_requests``); results in input order."""
        limit = self.target.max_context
        for req in requests:
            if any(not 0 <= t < self.target.vocab_size for t in req.input_ids):
                raise ValueError(f"input_ids must be token ids in [0, {self.target.vocab_size})")
            if len(req.input_ids) + req.sampling.max_new_tokens > limit:
                raise ValueError(
                    f"prompt ({len(req.input_ids)}) + max_new_tokens ({req.sampling.max_new_tokens}) "
                    f"exceeds the model's context of {limit} tokens"
                )
        with self.lock:
            t0 = time.perf_counter()
            rows = [
                _Row(index=i, rid=req.rid or uuid.uuid4().hex, request=req, tokens=list(req.input_ids))
                for i, req in enumerate(requests)
            ]
            wave = self.config.max_running_requests
            for start in range(0, len(rows), wave):
                self._run_wave(rows[start : start + wave])
            return [self._result(row, t0) for row in rows]

    # ------------------------------------------------------------------------------- internals
    def _new_drafter(self) -> Drafter | None:
        cfg = self.config
        if cfg.drafter == "ngram":
            return NgramDrafter(cfg.num_draft_tokens, cfg.ngram_min_match_window, cfg.ngram_max_match_window)
        if cfg.drafter == "draft_model":
            assert self.draft_runner is not None
            return DraftModelDrafter(
                self.draft_runner,
                cfg.num_draft_tokens,
                self.tokenizer.pad_token_id,
                stale_cache="stale-draft-cache" in cfg.faults,
            )
        return None

    def _commit(self, row: _Row, token: int, logprob: float | None) -> bool:
        """Append one token; return True if the row finished (length is checked first, as SGLang)."""
        row.output.append(token)
        row.tokens.append(token)
        if logprob is not None:
            row.output_lp.append((logprob, token))
        sp = row.request.sampling
        if len(row.output) >= sp.max_new_tokens:
            row.finish = FinishReason("length", length=sp.max_new_tokens)
        elif token in sp.stop_token_ids or (not sp.ignore_eos and token in self.target.eos_token_ids):
            row.finish = FinishReason("stop", matched=token)
        if row.finish is not None:
            row.finish_time = time.perf_counter()
            return True
        return False

    def _prefill(self, rows: list[_Row], kv: BatchKV) -> None:
        prompts = [row.tokens for row in rows]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        valid = torch.zeros((len(rows), width), dtype=torch.bool)
        r_idx: list[int] = []
        c_idx: list[int] = []
        spans: list[tuple[int, int]] = []  # per row: (first logit index, count)
        for b, (row, p) in enumerate(zip(rows, prompts)):
            pad = width - len(p)
            ids[b, pad:] = torch.tensor(p, dtype=torch.long)
            valid[b, pad:] = True
            first = width - 1
            if row.request.return_logprob:
                start = row.request.logprob_start_len
                start = len(p) - 1 if start < 0 else start
                first = pad + max(start, 0)
                first = min(first, width - 1)
            spans.append((len(r_idx), width - first))
            r_idx.extend([b] * (width - first))
            c_idx.extend(range(first, width))
        out = self.runner.forward(
            kv, ids, valid, torch.tensor(r_idx), torch.tensor(c_idx), "prefill", [r.rid for r in rows]
        )
        assert out.logits is not None
        logp = torch.log_softmax(out.logits.double(), dim=-1) if any(r.request.return_logprob for r in rows) else None
        for b, row in enumerate(rows):
            first, count = spans[b]
            last = first + count - 1
            token = int(out.logits[last].argmax())
            lp = None
            if logp is not None and row.request.return_logprob:
                start = row.request.logprob_start_len
                start = len(row.tokens) - 1 if start < 0 else start
                # entry k is token input_ids[S+k] given everything before it; entry 0 has no logprob
                entries: list[tuple[float | None, int]] = [(None, row.tokens[start])] if start < len(row.tokens) else []
                for k in range(1, len(row.tokens) - start):
                    tid = row.tokens[start + k]
                    entries.append((float(logp[first + k - 1, tid]), tid))
                row.input_lp = entries
                lp = float(logp[last, token])
            if row.request.sampling.max_new_tokens == 0:
                row.finish = FinishReason("length", length=0)
                row.finish_time = time.perf_counter()
            else:
                self._commit(row, token, lp)

    @torch.inference_mode()
    def _run_wave(self, rows: list[_Row]) -> None:
        kv = BatchKV(self.target.model, len(rows))
        self._prefill(rows, kv)
        drafter = self._new_drafter()
        active = self._drop_finished(rows, kv, None)
        if drafter is not None and active:
            drafter.start([r.rid for r in active], [r.tokens for r in active])
        while active:
            t0 = time.perf_counter()
            running = len(active)
            if drafter is None:
                self._decode_step(active, kv)
            else:
                self._spec_step(active, kv, drafter)
            self.metrics.step_times[str(running)].append(time.perf_counter() - t0)
            active = self._drop_finished(active, kv, drafter)
            kv.compact_if_needed(COMPACT_SLACK)

    def _drop_finished(self, rows: list[_Row], kv: BatchKV, drafter: Drafter | None) -> list[_Row]:
        keep = [i for i, r in enumerate(rows) if r.finish is None]
        if len(keep) != len(rows):
            kv.select_rows(keep)
            if drafter is not None:
                drafter.select_rows(keep)
        return [rows[i] for i in keep]

    def _decode_step(self, rows: list[_Row], kv: BatchKV) -> None:
        ids = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long)
        n = len(rows)
        out = self.runner.forward(
            kv, ids, None, torch.arange(n), torch.zeros(n, dtype=torch.long), "decode", [r.rid for r in rows]
        )
        assert out.logits is not None
        nxt = out.logits.argmax(dim=-1).tolist()
        logp = self._logprobs(rows, out.logits)
        for b, row in enumerate(rows):
            self._commit(row, int(nxt[b]), None if logp is None else float(logp[b, nxt[b]]))

    def _logprobs(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor | None:
        if not any(r.request.return_logprob for r in rows):
            return None
        return torch.log_softmax(logits.double(), dim=-1)

    def _spec_step(self, rows: list[_Row], kv: BatchKV, drafter: Drafter) -> None:
        k = self.config.num_draft_tokens
        faults = self.config.faults
        drafts = drafter.propose([r.tokens for r in rows])
        n = len(rows)
        ids = torch.tensor([[r.tokens[-1], *d] for r, d in zip(rows, drafts)], dtype=torch.long)
        snapshot = kv.snapshot_linear() if kv.has_linear else []
        out = self.runner.forward(
            kv,
            ids,
            None,
            torch.arange(n).repeat_interleave(k + 1),
            torch.arange(k + 1).repeat(n),
            "verify",
            [r.rid for r in rows],
            capture_linear=kv.has_linear,
        )
        assert out.logits is not None
        logits = out.logits.view(n, k + 1, -1)
        greedy = logits.argmax(dim=-1)  # [n, K+1]: the target's choice after each fed token
        match = (greedy[:, :k] == ids[:, 1:].to(greedy.device)).long()
        accepted = match.cumprod(dim=1).sum(dim=1).tolist()
        if "accept-off-by-one" in faults:
            # the off-by-one: the first mismatching draft is accepted too, so a token the
            # target did not choose enters the output while acceptance looks better
            accepted = [min(a + 1, k) for a in accepted]
        kv.drop_last([k - a for a in accepted])
        if kv.has_linear and "skip-state-rollback" not in faults:
            self.runner.rollback_linear(kv, snapshot, [a + 1 for a in accepted], k + 1)
        logp = self._logprobs(rows, logits.reshape(n * (k + 1), -1))
        greedy_l = greedy.tolist()
        committed_all: list[list[int]] = []
        for b, row in enumerate(rows):
            a = int(accepted[b])
            new = [int(t) for t in drafts[b][:a]] + [int(greedy_l[b][a])]
            committed: list[int] = []
            for j, token in enumerate(new):
                committed.append(token)
                lp = None if logp is None else float(logp[b * (k + 1) + j, token])
                if self._commit(row, token, lp):
                    break
            c = len(committed)
            row.verify_ct += 1
            row.correct += c - 1
            if len(row.hist) < k + 1:
                row.hist.extend([0] * (k + 1 - len(row.hist)))
            row.hist[c - 1] += 1
            self.metrics.accept_tokens += c
            self.metrics.verify_row_steps += 1
            committed_all.append(committed)
        drafter.after_verify(accepted, committed_all)

    def _result(self, row: _Row, t0: float) -> GenerationResult:
        spec = None
        if self.config.speculative and row.verify_ct > 0:
            k = self.config.num_draft_tokens
            correct, hist = row.correct, list(row.hist)
            if "wrong-accept-count" in self.config.faults:
                # the classic slip: counting accept_lens (bonus included) as correct drafts
                correct += row.verify_ct
                hist = [0] + hist
            spec = SpecStats(
                verify_ct=row.verify_ct,
                num_correct_drafts=correct,
                num_proposed_drafts=row.verify_ct * k,
                correct_drafts_histogram=tuple(hist),
            )
        return GenerationResult(
            rid=row.rid,
            input_ids=tuple(row.request.input_ids),
            output_ids=tuple(row.output),
            finish_reason=row.finish or FinishReason("length", length=row.request.sampling.max_new_tokens),
            e2e_latency=max(row.finish_time - t0, 0.0),
            spec=spec,
            input_token_logprobs=tuple(row.input_lp) if row.input_lp is not None else None,
            output_token_logprobs=tuple(row.output_lp) if row.request.return_logprob else None,
        )

    # -------------------------------------------------------------------------- server facts
    def avg_spec_accept_length(self) -> float | None:
        """Committed tokens per request per verify step since the last flush (None before any)."""
        m = self.metrics
        return m.accept_tokens / m.verify_row_steps if m.verify_row_steps else None

    def server_info(self) -> dict[str, Any]:
        """The ``/server_info`` payload (SGLang field names where SGLang has them)."""
        cfg = self.config
        state: dict[str, Any] = {
            "effective_max_running_requests_per_dp": cfg.max_running_requests,
            "step_time_dict": {key: list(v) for key, v in self.metrics.step_times.items()},
        }
        avg = self.avg_spec_accept_length()
        if avg is not None:
            state["avg_spec_accept_length"] = avg
        return {
            "version": VERSION,
            "engine": "reference",
            "model_path": cfg.model,
            "dtype": str(self.target.dtype).replace("torch.", ""),
            "device": str(self.target.device),
            "random_seed": cfg.seed,
            "speculative_algorithm": cfg.speculative_algorithm,
            "speculative_num_draft_tokens": cfg.num_draft_tokens if cfg.speculative else None,
            "speculative_draft_model_path": self.draft_model_name,
            "speculative_ngram_min_match_window_size": cfg.ngram_min_match_window,
            "speculative_ngram_max_match_window_size": cfg.ngram_max_match_window,
            "max_running_requests": cfg.max_running_requests,
            "faults": list(cfg.faults),
            "model_shape": self.runner.shape.to_json(),
            "draft_model_shape": self.draft_runner.shape.to_json() if self.draft_runner else None,
            "internal_states": [state],
        }
