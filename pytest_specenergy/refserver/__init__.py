"""The reference inference server: a real HF-transformers engine speaking SGLang's protocol subset.

Start it as a process (``python -m pytest_specenergy.refserver --model tiny:dense ...``; every flag
is documented in ``--help``) or use the engine in-process
(:class:`ReferenceEngine` with an :class:`EngineConfig`: ``generate`` blocks, ``submit`` returns a
ticket). The engine batches continuously (:mod:`.scheduler`): requests from any number of callers
join one running batch and leave it when they finish. Importing this package is cheap: torch and
transformers load only when an engine is built. It imports nothing from the rest of
``pytest_specenergy``.

Map: ``records`` (config, requests, results), ``protocol`` and ``server`` (HTTP), ``engine``
(models, prefill, decode), ``scheduler`` (continuous batching), ``verify`` (one speculative
step), ``drafters``/``draft_model``/``block``/``oracle`` (proposers), ``kv`` and ``runner``
(batched forwards with holes and recurrent-state rollback), ``rows`` and ``stats`` (counters),
``trace`` and ``accounting`` (work trace), ``faults``, ``models``/``tiny_models``/``random_models``/
``tokenizer``.
"""

from __future__ import annotations

from typing import Any

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

# Every name loads on first use, so that importing a submodule (``.names``, ``.faults``) runs
# only this file and that submodule.
_LAZY = {
    "DRAFTERS": ".names",
    "FAULTS": ".faults",
    "validate_faults": ".faults",
    "EngineConfig": ".records",
    "FinishReason": ".records",
    "GenerationRequest": ".records",
    "GenerationResult": ".records",
    "SamplingParams": ".records",
    "SpecStats": ".records",
    "ReferenceEngine": ".engine",
    "ReferenceHTTPServer": ".server",
    "TraceStep": ".trace",
    "WorkTrace": ".trace",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (torch and transformers with the engine)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
