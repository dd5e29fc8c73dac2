"""Run one batched forward pass of a Hugging Face causal LM and record it in the work trace.

:class:`ModelRunner` owns the model-specific plumbing (the cache keyword, ``lm_head`` only where
logits are needed, router and linear-attention hooks, recurrent-state rollback): its section of
``docs/reference-server.md#batched-forwards-and-recurrent-state-rollback``."""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch

from .accounting import ModelShape
from .accounting import model_shape
from .kv import BatchKV
from .trace import TraceStep
from .trace import WorkTrace


def _kwarg_name(fn: object, preferred: str, fallback: str) -> str:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fallback
    return preferred if preferred in params else fallback


class _Probes:
    """Forward hooks shared by every runner of one model object (a self-draft reuses the target)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.recording = False
        self.capture_linear = False
        self.routed: dict[int, torch.Tensor] = {}  # layer -> expert indices [tokens, top_k]
        self.linear_inputs: dict[int, torch.Tensor] = {}  # layer -> hidden states [B, Q, H]
        self.linear_modules: dict[int, torch.nn.Module] = {}
        self.top_k = int(getattr(model.config, "num_experts_per_tok", 0) or 0)
        for idx, layer in enumerate(model.get_decoder().layers):
            mlp = getattr(layer, "mlp", None)
            gate = getattr(mlp, "gate", None) if mlp is not None else None
            if gate is not None and getattr(mlp, "experts", None) is not None:
                gate.register_forward_hook(partial(self._router_hook, idx))
            linear = getattr(layer, "linear_attn", None)
            if linear is not None:
                self.linear_modules[idx] = linear
                linear.register_forward_pre_hook(partial(self._linear_hook, idx), with_kwargs=True)

    def _router_hook(self, idx: int, module: torch.nn.Module, args: tuple, output: object) -> None:
        if not self.recording:
            return
        # transformers 5.x routers return (logits, weights, indices); older ones return logits.
        if (
            isinstance(output, tuple)
            and len(output) >= 3
            and not torch.is_floating_point(output[2])
        ):
            self.routed[idx] = output[2].reshape(-1, output[2].shape[-1])
            return
        logits = output[0] if isinstance(output, tuple) else output
        logits = logits.reshape(-1, logits.shape[-1])
        self.routed[idx] = torch.topk(logits, max(self.top_k, 1), dim=-1).indices

    def _linear_hook(self, idx: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self.capture_linear:
            self.linear_inputs[idx] = kwargs.get("hidden_states", args[0] if args else None)


@dataclass(frozen=True)
class StepOutput:
    """Logits of one forward, for the requested (row, position) pairs, in request order."""

    logits: torch.Tensor | None  # [N, vocab]
    wall_s: float


class ModelRunner:
    """Batched forward passes of one model in one role ("target" or "draft")."""

    def __init__(self, model: torch.nn.Module, role: str, trace: WorkTrace | None) -> None:
        # trace None: an instrument that no GPU engine would run (the controlled-acceptance oracle)
        self.model = model
        self.role = role
        self.trace = trace
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.shape: ModelShape = model_shape(model)
        self.device = next(model.parameters()).device
        self.cache_kw = _kwarg_name(self.decoder.forward, "cache", "past_key_values")
        probes = getattr(model, "_specenergy_probes", None)
        if probes is None:
            probes = _Probes(model)
            model._specenergy_probes = probes  # type: ignore[attr-defined]
        self.probes: _Probes = probes
        linear = next(iter(probes.linear_modules.values()), None)
        self.linear_cache_kw = (
            _kwarg_name(linear.forward, "cache", "cache_params") if linear is not None else "cache"
        )
        self.noise_scale: float | None = None  # fault "numerical-noise" (target runner only)
        self.seed = 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def forward(
        self,
        kv: BatchKV,
        tokens: torch.Tensor,
        q_valid: torch.Tensor | None,
        logit_rows: torch.Tensor,
        logit_cols: torch.Tensor,
        phase: str,
        rids: Sequence[str],
        capture_linear: bool = False,
    ) -> StepOutput:
        """Feed ``tokens`` [B, Q] into ``kv`` (appending its slots and one :class:`TraceStep` to the
        trace); return logits at ``(logit_rows[i], logit_cols[i])``."""
        tokens = tokens.to(self.device)
        if q_valid is None:
            q_valid = torch.ones(tokens.shape, dtype=torch.bool, device=self.device)
        q_valid = q_valid.to(self.device)
        context = list(kv.n_valid)
        mask, positions = kv.step_inputs(q_valid)
        probes = self.probes
        probes.routed = {}
        probes.linear_inputs = {}
        probes.recording = True
        probes.capture_linear = capture_linear
        self._sync()
        t0 = time.perf_counter()
        try:
            out = self.decoder(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self.cache_kw: kv.cache},
            )
            logits = None
            if logit_rows.numel():
                logits = self.head(
                    out.last_hidden_state[logit_rows.to(self.device), logit_cols.to(self.device)]
                )
                if self.noise_scale is not None:
                    from .faults import numerical_noise

                    logits = numerical_noise(
                        logits, self.noise_scale, (self.seed, phase, *tokens.shape)
                    )
            self._sync()
        finally:
            probes.recording = False
            probes.capture_linear = False
        wall = time.perf_counter() - t0
        kv.append(q_valid)
        if self.trace is not None:
            self._record(phase, rids, tokens, q_valid, context, int(logit_rows.numel()), wall)
        return StepOutput(logits=logits, wall_s=wall)

    def _record(
        self,
        phase: str,
        rids: Sequence[str],
        tokens: torch.Tensor,
        q_valid: torch.Tensor,
        context: list[int],
        logit_rows: int,
        wall: float,
    ) -> None:
        query = [int(c) for c in q_valid.sum(dim=1).tolist()]
        distinct = int(torch.unique(tokens[q_valid]).numel())
        touched: list[int] | None = None
        if self.shape.is_moe:
            flat_valid = q_valid.reshape(-1)
            touched = []
            for idx in range(self.shape.num_layers):
                routed = self.probes.routed.get(idx)
                usable = routed is not None and routed.shape[0] == flat_valid.numel()
                touched.append(int(torch.unique(routed[flat_valid]).numel()) if usable else 0)
        assert self.trace is not None
        verify = phase == "verify"
        cost = self.shape.step_cost(
            query, context, logit_rows, distinct, touched, per_position_states=verify
        )
        self.trace.append(
            TraceStep(
                phase=phase,
                model=self.role,
                rids=tuple(rids),
                query_tokens=tuple(query),
                context_lens=tuple(context),
                weight_bytes=cost.weight_bytes,
                kv_bytes=cost.kv_bytes,
                flops=cost.flops,
                wall_s=wall,
                experts_touched=tuple(touched) if touched is not None else None,
            )
        )

    @torch.inference_mode()
    def rollback_linear(
        self,
        kv: BatchKV,
        snapshot: Sequence[torch.Tensor],
        keep: Sequence[int],
        width: int,
        keep_inputs: bool = False,
    ) -> None:
        """Return each row's recurrent state to the state after its first ``keep[b]`` of ``width``
        tokens, from ``snapshot`` by replaying the kept tokens' captured inputs (the section of
        ``docs/reference-server.md#batched-forwards-and-recurrent-state-rollback``)."""
        rows_fix = [b for b, k in enumerate(keep) if k < width]
        if not rows_fix or not self.probes.linear_modules:
            return
        fix = torch.zeros(kv.batch_size, dtype=torch.bool, device=self.device)
        fix[rows_fix] = True
        keep_t = torch.tensor(list(keep), dtype=torch.long, device=self.device)
        steps = max(keep[b] for b in rows_fix)
        offset = 0
        for idx in sorted(self.probes.linear_modules):
            n_state = len(kv.linear_tensors(idx))
            layer_snap = snapshot[offset : offset + n_state]
            offset += n_state
            module = self.probes.linear_modules[idx]
            inputs = self.probes.linear_inputs[idx]
            after_verify = kv.snapshot_linear(idx)
            kv.restore_linear_rows(layer_snap, torch.ones_like(fix), idx)
            for j in range(steps):
                before = kv.snapshot_linear(idx)
                module(hidden_states=inputs[:, j : j + 1], **{self.linear_cache_kw: kv.cache})
                # rows whose accepted prefix is shorter than j+1 must not take this update
                kv.restore_linear_rows(before, keep_t <= j, idx)
            kv.restore_linear_rows(after_verify, ~fix, idx)
        if not keep_inputs:
            self.probes.linear_inputs = {}
