"""The one place an engine backend is chosen by name (as xdist picks its scheduler by ``--dist``)."""

from __future__ import annotations

from pytest_specenergy.engines.base import ENGINES
from pytest_specenergy.engines.base import EngineBackend
from pytest_specenergy.engines.base import EngineConfigError


def get_backend(name: str) -> EngineBackend:
    """The backend registered under ``name`` (``reference`` or ``sglang``), imported on first use."""
    if name == "reference":
        from pytest_specenergy.engines.refserver import ReferenceBackend

        return ReferenceBackend()
    if name == "sglang":
        from pytest_specenergy.engines.sglang import SGLangBackend

        return SGLangBackend()
    raise EngineConfigError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
