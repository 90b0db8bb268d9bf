"""DESIGN.md's layering, checked on every import statement (lazy ones included).

`deploy` uses `adapters` and starts `scheduler` and `worker`; `scheduler` and `worker` use
`protocol`; `client` uses `protocol`. Nothing below imports `deploy`; `adapters` never
import `scheduler`. `units.py` is a pure leaf that any layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hpc_cluster"

# layer -> the layers of ours it must never import
FORBIDDEN = {
    "protocol": {"scheduler", "worker", "client", "adapters", "deploy"},
    "scheduler": {"worker", "client", "adapters", "deploy"},
    "worker": {"scheduler", "client", "adapters", "deploy"},
    "client": {"scheduler", "worker", "adapters", "deploy"},
    "adapters": {"scheduler", "worker", "client", "deploy"},
}
CLIENT_MODULES = {"client", "client_tools", "futures", "exceptions", "graph", "progress"}


def layer_of(module: str) -> str | None:
    """'hpc_cluster.scheduler.state' -> 'scheduler'; the client's modules are one layer."""
    parts = module.split(".")
    if parts[0] != "hpc_cluster" or len(parts) < 2:
        return None
    return "client" if parts[1] in CLIENT_MODULES else parts[1]


def imports_of(path: Path) -> list[tuple[int, str]]:
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.split(".")[:-1]            # what a relative import is relative to
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, node.module] if node.module else base)
            if node.module is None:        # `from . import x`: each x may be a module
                out.extend((node.lineno, f"{name}.{alias.name}") for alias in node.names)
            else:
                out.append((node.lineno, name))
    return out


def test_the_resolver_sees_relative_imports():
    found = dict((name, line) for line, name in imports_of(PACKAGE / "deploy" / "config.py"))
    assert "hpc_cluster.units" in found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if layer_of(
    ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) in FORBIDDEN)


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(PACKAGE)) for p in SOURCES])
def test_no_import_crosses_the_layers(path):
    layer = layer_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
    bad = [f"line {line}: {name}" for line, name in imports_of(path)
           if layer_of(name) in FORBIDDEN[layer]]
    assert not bad, f"{path.relative_to(PACKAGE)} ({layer}) imports across DESIGN.md's layers: {bad}"
