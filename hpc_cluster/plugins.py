"""Where batch-system adapters are found: the `hpc_cluster.adapters` entry-point group.

A leaf any layer may use. It lists what is installed without importing any of it, so
`config` can check `batch: NAME` against the installed adapters while never importing
`adapters` (the layering rule), and `adapters` loads the one it is asked for. Our own
SLURM, PBS and SGE adapters are registered the same way, in pyproject.toml, as a third
party's would be (docs/writing-an-adapter.md).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

ADAPTER_GROUP = "hpc_cluster.adapters"
# Not a batch system: LocalCluster's processes on this machine (config's `batch: local`).
LOCAL = "local"


class AdapterLookupError(ValueError):
    """A batch system name no installed adapter answers to, or one that cannot be loaded."""


def adapter_entry_points() -> dict[str, EntryPoint]:
    """Installed adapters by lower-case name, not loaded. Two distributions claiming one name
    is an error: which one runs the jobs must not depend on the order of sys.path."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ADAPTER_GROUP):
        key = ep.name.lower()
        other = found.get(key)
        if other is not None and other.value != ep.value:
            raise AdapterLookupError(
                f"two installed packages register the batch system {ep.name!r} in the {ADAPTER_GROUP!r} "
                f"entry-point group: {_origin(other)} and {_origin(ep)}; uninstall one of them")
        found[key] = ep
    return found


def installed_batch_systems() -> list[str]:
    """The names `batch:` / get_adapter() accept (besides 'local'), sorted."""
    return sorted(adapter_entry_points())


def unknown_batch_message(name: str, what: str = "batch") -> str:
    """What to say of a name no adapter answers to: the installed ones, and how to add one."""
    names = installed_batch_systems()
    if not names:
        return (f"{what}={name!r}: no batch-system adapters are installed at all (the {ADAPTER_GROUP!r} "
                "entry-point group is empty): hpc-cluster's own package metadata is missing; reinstall it "
                "with `pip install -e .` (or `pip install hpc-cluster`)")
    return (f"{what}={name!r} is not an installed batch system; installed: {', '.join(names)}. "
            f"Fix the name, or install the package that provides it (it registers itself in the "
            f"{ADAPTER_GROUP!r} entry-point group; docs/writing-an-adapter.md)")


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value} ({dist.name} {dist.version})" if dist is not None else ep.value
