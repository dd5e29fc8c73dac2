"""Each case's modeled GPU minutes before anything runs, priced by the modeled meter's roofline
(``meters/prediction.py`` ``price`` of ``meters/shapes.py`` ``forward_cost``: what the meter would
charge for the same forwards) at the case's model shape on the planned GPU.

Per case: the engine starts it is the first to need (the baseline twin's engine is shared by every
drafter of its batch, corpus and generation; resident, each case measures its baseline arm in its
own cycles, blocked once for all), warm-up, per repeat and arm one steady
window (``plan/window.py``'s requests, at least the NVML meter's 5 s) and one prefill-only twin (at
least 5 s), the window's cut-short prompts generated again once, and the repeats: the first look's
and the sequential gate's cap (the worst case). Upper bounds where the truth is unknown before the
run: every request runs to ``max_new_tokens``, and the speculative arm commits one token per verify
step (no accepted drafts), paying its verify forward and draft passes."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from dataclasses import replace
from typing import Any
from typing import Sequence

from pytest_specenergy.cases.case import Case
from pytest_specenergy.engines.sglang import read_model_config
from pytest_specenergy.meters.prediction import price
from pytest_specenergy.meters.roofline import GpuPreset
from pytest_specenergy.meters.roofline import gpu_preset
from pytest_specenergy.meters.shapes import SHAPES
from pytest_specenergy.meters.shapes import ModelShape
from pytest_specenergy.meters.shapes import forward_cost
from pytest_specenergy.meters.shapes import verify_cost
from pytest_specenergy.plan.window import window_requests

#: Seconds an SGLang start takes for an 8B-class model: weights from local disk, CUDA-graph capture
#: for batch 1 to the cap, SGLang's own warm-up request (planning figure; the GPU check records the
#: real ones from ``/server_info`` ``startup_time``).
SGLANG_START_S = 120.0
#: Seconds a reference-server start takes (model build, no graphs).
REFERENCE_START_S = 30.0
#: The NVML meter repeats a window shorter than this until it is this long (``NvmlMeter``).
MIN_WINDOW_S = 5.0
#: Per window: flush, two ``/server_info`` reads, the close.
WINDOW_OVERHEAD_S = 2.0
#: Characters per token of the corpora's text (English and code with a BPE vocabulary).
CHARS_PER_TOKEN = 4.0


class PlanError(ValueError):
    """A case that cannot be priced (unknown model shape): the budget cannot be checked."""


@dataclass(frozen=True)
class CaseCost:
    """One case's modeled GPU seconds by part, at the first look (``repeats``) and at the cap."""

    case_id: str
    nodeid: str
    starts: int
    start_s: float
    warmup_s: float
    repeat_s: float
    complete_s: float
    repeats: int
    cap: int

    @property
    def first_look_s(self) -> float:
        """Seconds with the first look's repeats."""
        return self.start_s + self.warmup_s + self.complete_s + self.repeats * self.repeat_s

    @property
    def worst_s(self) -> float:
        """Seconds with every repeat the sequential gate may add (its cap)."""
        return self.start_s + self.warmup_s + self.complete_s + self.cap * self.repeat_s


def model_shape(model: str, priced_as: str | None = None) -> ModelShape:
    """The shape ``model`` is priced at: ``priced_as`` (a registered shape), a registered shape its
    name contains (``Qwen/Qwen3-8B`` -> Qwen3-8B), else its ``config.json``; :class:`PlanError`
    when none says."""
    if priced_as:
        try:
            return SHAPES[str(priced_as).lower()]
        except KeyError:
            raise PlanError(
                f"priced_as={priced_as!r} is no known shape; expected one of {', '.join(SHAPES)}"
            ) from None
    name = model.rstrip("/").split("/")[-1].lower()
    for key in sorted(SHAPES, key=len, reverse=True):
        if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", name):
            return SHAPES[key]
    shape = _shape_from_config(model, read_model_config(model))
    if shape is None:
        raise PlanError(
            f"the GPU time of {model} cannot be priced: its name matches no known shape "
            f"({', '.join(SHAPES)}) and no config.json with its sizes was found; name a local "
            "checkpoint or one in the Hugging Face cache"
        )
    return shape


def _shape_from_config(model: str, config: Any) -> ModelShape | None:
    if not isinstance(config, dict):
        return None
    try:
        heads = int(config["num_attention_heads"])
        return ModelShape(
            model,
            layers=int(config["num_hidden_layers"]),
            hidden=int(config["hidden_size"]),
            mlp=int(config["intermediate_size"]),
            q_heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            vocab=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _draft_step_s(case: Case, shape: ModelShape, gpu: GpuPreset, batch: int, context: int) -> float:
    """Seconds of one verify step's drafting: NGRAM none, a draft model its passes (one per drafted
    token), an EAGLE-family head its steps at one target layer."""
    drafter = case.drafter
    if drafter.name == "ngram":
        return 0.0
    passes = max(1, int(dict(drafter.settings).get("num_steps") or drafter.num_draft_tokens))
    if drafter.name == "draft_model" and drafter.draft_model:
        try:
            draft = model_shape(str(drafter.draft_model))
        except PlanError:
            draft = replace(shape, layers=max(1, shape.layers // 8))
    else:
        draft = replace(shape, layers=1)
    step = price(forward_cost(draft, batch, 1, context), draft, gpu).seconds
    return passes * step


def price_case(
    case: Case,
    gpu: str | GpuPreset,
    *,
    repeats: int,
    cap: int,
    warmup: int,
    new_engines: int,
    baseline_shared: bool,
    nodeid: str = "",
) -> CaseCost:
    """Modeled GPU seconds of ``case``: ``new_engines`` engine starts are charged to it, its
    baseline arm only when not ``baseline_shared`` (measured for an earlier case)."""
    preset = gpu_preset(gpu)
    shape = model_shape(case.model, case.spec.option("priced_as"))
    prompts = case.pool()
    batch = max(1, case.batch)
    requests = window_requests(batch, len(prompts))
    new_tokens = case.generation.max_new_tokens
    prompt = max(1, round(sum(len(p) for p in prompts) / len(prompts) / CHARS_PER_TOKEN))
    context = prompt + new_tokens // 2
    decode = price(forward_cost(shape, batch, 1, context), shape, preset).seconds
    verified = case.drafter.num_draft_tokens + 1
    verify = price(verify_cost(shape, batch, verified, context), shape, preset).seconds
    spec_step = verify + _draft_step_s(case, shape, preset, batch, context)
    steps = requests * new_tokens / batch  # every request to max_new_tokens, one token per step
    prefill = price(forward_cost(shape, batch, prompt, 0), shape, preset).seconds
    twin_s = max(MIN_WINDOW_S, math.ceil(requests / batch) * prefill) + WINDOW_OVERHEAD_S
    arm_steps = [spec_step] * (2 if case.reference is not None else 1)
    if not baseline_shared:
        arm_steps.append(decode)
    repeat_s = sum(max(MIN_WINDOW_S, steps * s) + WINDOW_OVERHEAD_S + twin_s for s in arm_steps)
    wave_s = sum(new_tokens * s for s in arm_steps)  # one wave of the batch per arm
    start = REFERENCE_START_S if case.engine == "reference" else SGLANG_START_S
    return CaseCost(
        case_id=case.id,
        nodeid=nodeid,
        starts=new_engines,
        start_s=new_engines * start,
        warmup_s=warmup * wave_s,
        repeat_s=repeat_s,
        complete_s=wave_s,
        repeats=repeats,
        cap=max(cap, repeats),
    )


def schedule(cases: Sequence[Case], blocked: bool) -> list[tuple[int, bool]]:
    """Per case, in collection order: the engine starts it is the first to need, and whether its
    baseline arm was measured for an earlier case. Resident, every distinct engine starts once and
    every case measures the baseline in its own cycles (paired: a GPU holds one case's engines, so
    drafters sharing a baseline do not share cycles there, ``measure/pairs.py``); blocked (one
    engine at a time), the baseline measured for the first drafter of its batch, corpus and
    generation serves the rest, and each arm the case measures restarts its engine unless it is
    the one left running."""
    seen: set[Any] = set()
    baselines: set[Any] = set()
    live: Any = None
    out = []
    for case in cases:
        shared = blocked and case.baseline_key() in baselines
        baselines.add(case.baseline_key())
        configs = [] if shared else [case.baseline_config()]
        configs += [case.spec_config()]
        reference = case.reference_config()
        if reference is not None:
            configs.append(reference)
        if blocked:
            count = sum(1 for i, c in enumerate(configs) if not (i == 0 and c == live))
            live = configs[-1]
        else:
            count = sum(1 for c in configs if c not in seen)
        seen.update(configs)
        out.append((count, shared))
    return out
