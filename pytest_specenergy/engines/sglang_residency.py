"""Both arms' SGLang engines resident on one GPU: the memory split, and whether it fits
(docs/design/engines.md, ``engines/sglang_residency.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Iterable

from pytest_specenergy.engines.config import EngineConfig

#: Every resident engine's ``mem_fraction_static`` together: SGLang's single-engine default.
RESIDENT_MEM_TOTAL = 0.80
#: The part of an engine's static share its weights may take (the rest: KV cache).
WEIGHTS_SHARE = 0.6
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
        if isinstance(declared, bool) or not isinstance(declared, (int, float)) or not declared > 0:
            raise ValueError(f"weights_gb={declared!r}: expected a positive number of GiB")
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


def decide(
    configs: Iterable[EngineConfig],
    engines: int,
    gpu_bytes: int | None,
    server_fields: frozenset[str] | None = None,
) -> Residency:
    """Whether ``engines`` SGLang engines (the largest case's arms) may stay resident on one GPU,
    for every arm of every planned case (``configs``). ``server_fields``: the installed
    ``ServerArgs`` fields, when known (a release without ``sleep_on_idle`` cannot keep an idle
    engine out of the other's window)."""
    configs = list(configs)
    blocked = lambda why, **kw: Residency(False, 1, None, why, gpu_bytes, **kw)  # noqa: E731
    if engines < 2 or not configs:
        return blocked("one engine per case")
    choices = {c.option("resident") for c in configs} - {None}
    if False in choices:
        return blocked("resident=False on a model marker: blocked order asked for")
    if server_fields is not None and "sleep_on_idle" not in server_fields:
        return blocked(
            "the installed SGLang has no --sleep-on-idle: an idle engine would spin beside the "
            "measured one"
        )
    fraction = share(engines)
    own = {c.option("mem_fraction_static") for c in configs} - {None}
    if own:
        largest = max(float(v) for v in own)
        if len(own) > 1 or largest * engines > RESIDENT_MEM_TOTAL + 1e-9:
            return blocked(
                f"mem_fraction_static={largest:g} on a marker: {engines} engines would take "
                f"{largest * engines:.2f} of the GPU's memory (at most {RESIDENT_MEM_TOTAL:.2f})"
            )
        fraction = largest
    if choices == {True}:
        return Residency(
            True,
            engines,
            fraction,
            "resident=True on the model marker (size not checked)",
            gpu_bytes,
        )
    if gpu_bytes is None:
        return blocked("the GPU's memory is unknown (no NVML): blocked order")
    heaviest, source = 0, ""
    for config in configs:
        size, how = weights_bytes(config)
        if size is None:
            return blocked(how + ": blocked order")
        if size > heaviest:
            heaviest, source = size, how
    room = WEIGHTS_SHARE * fraction * gpu_bytes
    if heaviest > room:
        return blocked(
            f"weights {heaviest / GIB:.1f} GiB ({source}) exceed {WEIGHTS_SHARE:.0%} of a "
            f"{fraction:.2f} share of {gpu_bytes / GIB:.0f} GiB ({room / GIB:.1f} GiB): blocked "
            "order",
            weights_bytes=heaviest,
        )
    return Residency(
        True,
        engines,
        fraction,
        f"weights {heaviest / GIB:.1f} GiB ({source}) fit {WEIGHTS_SHARE:.0%} of a {fraction:.2f} "
        f"share of {gpu_bytes / GIB:.0f} GiB",
        gpu_bytes,
        heaviest,
    )


def resident_config(config: EngineConfig, residency: Residency) -> EngineConfig:
    """``config`` with its share of the GPU's memory and ``sleep_on_idle`` as its own options when
    resident (so the pool keys, the argv and the run document's engine description carry them); else
    ``config`` itself."""
    if not residency.resident or config.engine != "sglang":
        return config
    options = {
        **dict(config.options),
        "mem_fraction_static": residency.mem_fraction,
        "sleep_on_idle": True,
    }
    return replace(config, options=EngineConfig.freeze_options(options))
