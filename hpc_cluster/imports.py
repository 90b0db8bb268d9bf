"""`when_imported(name, then)`: run `then(module)` once the module `name` has been imported,
now if it already is. A leaf, for the hooks we put into other projects' modules without
importing them ourselves (joblib's backend table, xarray's locks), so that importing
hpc_cluster stays cheap and a scheduler or worker process never loads them.

The finder stands first on sys.meta_path for that one name only: it asks the finders after
it for the module's spec and wraps its loader, so the module loads exactly as it would without
us (its own finder and loader, which it sees as its own), then `then` runs. It leaves
sys.meta_path once it has fired."""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable

_lock = threading.Lock()


def when_imported(name: str, then: Callable) -> None:
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            if any(isinstance(f, _AfterImport) and f.name == name and f.then is then for f in sys.meta_path):
                return                                     # asked before: once is enough
            sys.meta_path.insert(0, _AfterImport(name, then))
            return
    then(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenRun(spec.loader, self)
                return spec
        return None


class _ThenRun(importlib.abc.Loader):
    def __init__(self, loader, finder: _AfterImport):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader     # the module sees only its own
        self.loader.exec_module(module)
        with _lock:
            if self.finder in sys.meta_path:
                sys.meta_path.remove(self.finder)
        self.finder.then(module)

    def __getattr__(self, name):               # the rest of the loader's face (get_source, ...)
        return getattr(self.loader, name)
