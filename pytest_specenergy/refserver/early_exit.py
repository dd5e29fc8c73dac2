"""The early-exit self-draft: the target's own first ``k`` decoder layers, its final norm and its
head, as a draft model (``--draft-model early-exit:K``).

A draft model needs the target's tokenizer; a real checkpoint seldom ships a smaller sibling
(none can be had for smollm2-135m here). Drafting with a prefix of the target's layers is the
published self-speculative recipe of LayerSkip (Elhoushi et al., 2024: early exit, verified by the
full model) and of Draft & Verify (Zhang et al., 2023, which skips layers): no extra weights, the
same vocabulary, acceptance set by how much of the answer the first ``k`` layers already know.
Untrained for early exit (LayerSkip trains for it), a plain checkpoint's shallow exits accept less
than the paper's; the figures for smollm2-135m are in ``docs/reference-server.md#early-exit-drafts``.

The view shares the target's modules (no copy: the weights are read-only) and has a config of
``k`` layers, so the engine gives it its own ``k``-layer cache and the work trace prices it as a
``k``-layer model."""

from __future__ import annotations

import copy

import torch

from .names import EARLY_EXIT_PREFIX as PREFIX


def is_early_exit(name: str | None) -> bool:
    """Whether ``name`` asks for an early-exit self-draft."""
    return bool(name) and str(name).startswith(PREFIX)


def parse_early_exit(name: str, num_layers: int) -> int:
    """K of ``early-exit:K``, checked against the target's ``num_layers``."""
    text = name[len(PREFIX) :]
    if not text.isdigit() or not 1 <= int(text) < num_layers:
        raise ValueError(
            f"draft model {name!r}: expected early-exit:K with K a whole number of layers from 1 "
            f"to {num_layers - 1} (the target has {num_layers})"
        )
    return int(text)


def early_exit_view(target: torch.nn.Module, k: int) -> torch.nn.Module:
    """A causal LM of the target's class whose decoder is the target's first ``k`` layers (shared
    modules), with the target's embeddings, final norm, rotary embedding and head."""
    decoder = target.get_decoder()
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = k
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:k]
    with torch.device("meta"):  # nothing allocated: every module is replaced by the target's
        view = target.__class__(config)
    view_decoder = view.get_decoder()
    for name, module in decoder.named_children():
        if name == "layers":
            module = torch.nn.ModuleList(list(module)[:k])
        setattr(view_decoder, name, module)
    for name, module in target.named_children():
        if module is not decoder:
            setattr(view, name, module)
    left = [n for n, p in view.named_parameters() if p.is_meta]
    left += [n for n, b in view.named_buffers() if b.is_meta]
    if left:
        raise ValueError(
            f"early-exit draft: {type(target).__name__} has parts the view does not share "
            f"({', '.join(left[:4])}); only decoder-layer stacks are supported"
        )
    view.generation_config = target.generation_config
    view.eval()
    return view
