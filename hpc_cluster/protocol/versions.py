"""Package versions each peer announces in its handshake, and how to compare them."""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import metadata

# Distribution names; numpy and pandas are compared only where both sides have them.
PACKAGES = ("hpc-cluster", "cloudpickle", "msgpack", "tornado", "numpy", "pandas")
OPTIONAL = ("numpy", "pandas")


class VersionMismatchWarning(UserWarning):
    """The client, the scheduler or a worker runs other versions of packages that must agree."""


@lru_cache(maxsize=1)
def get_versions() -> dict[str, str | None]:
    """Versions of the packages that must agree across the cluster (read, not imported)."""
    out: dict[str, str | None] = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def mismatches(ours: dict, theirs: dict) -> list[tuple[str, str | None, str | None]]:
    """(package, our version, their version) for every disagreement that matters."""
    rows = []
    for name in ("python", *PACKAGES):
        a, b = ours.get(name), theirs.get(name)
        if name in OPTIONAL and (a is None or b is None):
            continue
        if name == "python" and a and b:
            same = a.split(".")[:2] == b.split(".")[:2]    # bytecode and pickles follow minor versions
        else:
            same = a == b
        if not same:
            rows.append((name, a, b))
    return rows


def format_table(rows, ours: str = "here", theirs: str = "peer") -> str:
    width = max([len("package"), *(len(r[0]) for r in rows)])
    lines = [f"  {'package':<{width}}  {ours:<12}  {theirs:<12}"]
    for name, a, b in rows:
        lines.append(f"  {name:<{width}}  {a or '-':<12}  {b or '-':<12}")
    return "\n".join(lines)


def grouped_mismatches(ours: dict, peers: dict[str, dict]) -> list[tuple[str, str | None, str | None, list[str]]]:
    """(package, our version, theirs, [peers with that version]) for every disagreement that
    matters, peers that disagree alike grouped into one row, in PACKAGES order."""
    groups: dict[tuple, list[str]] = {}
    for peer, theirs in peers.items():
        for row in mismatches(ours, theirs):
            groups.setdefault(row, []).append(peer)
    order = ("python", *PACKAGES)
    return [(name, a, b, where) for (name, a, b), where in
            sorted(groups.items(), key=lambda item: order.index(item[0][0]))]


def format_grouped(rows, ours: str = "client", show: int = 3) -> str:
    """A table of grouped_mismatches(): package, our version, theirs, and where."""
    def where(peers: list[str]) -> str:
        more = f" and {len(peers) - show} more" if len(peers) > show else ""
        return ", ".join(peers[:show]) + more
    width = max([len("package"), *(len(r[0]) for r in rows)])
    lines = [f"  {'package':<{width}}  {ours:<12}  {'theirs':<12}  where"]
    for name, a, b, peers in rows:
        lines.append(f"  {name:<{width}}  {a or '-':<12}  {b or '-':<12}  {where(peers)}")
    return "\n".join(lines)
