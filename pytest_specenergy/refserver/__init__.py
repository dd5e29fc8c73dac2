"""The reference inference server: a real HF-transformers engine speaking SGLang's protocol subset.

Start it as a process (``python -m pytest_specenergy.refserver --model tiny:dense ...``) or use the
engine in-process (:class:`ReferenceEngine` with an :class:`EngineConfig`). Importing this package
is cheap: torch and transformers load only when an engine is built.
"""

from __future__ import annotations

from typing import Any

from .faults import FAULTS, validate_faults
from .records import (
    DRAFTERS,
    EngineConfig,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpecStats,
)

__all__ = [
    "DRAFTERS",
    "FAULTS",
    "EngineConfig",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "ReferenceEngine",
    "ReferenceHTTPServer",
    "SamplingParams",
    "SpecStats",
    "TraceStep",
    "WorkTrace",
    "validate_faults",
]

_LAZY = {
    "ReferenceEngine": ".engine",
    "ReferenceHTTPServer": ".server",
    "TraceStep": ".trace",
    "WorkTrace": ".trace",
}


def __getattr__(name: str) -> Any:
    """Import the heavy parts (torch, transformers) on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
