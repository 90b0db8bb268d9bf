"""hpc-cluster: a task cluster on HPC batch systems that knows why a worker died."""

__version__ = "0.1.0"

# The public names load on first use (PEP 562): a scheduler, worker or nanny process imports
# `hpc_cluster.<its module>`, which runs this file first; eager imports here would load the
# client, cloudpickle, jinja2 and yaml into every one of them (slower starts, and the
# scheduler would carry a pickler it must never use).
_EXPORTS = {
    # From the module that also registers what Client() starts (the client layer may not import deploy).
    "Client": "deploy.local.starting",
    "default_client": "client.starting",         # issue 31: starting a client as in dask
    "Future": "client.futures", "as_completed": "client.completion", "wait": "client.futures",
    "SLURMCluster": "deploy.cluster", "PBSCluster": "deploy.cluster", "SGECluster": "deploy.cluster",
    "LSFCluster": "deploy.batch_clusters", "HTCondorCluster": "deploy.batch_clusters",
    "LocalCluster": "deploy.local.cluster",
    "Security": "protocol.tls",
    "progress": "client.progress",
    **{name: "client.report" for name in ("performance_report", "get_task_stream")},
    **{name: "client.looking" for name in ("print", "warn")},      # a task's print/warn, on the clients too
    "futures_of": "client.dask_collections",
    **{name: "client.subtasks" for name in ("get_client", "worker_client")},
    **{name: "client.seceding" for name in ("secede", "rejoin")},
    **{name: "client.coordination" for name in (      # issue 31: coordination
        "Lock", "Semaphore", "MultiLock", "Event", "Variable", "Queue", "fire_and_forget")},
    "get_worker": "client.workers",     # issue 31: reaching and preparing workers
    **{name: "client.worker_plugins" for name in ("WorkerPlugin", "UploadFile", "PipInstall", "UploadDirectory",
                                                  "Environ")},
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


# -- joblib: our backends ("hpc-cluster", and "dask" while our Client is current) are put in
# joblib's table as soon as joblib is loaded, before hpc_cluster or after, by a factory that
# imports client/joblib_backend.py only when joblib asks for one: nothing here imports joblib or
# our client (a scheduler or worker process imports this file too).
def _joblib_backend(name, **kwargs):
    from .client.joblib_backend import make_backend
    return make_backend(name, **kwargs)


def _register_joblib_backends(joblib) -> None:
    from functools import partial
    for name in ("hpc-cluster", "dask"):
        joblib.register_parallel_backend(name, partial(_joblib_backend, name))


from .imports import when_imported as _when_imported  # noqa: E402  (a leaf: imports nothing of ours)

_when_imported("joblib", _register_joblib_backends)
