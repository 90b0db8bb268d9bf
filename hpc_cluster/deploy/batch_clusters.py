"""dask-jobqueue's cluster class of each batch system that names one, made from its adapter.

An adapter that sets `cluster_name` ('LSFCluster', 'HTCondorCluster') gets its class here, a
JobQueueCluster with its batch system and a docstring made of the adapter's `cluster_doc` and
its declared keywords (adapters/options.py): `from hpc_cluster import LSFCluster` finds it by
that name (module __getattr__), so a batch system adds no class by hand. The keywords
themselves are settings (config collects them from the adapters), so a site file and a
`jobqueue.<section>` give them too.
"""

from __future__ import annotations

from ..adapters import adapter_class
from ..config.adapter_options import adapter_classes
from . import cluster as _written
from .cluster import JOB_PARAMETERS, JobQueueCluster

_MADE: dict[str, type[JobQueueCluster]] = {}


def keyword_parameters(adapter: type) -> str:
    """The numpydoc lines of an adapter's own keywords (and its native names of core settings)."""
    lines = []
    for native, setting in (getattr(adapter, "native_keywords", None) or {}).items():
        lines += [f"    {native} : str", f"        Its name for {setting} (as dask-jobqueue's {adapter.cluster_name} calls it)"]
    for option in adapter.keywords or ():
        lines += [f"    {option.name} : {option.kind}", f"        {option.help}"]
    return "\n".join(lines) + "\n" if lines else ""


def cluster_class(batch: str) -> type[JobQueueCluster]:
    """The cluster class of `batch` (an installed adapter with a `cluster_name`), made once."""
    adapter = adapter_class(batch)
    name = adapter.cluster_name
    if not name:
        raise ValueError(f"the {batch!r} adapter names no cluster class (cluster_name); use "
                         f"JobQueueCluster(batch={batch!r}, ...) or batch: {batch} in a site")
    if name not in _MADE:
        doc = ((adapter.cluster_doc or f"Workers as {batch} jobs, joining one scheduler that explains their deaths.")
               + "\n\n    Parameters\n    ----------\n" + JOB_PARAMETERS + keyword_parameters(adapter))
        _MADE[name] = type(name, (JobQueueCluster,), {"__doc__": doc, "batch": batch, "__module__": __name__,
                                                      "__qualname__": name})
    return _MADE[name]


def __getattr__(name: str):
    # LSFCluster, HTCondorCluster, a plugin's: the class of the adapter that names it.
    for batch, adapter in adapter_classes().items():
        if getattr(adapter, "cluster_name", None) == name:
            # SLURM's, PBS's and Grid Engine's are written out in cluster.py: the same class.
            cls = getattr(_written, name, None) or cluster_class(batch)
            globals()[name] = cls            # made once: pickle and `is` find the same class
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
