"""xarray writes netCDF files on our clusters as on distributed's (issue 31, point 8).

Why. xarray chooses how to write a file from dask-backed data by asking which scheduler dask
uses (xarray/backends/locks.py, `get_dask_scheduler`): "distributed" only when the scheduler's
`__self__` is an instance of distributed's Client, else "threaded". For "distributed" it locks
the file with distributed's Lock (`_get_lock_maker`) and closes it after each write
(writers.py's autoclose), since each chunk is written by whichever worker process computed it.
For "threaded" it takes a threading.Lock, which cannot be pickled to a worker (to_netcdf failed
with "cannot pickle '_thread.lock' object") and would lock nothing across processes if it could.

What. Two of xarray's functions are wrapped, nothing else changes:

- `get_dask_scheduler()` answers "distributed" where it would answer "threaded" while the
  scheduler is one of our Clients (dask's default while a Client is, or `scheduler=client`);
  so autoclose is on, as for distributed, and xarray's own checks run as they do there (the
  scipy engine, whose store cannot close after each write, is refused as on distributed);
- `_get_lock_maker("distributed")` gives our Lock (client/coordination.py) while our Client is
  the scheduler: a lock by the file's name, held through the scheduler, across the workers.

With distributed's Client as the scheduler, or none of ours, both answer exactly as before.

When. `install()` runs when hpc_cluster's client package is imported: it patches xarray now if
xarray.backends.locks is already imported, else it patches the module as it is imported
(hpc_cluster/imports.py) (so xarray may be imported before or after hpc_cluster). Modules that took
`get_dask_scheduler` by name before the patch (writers.py) are given the wrapped one too.
"""

from __future__ import annotations

import sys
import threading

from ..imports import when_imported

LOCKS = "xarray.backends.locks"
_lock = threading.Lock()


def _our_client_schedules(get=None, collection=None) -> bool:
    """Is the scheduler dask uses now (as xarray asks for it) one of our Clients?"""
    try:
        from dask.base import get_scheduler
        scheduler = get_scheduler(get, collection)
    except Exception:
        return False
    from .client import Client
    return isinstance(getattr(scheduler, "__self__", None), Client)


def patch(locks) -> None:
    """Wrap xarray's `get_dask_scheduler` and `_get_lock_maker` in the module `locks` (once)."""
    with _lock:
        original = locks.get_dask_scheduler
        if getattr(original, "_hpc_cluster", False):
            return
        make_lock = locks._get_lock_maker

        def get_dask_scheduler(get=None, collection=None):
            found = original(get, collection)
            if found == "threaded" and _our_client_schedules(get, collection):
                return "distributed"
            return found

        def _get_lock_maker(scheduler=None):
            if scheduler == "distributed" and _our_client_schedules():
                from .coordination import Lock
                return Lock
            return make_lock(scheduler)

        for wrapper, wrapped in ((get_dask_scheduler, original), (_get_lock_maker, make_lock)):
            wrapper.__doc__, wrapper.__wrapped__, wrapper._hpc_cluster = wrapped.__doc__, wrapped, True
        locks.get_dask_scheduler, locks._get_lock_maker = get_dask_scheduler, _get_lock_maker
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("xarray.") and \
                    getattr(module, "get_dask_scheduler", None) is original:
                module.get_dask_scheduler = get_dask_scheduler


def install() -> None:
    """Patch xarray now if its locks module is loaded, else when it is (idempotent: patch()
    marks what it wrapped)."""
    when_imported(LOCKS, patch)
