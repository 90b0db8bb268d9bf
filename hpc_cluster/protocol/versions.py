"""Package versions each peer announces in its handshake."""

from __future__ import annotations

import importlib
import sys
from functools import lru_cache

PACKAGES = ("hpc_cluster", "cloudpickle", "msgpack", "tornado", "numpy", "pandas")


@lru_cache(maxsize=1)
def get_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in PACKAGES:
        mod = sys.modules.get(name)
        if mod is None and name in ("numpy", "pandas"):
            out[name] = None        # don't import heavy optional packages just to report them
            continue
        try:
            mod = mod or importlib.import_module(name)
            out[name.replace("_", "-")] = str(getattr(mod, "__version__", None) or getattr(mod, "version", None))
        except Exception:
            out[name.replace("_", "-")] = None
    return out
