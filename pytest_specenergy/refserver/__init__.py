"""The reference inference server: a real HF-transformers engine speaking SGLang's protocol subset.

Run it with ``python -m pytest_specenergy.refserver`` or in-process as :class:`ReferenceEngine`.
Importing this package is cheap (torch loads with the engine) and imports nothing else of
``pytest_specenergy``. Usage and module map: its section of ``docs/reference-server.md#starting-the-server``."""

from __future__ import annotations

from typing import Any

# Every name loads on first use, so that importing a submodule (``.names``, ``.faults``) runs only
# it and this file.
_MODULES = {
    ".names": ("DRAFTERS",),
    ".faults": ("FAULTS", "validate_faults"),
    ".records": (
        "EngineConfig",
        "FinishReason",
        "GenerationRequest",
        "GenerationResult",
        "SamplingParams",
        "SpecStats",
    ),
    ".engine": ("ReferenceEngine",),
    ".server": ("ReferenceHTTPServer",),
    ".trace": ("TraceStep", "WorkTrace"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (torch and transformers with the engine)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
