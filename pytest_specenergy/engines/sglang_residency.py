"""Both arms' SGLang engines resident on one GPU, or one at a time: whether they fit, and the one
KV pool every arm is pinned to either way (``engines/kv_pools.py`` plans it; docs/engines.md#residency-on-one-gpu)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Iterable

from pytest_specenergy.engines import sglang_args as sa
from pytest_specenergy.engines.base import EngineConfigError
from pytest_specenergy.engines.config import EngineConfig
from pytest_specenergy.engines.kv_pools import REQUEST_TOKENS
from pytest_specenergy.engines.kv_pools import EngineMemory
from pytest_specenergy.engines.kv_pools import PoolPlan
from pytest_specenergy.engines.kv_pools import PoolPlanError
from pytest_specenergy.engines.kv_pools import kv_cell_bytes
from pytest_specenergy.engines.kv_pools import plan_pools
from pytest_specenergy.engines.kv_pools import runtime_reserve_bytes
from pytest_specenergy.engines.sglang import DEFAULT_MAX_RUNNING_REQUESTS
from pytest_specenergy.engines.sglang import DEFAULT_MEM_FRACTION_STATIC
from pytest_specenergy.engines.sglang import read_model_config

#: The largest ``weights_gb=`` a marker may declare (inf and 1e300 overflowed to a raw error).
MAX_WEIGHTS_GIB = 1e6
#: Every resident engine's ``mem_fraction_static`` together: SGLang's single-engine default.
RESIDENT_MEM_TOTAL = 0.80
#: Drafters whose engine's KV pool SGLang sizes with the draft checkpoint's layers too.
_DRAFT_LAYER_DRAFTERS = ("draft_model", "eagle", "eagle3", "nextn")
#: Checkpoint files whose sizes are the weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
GIB = 1024**3


@dataclass(frozen=True)
class Residency:
    """How the SGLang engines of one GPU run: ``resident`` (``engines`` side by side, each with
    ``mem_fraction`` of the GPU's memory, interleaved repeats) or blocked (one engine at a time),
    and why."""

    resident: bool
    engines: int
    mem_fraction: float | None
    reason: str
    gpu_memory_bytes: int | None = None
    weights_bytes: int | None = None
    #: The KV pool every arm is pinned to, and the fraction that lets each engine reach it.
    pools: PoolPlan | None = None
    #: Why no order can give the arms equal pools: every SGLang case is refused with it.
    refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (the run document's ``order.residency``)."""
        return {
            "resident": self.resident,
            "engines": self.engines,
            "mem_fraction_static": self.mem_fraction,
            "sleep_on_idle": self.resident,
            "reason": self.reason,
            "gpu_memory_gib": None
            if self.gpu_memory_bytes is None
            else round(self.gpu_memory_bytes / GIB, 1),
            "weights_gib": None
            if self.weights_bytes is None
            else round(self.weights_bytes / GIB, 2),
            "pools": None if self.pools is None else self.pools.as_dict(),
            "refused": self.refused,
        }


def share(engines: int) -> float:
    """Each of ``engines`` resident engines' ``mem_fraction_static`` (equal for all)."""
    if engines < 1:
        raise ValueError(f"engines must be at least 1, got {engines}")
    return math.floor(RESIDENT_MEM_TOTAL / engines * 100 + 1e-9) / 100


def checkpoint_bytes(model: str) -> int | None:
    """The size of a local model directory's weight files, None for anything else (a hub id)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    sizes = [
        p.stat().st_size
        for p in folder.iterdir()
        if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
    ]
    return sum(sizes) if sizes else None


def weights_bytes(config: EngineConfig) -> tuple[int | None, str]:
    """(bytes of the weights ``config``'s engine loads, where the figure came from), or (None, why
    unknown): the marker's ``weights_gb=`` (the whole engine), else the target's and draft model's
    checkpoint files."""
    declared = config.option("weights_gb")
    if declared is not None:
        if (
            isinstance(declared, bool)
            or not isinstance(declared, (int, float))
            or not 0 < declared <= MAX_WEIGHTS_GIB
        ):
            raise EngineConfigError(
                f"weights_gb={declared!r}: expected a positive number of GiB up to "
                f"{MAX_WEIGHTS_GIB:g}"
            )
        return int(float(declared) * GIB), "weights_gb on the model marker"
    total = checkpoint_bytes(config.model)
    if total is None:
        return (
            None,
            f"the size of {config.model} is unknown (not a local directory; declare weights_gb=)",
        )
    draft = getattr(config.drafter, "draft_model", None) if config.drafter is not None else None
    if draft:
        extra = checkpoint_bytes(str(draft))
        if extra is None:
            return None, f"the size of the draft model {draft} is unknown (declare weights_gb=)"
        total += extra
    return total, "checkpoint files"


def engine_memory(config: EngineConfig, gpu_bytes: int) -> tuple[EngineMemory | None, str]:
    """What ``config``'s engine takes of the GPU (weights, KV bytes per token, runtime reserve), or
    (None, why unknown): the weights as :func:`weights_bytes` finds them, the KV sizes from the
    checkpoints' ``config.json`` (local, or in the Hugging Face cache)."""
    size, how = weights_bytes(config)
    if size is None:
        return None, how
    drafter = config.drafter
    draft = None
    if drafter is not None and drafter.name in _DRAFT_LAYER_DRAFTERS:
        path = drafter.draft_model or config.model  # NEXTN without one: the target's MTP layers
        draft = read_model_config(str(path))
        if draft is None:
            return None, f"the draft model {path} has no readable config.json"
    elif drafter is not None and drafter.name not in ("ngram", "none"):
        return None, f"the KV bytes per token of a {drafter.name} engine are not modeled"
    cell = kv_cell_bytes(read_model_config(config.model), draft)
    if cell is None:
        return None, f"{config.model} has no readable config.json with its attention sizes"
    reserve = runtime_reserve_bytes(
        gpu_bytes,
        config.option("chunked_prefill_size"),
        config.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS,
        int(config.option("tp_size") or 1),
    )
    return EngineMemory(config.label(), size, cell, reserve), how


def _pinned(configs: list[EngineConfig], name: str) -> Any:
    """The one value the configs' option ``name`` has (None if none sets it); several: the
    smallest, which the plan then checks every engine can reach."""
    values = {c.option(name) for c in configs} - {None}
    return min(values) if values else None


def plan_order(
    configs: list[EngineConfig], engines: int, gpu_bytes: int, resident: bool | None
) -> Residency:
    """Resident when the engines fit with equal pools that hold the cases' requests (unless
    ``resident`` is False), else blocked with equal pools; refused when neither order can give
    the arms equal pools. ``resident``: the marker's choice (None: decide)."""
    memories: dict[EngineConfig, EngineMemory] = {}
    for config in dict.fromkeys(configs):
        memory, why = engine_memory(config, gpu_bytes)
        if memory is None:
            if resident:
                return Residency(True, engines, share(engines), f"resident=True; {why}", gpu_bytes)
            return Residency(False, 1, None, f"{why}: blocked order, pools not planned", gpu_bytes)
        memories[config] = memory
    tokens = _pinned(configs, "max_total_tokens")
    fraction = _pinned(configs, "mem_fraction_static")
    need = max((c.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS) for c in configs)
    heaviest = max(m.weights_bytes for m in memories.values())
    reason = "resident=False on a model marker: blocked order asked for"
    if resident is not False:
        try:
            plan = plan_pools(
                gpu_bytes,
                list(memories.values()),
                live=engines,
                tokens=tokens,
                need_tokens=need * REQUEST_TOKENS,
                fraction=fraction,
            )
            return Residency(
                True, engines, plan.mem_fraction, plan.reason, gpu_bytes, heaviest, plan
            )
        except PoolPlanError as exc:
            if resident:
                return Residency(
                    True, engines, None, str(exc), gpu_bytes, heaviest, refused=str(exc)
                )
            reason = f"{exc}: blocked order"
    try:
        plan = plan_pools(
            gpu_bytes,
            list(memories.values()),
            live=1,
            tokens=tokens,
            fraction=fraction or DEFAULT_MEM_FRACTION_STATIC,
        )
    except PoolPlanError as exc:
        return Residency(False, 1, None, reason, gpu_bytes, heaviest, refused=str(exc))
    return Residency(False, 1, None, reason, gpu_bytes, heaviest, plan)


#: Why engines run blocked where the GPU's memory could not be read: a machine without NVML (a
#: dry run, a plan on a laptop) has not decided how the GPU runner will run them.
UNKNOWN_MEMORY = "the GPU's memory is unknown (no NVML): blocked order"


def decide(
    configs: Iterable[EngineConfig],
    engines: int,
    gpu_bytes: int | None,
    server_fields: frozenset[str] | None = None,
) -> Residency:
    """Whether ``engines`` SGLang engines (the largest case's arms) may stay resident on one GPU,
    for every arm of every planned case (``configs``), and the KV pool every arm is pinned to
    (:func:`plan_order`). ``server_fields``: the installed ``ServerArgs`` fields, when known (a
    release without ``sleep_on_idle`` cannot keep an idle engine out of the other's window)."""
    configs = list(configs)
    blocked = lambda why, **kw: Residency(False, 1, None, why, gpu_bytes, **kw)  # noqa: E731
    if engines < 2 or not configs:
        return blocked("one engine per case")
    choices = {c.option("resident") for c in configs} - {None}
    if False in choices:
        if gpu_bytes is None:
            return blocked("resident=False on a model marker: blocked order asked for")
        return plan_order(configs, engines, gpu_bytes, False)
    if server_fields is not None and "sleep_on_idle" not in server_fields:
        return blocked(
            "the installed SGLang has no --sleep-on-idle: an idle engine would spin beside the "
            "measured one"
        )
    own = {c.option("mem_fraction_static") for c in configs} - {None}
    bad = sorted((repr(v) for v in own if not sa.is_fraction(v)), key=str)
    if bad:
        # A NaN compares false with every bound: it passed as resident with a nan share (T16).
        why = (
            f"mem_fraction_static={bad[0]} on a model marker: expected a number between 0 and 1 "
            "(SGLang's share of the GPU's memory for weights and KV cache, e.g. 0.4)"
        )
        return blocked(why, refused=why)
    if own:
        largest = max(float(v) for v in own)
        if len(own) > 1 or largest * engines > RESIDENT_MEM_TOTAL + 1e-9:
            return blocked(
                f"mem_fraction_static={largest:g} on a marker: {engines} engines would take "
                f"{largest * engines:.2f} of the GPU's memory (at most {RESIDENT_MEM_TOTAL:.2f})"
            )
    if gpu_bytes is None:
        if choices == {True}:
            fraction = max((float(v) for v in own), default=share(engines))
            return Residency(
                True, engines, fraction, "resident=True on the model marker (size not checked)"
            )
        return blocked(UNKNOWN_MEMORY)
    return plan_order(configs, engines, gpu_bytes, True if choices == {True} else None)


def resident_config(config: EngineConfig, residency: Residency) -> EngineConfig:
    """``config`` with what the order decided as its own options (so the pool keys, the argv and
    the run document's engine description carry them): the planned ``max_total_tokens`` in every
    order (unless the marker pins one), and when resident its share of the GPU's memory and
    ``sleep_on_idle``; a refused plan refuses every SGLang engine, saying why."""
    if config.engine != "sglang":
        return config
    if residency.refused:
        raise EngineConfigError(residency.refused)
    options = dict(config.options)
    if residency.pools is not None and config.option("max_total_tokens") is None:
        options["max_total_tokens"] = residency.pools.tokens
    if residency.resident:
        options.update(mem_fraction_static=residency.mem_fraction, sleep_on_idle=True)
    if options == dict(config.options):
        return config
    return replace(config, options=EngineConfig.freeze_options(options))
