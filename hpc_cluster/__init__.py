"""hpc-cluster: a task cluster on HPC batch systems that knows why a worker died."""

__version__ = "0.1.0"

# The public names load on first use (PEP 562): a scheduler, worker or nanny process imports
# `hpc_cluster.<its module>`, which runs this file first; eager imports here would load the
# client, cloudpickle, jinja2 and yaml into every one of them (slower starts, and the
# scheduler would carry a pickler it must never use).
_EXPORTS = {
    "Client": "client.client",
    "Future": "client.futures", "as_completed": "client.futures", "wait": "client.futures",
    "SLURMCluster": "deploy.cluster", "PBSCluster": "deploy.cluster", "SGECluster": "deploy.cluster",
    "LSFCluster": "deploy.batch_clusters", "HTCondorCluster": "deploy.batch_clusters",
    "LocalCluster": "deploy.local.cluster",
    "Security": "protocol.tls",
    "progress": "client.progress",
    "futures_of": "client.dask_collections",
    **{name: "client.subtasks" for name in ("get_client", "worker_client")},
    **{name: "client.seceding" for name in ("secede", "rejoin")},
    **{name: "client.exceptions" for name in (
        "CancelledError", "HPCClusterError", "KilledWorker", "LostDataError", "NoPoolError", "TaskCrashedError",
        "TaskMemoryError", "TaskTooLongError", "TaskWalltimeError", "TimeoutError")},
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None and name.endswith("Cluster") and not name.startswith("_"):
        # Any installed adapter's cluster class (its `cluster_name`, a plugin's too), made
        # from the adapter (deploy/batch_clusters.py): a new batch system adds no line here.
        module = "deploy.batch_clusters"
    if module is None:
        raise AttributeError(f"module 'hpc_cluster' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
