"""The installed adapters' own settings, collected into the settings table (schema.py).

Each adapter declares what only its batch system reads (`keywords`, adapters/options.py) and
the rules that need the whole picture (`resolve_options`, `native_keywords`). This module asks
the installed adapters, found through their entry points (plugins.py loads the classes; config
never imports `adapters`: the layering rule), so config holds no list of batch systems and no
rule of one. An adapter that fails to load contributes nothing here: the error is told when its
batch system is used (adapters.adapter_class), not to every user of every other one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

from ..plugins import LOCAL, AdapterLookupError, adapter_entry_points


@dataclass(frozen=True)
class Declared:
    """One adapter option as collected: the declaration and the batch systems declaring it."""

    option: Any                     # adapters/options.py's AdapterOption (duck-typed: no import)
    owners: tuple[str, ...]         # batch system names, sorted


class OptionClash(ValueError):
    """Two declarations of one name that differ, or one that takes a core setting's name."""


@functools.lru_cache(maxsize=None)
def adapter_classes() -> dict[str, type]:
    """The installed adapters' classes by batch system name; those that fail to load are left out."""
    out = {}
    try:
        points = adapter_entry_points()
    except AdapterLookupError:
        return {}
    for name, ep in sorted(points.items()):
        try:
            out[name] = ep.load()
        except Exception:            # told when this batch system is used (adapters.adapter_class)
            continue
    return out


def title_of(cls: type, batch: str) -> str:
    """How the docs name a batch system: its adapter's `title` ('HTCondor'), else its name upper case."""
    return getattr(cls, "title", None) or batch.upper()


def adapter_class_of(batch: str | None) -> type | None:
    """The loaded adapter class of `batch`; None for 'local', unset, unknown or unloadable."""
    if not batch or batch == LOCAL:
        return None
    return adapter_classes().get(str(batch).lower())


def multi_node(batch: str | None) -> bool:
    """Whether `batch`'s jobs may span several nodes (the adapter's `multi_node`: SLURM's nodes=)."""
    return bool(getattr(adapter_class_of(batch), "multi_node", False))


def walltime_reading(batch: str | None):
    """How `batch` reads a walltime string: its adapter's `walltime_reading` (units.WalltimeReading),
    or None (ours: a bare number is seconds) for 'local', unset, or an adapter declaring none."""
    return getattr(adapter_class_of(batch), "walltime_reading", None)


def walltime_readings() -> list:
    """Every installed adapter's walltime reading (those declaring one), in name order."""
    return [r for r in (getattr(c, "walltime_reading", None) for c in adapter_classes().values()) if r is not None]


def collect(classes: Mapping[str, type], core_names: set[str]) -> dict[str, Declared]:
    """name -> Declared, from each class's `keywords`. Pure. One name declared by several
    adapters must be one declaration (the same object, or an equal one); a name of the core
    table or of another option's alias is an OptionClash naming both."""
    found: dict[str, Any] = {}
    owners: dict[str, list[str]] = {}
    for batch, cls in classes.items():
        for option in getattr(cls, "keywords", None) or ():
            for name in (option.name, *option.aliases):
                if name in core_names:
                    raise OptionClash(f"the {batch!r} adapter declares the setting {name!r}, which is a core "
                                      "setting of hpc-cluster; name it differently")
            other = found.get(option.name)
            if other is not None and other != option:
                raise OptionClash(f"the {batch!r} adapter and the {owners[option.name][0]!r} adapter declare "
                                  f"the setting {option.name!r} differently; one name, one meaning")
            found[option.name] = option
            owners.setdefault(option.name, []).append(batch)
    aliases: dict[str, str] = {}
    for option in found.values():
        for alias in option.aliases:
            if alias in found or aliases.setdefault(alias, option.name) != option.name:
                raise OptionClash(f"the alias {alias!r} of {option.name!r} is the name of another adapter "
                                  "setting; name it differently")
    return {name: Declared(option, tuple(sorted(owners[name]))) for name, option in found.items()}


def declares_keywords(batch: str | None) -> bool:
    """Whether `batch`'s adapter declares its keywords (ours and fakebatch do): then another
    batch system's keywords are refused there. An adapter that declares none (`keywords` unset,
    written before adapters could declare them) decides for itself, as before."""
    cls = adapter_class_of(batch)
    return cls is not None and getattr(cls, "keywords", None) is not None


def cluster_name(batch: str | None) -> str:
    """The dask-jobqueue class name of `batch`'s clusters ('SLURMCluster'), else 'cluster'."""
    cls = adapter_class_of(batch)
    return getattr(cls, "cluster_name", None) or "cluster"


def native_keywords(batch: str | None) -> dict[str, str]:
    """dask-jobqueue's own names, on `batch`, for a core setting that it renamed elsewhere
    (Grid Engine's and LSF's `project` is their account, no old name): old -> new."""
    return dict(getattr(adapter_class_of(batch), "native_keywords", None) or {})


def resolve_hook(batch: str | None):
    """`batch`'s adapter's resolve_options(values, environ), or None."""
    return getattr(adapter_class_of(batch), "resolve_options", None)
