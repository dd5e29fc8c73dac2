"""The machinery behind this project's import-only stand-ins for ``torchvision`` and ``sgl_kernel``.

Written for pytest-specenergy; no code here comes from those packages or from SGLang.

Why they exist: the conformance and live tests install the real ``sglang`` wheels (without
their dependencies) next to the CPU build of torch 2.13. SGLang imports ``torchvision`` and
``sgl_kernel`` at module import time, but PyPI has no CPU build of either that works with CPU
torch (the torchvision wheels there link ``libc10_cuda.so``; ``sglang-kernel`` ships only
sm90/sm100 CUDA objects). A baseline (non-speculative) CPU server never *calls* into them, so
these stand-ins let every name import and refuse every call.

Contract, which the tests rely on:

* any attribute or submodule resolves (``from sgl_kernel.kvcacheio import transfer_kv_all``,
  ``torchvision.transforms.InterpolationMode.BICUBIC``) to a placeholder;
* calling a placeholder, instantiating or subclassing-then-instantiating it, raises
  :class:`StandInCalled` (a ``RuntimeError``) naming what was called;
* dunder lookups (``__wrapped__``, ``__version__`` unless the package sets one) raise
  ``AttributeError``, so feature probes see "not there" rather than a fake value;
* when ``SPECENERGY_STANDIN_LOG`` names a file, each import of a stand-in module and each call
  is appended to it as one JSON line ``{"event": "import"|"call", "name": ..., "pid": ...}``
  (calls also get a short stack), so a test can assert that the stand-ins were on the path
  (imports > 0) and that nothing called them (calls == 0).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
import types
from typing import Any

LOG_ENV = "SPECENERGY_STANDIN_LOG"


class StandInCalled(RuntimeError):
    """Something called into an import-only stand-in."""


def record(event: str, name: str, **extra: Any) -> None:
    """Append one event to the file named by ``$SPECENERGY_STANDIN_LOG`` (if set)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = json.dumps({"event": event, "name": name, "pid": os.getpid(), **extra})
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    except OSError:
        pass


def _refuse(name: str) -> None:
    stack = "".join(traceback.format_stack(limit=8)[:-2])
    record("call", name, stack=stack)
    raise StandInCalled(
        f"{name} was called, but it belongs to pytest-specenergy's import-only stand-in for "
        f"{name.split('.')[0]} (tests/sglang_standins/): PyPI has no CPU build of it, so only "
        "importing is supported. A code path that needs the real package ran; this is a bug in "
        "the test set-up or a CPU path SGLang does not support without it."
    )


class Placeholder:
    """Any name inside a stand-in: attribute access gives more placeholders, calls raise."""

    __slots__ = ("_standin_name", "_standin_children")

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_standin_name", name)
        object.__setattr__(self, "_standin_children", {})

    def __getattr__(self, attr: str) -> "Placeholder":
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        children = object.__getattribute__(self, "_standin_children")
        if attr not in children:
            children[attr] = Placeholder(f"{self._standin_name}.{attr}")
        return children[attr]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _refuse(self._standin_name)

    def __mro_entries__(self, bases: tuple) -> tuple:
        # ``class X(torchvision.transforms.Compose): ...`` defines a class whose construction
        # refuses, as calling the placeholder would.
        name = self._standin_name

        class _StandInBase:
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                _refuse(f"{name} (as base of {cls.__qualname__})")

        _StandInBase.__qualname__ = _StandInBase.__name__ = name.rsplit(".", 1)[-1]
        return (_StandInBase,)

    def __repr__(self) -> str:
        return f"<import-only stand-in {self._standin_name}>"


def module_getattr(module_name: str) -> Any:
    """A PEP 562 ``__getattr__`` for a stand-in module: names become placeholders."""
    cache: dict[str, Placeholder] = {}

    def __getattr__(attr: str) -> Placeholder:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
        if attr not in cache:
            cache[attr] = Placeholder(f"{module_name}.{attr}")
        return cache[attr]

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import ROOT.any.sub.module`` with a stand-in module (after the real finders)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.root + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"Import-only stand-in for {spec.name}.")
        module.__path__ = []  # a package, so deeper submodules resolve too
        module.__getattr__ = module_getattr(spec.name)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        record("import", module.__name__)


def install(root: str, module_globals: dict[str, Any]) -> None:
    """Make the package ``root`` (whose ``__init__`` calls this) a stand-in."""
    module_globals["__getattr__"] = module_getattr(root)
    if not any(isinstance(f, _SubmoduleFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.append(_SubmoduleFinder(root))
    record("import", root)
