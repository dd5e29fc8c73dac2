"""A batched KV cache with holes, plus snapshot/restore of recurrent (linear attention) state.

How holes, joins (merge), masks and linear-attention rollback work: its section of
``docs/reference-server.md#the-kv-cache-with-holes``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

SUPPORTED_LAYER_TYPES = ("full_attention", "linear_attention")


def layer_types(config: object, num_layers: int) -> list[str]:
    """The per-layer attention kinds of a model config (all full attention when unspecified)."""
    kinds = list(getattr(config, "layer_types", None) or ["full_attention"] * num_layers)
    bad = sorted(set(kinds) - set(SUPPORTED_LAYER_TYPES))
    if bad:
        raise ValueError(
            f"the reference engine supports layer types {SUPPORTED_LAYER_TYPES}, but this model "
            f"has {bad} (sliding-window and other masks are not implemented)"
        )
    return kinds


class BatchKV:
    """One model's cache for one batch: a transformers ``DynamicCache`` plus slot bookkeeping."""

    def __init__(self, model: torch.nn.Module, batch_size: int) -> None:
        from transformers import DynamicCache

        self.config = model.config
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.kinds = layer_types(model.config, len(model.get_decoder().layers))
        self.has_linear = "linear_attention" in self.kinds
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros((batch_size, 0), dtype=torch.bool, device=self.device)
        self.n_valid: list[int] = [0] * batch_size  # committed tokens in the cache, per row

    @property
    def batch_size(self) -> int:
        """Rows currently in the batch."""
        return int(self.valid.shape[0])

    @property
    def num_slots(self) -> int:
        """Physical slots per row (valid tokens + holes)."""
        return int(self.valid.shape[1])

    # ------------------------------------------------------------------ forward inputs /
    # bookkeeping
    def step_inputs(self, q_valid: torch.Tensor) -> tuple[object, torch.Tensor]:
        """Attention mask (tensor or per-layer-type dict) and position ids for ``Q`` new slots per
        row; padding in them (``q_valid[b, i]`` False) gets position 0 and is never visible to other
        queries."""
        bsz, q = q_valid.shape
        s0 = self.num_slots
        start = torch.tensor(self.n_valid, dtype=torch.long, device=self.device)
        positions = start[:, None] + torch.cumsum(q_valid.long(), dim=1) - 1
        positions = torch.where(q_valid, positions, torch.zeros_like(positions))
        if s0 == 0 and bool(q_valid.all()):
            # A fresh cache without padding: no mask, so SDPA skips the masked half; bit for bit the
            # same on the CPU (tests/refserver/test_prefill_mask.py) and faster (the section of
            # docs/reference-server.md#the-kv-cache-with-holes).
            return None, positions
        causal = torch.ones((q, q), dtype=torch.bool, device=self.device).tril()
        eye = torch.eye(q, dtype=torch.bool, device=self.device)
        new = causal[None] & (q_valid[:, None, :] | eye[None])  # [B, Q(query), Q(key)]
        past = self.valid[:, None, :].expand(bsz, q, s0)
        visible = torch.cat([past, new], dim=2)[:, None]  # [B, 1, Q, S0 + Q]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        if not self.has_linear:
            return mask, positions
        # Hybrid models take one mask per layer type. Linear attention zeroes padded inputs, which
        # keeps a fresh (all-zero) state exactly zero through left padding.
        linear = None if bool(q_valid.all()) else q_valid.to(self.dtype)
        return {"full_attention": mask, "linear_attention": linear}, positions

    def append(self, q_valid: torch.Tensor) -> None:
        """Record that the last forward appended ``q_valid.shape[1]`` slots per row."""
        self.valid = torch.cat([self.valid, q_valid.to(self.device)], dim=1)
        counts = q_valid.sum(dim=1).tolist()
        self.n_valid = [n + int(c) for n, c in zip(self.n_valid, counts)]

    def drop_last(self, counts: Sequence[int]) -> None:
        """Turn the last ``counts[b]`` slots of row ``b`` into holes (rejected drafts)."""
        if any(counts):
            # every dropped slot was just fed
            self._holes_from([self.num_slots - c for c in counts], counts)

    def keep_first_of_last(self, width: int, keep: Sequence[int]) -> None:
        """Of the last ``width`` slots (one right-padded forward's, the block drafter's), row ``b``
        keeps only its first ``keep[b]``; the rest become holes, padding included."""
        self._holes_from([self.num_slots - width + k for k in keep])

    def _holes_from(self, start: Sequence[int], dropped: Sequence[int] | None = None) -> None:
        # slots from start[b] on become holes in row b; ``dropped``: how many of them are valid,
        # when the caller knows (counting them costs a device-to-host sync, once per verify step on
        # CUDA)
        first = torch.tensor(list(start), dtype=torch.long, device=self.device)
        tail = torch.arange(self.num_slots, device=self.device)[None, :] >= first[:, None]
        if dropped is None:
            dropped = (self.valid & tail).sum(dim=1).tolist()
        self.valid &= ~tail
        self.n_valid = [n - int(d) for n, d in zip(self.n_valid, dropped)]

    # -------------------------------------------------------------------------- batch reshaping
    def _layer_tensors(self) -> list[tuple[object, str]]:
        return [
            (layer, name)
            for layer in self.cache.layers
            for name in ("keys", "values")
            if isinstance(getattr(layer, name, None), torch.Tensor)
            and getattr(layer, name).ndim == 4
        ]

    def select_rows(self, keep: Sequence[int]) -> None:
        """Keep only rows ``keep`` (finished requests leave the batch)."""
        if len(keep) == self.batch_size:
            return
        idx = torch.tensor(list(keep), dtype=torch.long, device=self.device)
        for layer, name in self._layer_tensors():
            setattr(layer, name, getattr(layer, name).index_select(0, idx))
        for states in self._linear_dicts():
            for key, t in list(states.items()):
                if isinstance(t, torch.Tensor):
                    states[key] = t.index_select(0, idx)
        self.valid = self.valid.index_select(0, idx)
        self.n_valid = [self.n_valid[i] for i in keep]

    def merge(self, other: BatchKV) -> None:
        """Append ``other``'s rows (requests joining the batch; same model) after this batch's rows.
        The shorter slot range is left-padded with holes (zero K/V, never visible), so every row
        keeps its valid slots and positions."""
        if other.batch_size == 0:
            return
        if self.batch_size == 0:
            self.cache, self.valid, self.n_valid = other.cache, other.valid, list(other.n_valid)
            return
        width = max(self.num_slots, other.num_slots)
        mine, theirs = self._layer_tensors(), other._layer_tensors()
        if len(mine) != len(theirs):
            raise RuntimeError("cannot merge caches of different layouts")
        for (layer, name), (o_layer, o_name) in zip(mine, theirs):
            a = _left_pad(getattr(layer, name), width, dim=2)
            b = _left_pad(getattr(o_layer, o_name), width, dim=2)
            setattr(layer, name, torch.cat([a, b], dim=0))
        for states, o_states in zip(self._linear_dicts(), other._linear_dicts()):
            for key, t in list(states.items()):
                o = o_states.get(key)
                if isinstance(t, torch.Tensor) and isinstance(o, torch.Tensor):
                    states[key] = torch.cat([t, o], dim=0)
        self.valid = torch.cat(
            [_left_pad(self.valid, width, dim=1), _left_pad(other.valid, width, dim=1)], dim=0
        )
        self.n_valid = self.n_valid + list(other.n_valid)

    def compact_if_needed(self, slack: int) -> None:
        """Squeeze out holes when more than ``slack`` slots of every row are holes: each row keeps
        its valid slots, right-aligned, in their original order."""
        if not self.batch_size or self.num_slots - max(self.n_valid) <= slack:
            return
        width = max(self.n_valid)
        # Sort key puts holes first and keeps valid slots in order; then take the last `width`.
        slots = torch.arange(self.num_slots, device=self.device)
        key = torch.where(self.valid, slots[None, :] + self.num_slots, slots[None, :])
        order = torch.argsort(key, dim=1, stable=True)[:, self.num_slots - width :]
        for layer, name in self._layer_tensors():
            t = getattr(layer, name)
            index = order[:, None, :, None].expand(t.shape[0], t.shape[1], width, t.shape[3])
            setattr(layer, name, torch.gather(t, 2, index))
        self.valid = torch.gather(self.valid, 1, order)

    # ------------------------------------------------------------------------ recurrent state
    def _linear_dicts(self, layer_idx: int | None = None) -> list[dict]:
        layers = self.cache.layers if layer_idx is None else [self.cache.layers[layer_idx]]
        states = [
            getattr(layer, name, None)
            for layer in layers
            for name in ("conv_states", "recurrent_states")
        ]
        return [d for d in states if isinstance(d, dict)]

    def linear_tensors(self, layer_idx: int | None = None) -> list[torch.Tensor]:
        """The live conv/recurrent state tensors (all layers, or one layer), in a fixed order."""
        return [
            t
            for d in self._linear_dicts(layer_idx)
            for _, t in sorted(d.items())
            if isinstance(t, torch.Tensor)
        ]

    def row_state(self, row: int) -> list[torch.Tensor]:
        """Copies of one row's live recurrent state (for the stale-state fault)."""
        return [t[row].clone() for t in self.linear_tensors()]

    def set_row_state(self, row: int, state: Sequence[torch.Tensor]) -> None:
        """Overwrite one row's live recurrent state with :meth:`row_state` copies."""
        for t, s in zip(self.linear_tensors(), state):
            t[row].copy_(s)

    def snapshot_linear(self, layer_idx: int | None = None) -> list[torch.Tensor]:
        """Copies of the live recurrent state (empty list for a model without linear attention)."""
        return [t.clone() for t in self.linear_tensors(layer_idx)]

    def restore_linear_rows(
        self, snapshot: Sequence[torch.Tensor], rows: torch.Tensor, layer_idx: int | None = None
    ) -> None:
        """Copy ``snapshot`` into the live state where ``rows`` (bool [B]) is True, in place:
        transformers keeps these tensors at static addresses."""
        live = self.linear_tensors(layer_idx)
        if len(live) != len(snapshot):
            raise RuntimeError("linear-attention snapshot does not match the cache layout")
        for t, s in zip(live, snapshot):
            sel = rows.view(-1, *([1] * (t.ndim - 1)))
            t.copy_(torch.where(sel, s, t))


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` with zeros (or False) prepended along ``dim`` up to ``width``."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)
