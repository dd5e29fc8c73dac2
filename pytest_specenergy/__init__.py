"""pytest-specenergy: gate speculative-decoding changes on energy per accepted token. The public
names load lazily (PEP 562), so importing a subpackage - above all the reference server, its own
program - loads none of the plugin."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_PUBLIC = {
    "Case": "pytest_specenergy.cases.case",
    "Generation": "pytest_specenergy.cases.case",
    "Corpus": "pytest_specenergy.cases.corpora",
    "CaseRecord": "pytest_specenergy.document",
    "Drafter": "pytest_specenergy.engines.drafters",
    "PairResult": "pytest_specenergy.measure.results",
    "RunDocument": "pytest_specenergy.document",
    "RunResult": "pytest_specenergy.measure.results",
    "gpu_path_unavailable": "pytest_specenergy.meters.devices",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
