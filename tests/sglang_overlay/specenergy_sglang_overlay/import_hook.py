"""Run a function on a module right after Python executes it, without importing it early."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Callable
from typing import Sequence


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the module's own loader, then calls ``after(module)``."""

    def __init__(self, loader: importlib.abc.Loader, after: Callable[[types.ModuleType], None]):
        self.loader = loader
        self.after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.after(module)


class AfterImport(importlib.abc.MetaPathFinder):
    """A finder placed first on ``sys.meta_path``: for ``name`` it asks the other finders for the
    module's spec and wraps its loader, so ``after`` sees the module executed and before anyone
    imports from it. Any other name is left to the other finders."""

    def __init__(self, name: str, after: Callable[[types.ModuleType], None]) -> None:
        self.name = name
        self.after = after

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.after)
                return spec
        return None


def after_import(name: str, after: Callable[[types.ModuleType], None]) -> None:
    """Call ``after(module)`` once ``name`` is imported (at once if it already is)."""
    if name in sys.modules:
        after(sys.modules[name])
        return
    sys.meta_path.insert(0, AfterImport(name, after))
