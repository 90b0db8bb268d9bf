"""The inner run's plugin (`-p xr_plugin`) for xarray's tests: one LocalCluster of ours for the
session and a Client that is dask's default scheduler, so test_dask.py's computes run on the
cluster, except where a test asks for another scheduler (many do: `dask.config.set(scheduler=...)`,
`raise_if_dask_computes()`); test_distributed.py's tests start clusters of their own
(xr_fixtures.py). A test that leaves dask's scheduler changed gets it put back before the next."""

from __future__ import annotations

import dask

_session: dict = {}


def pytest_sessionstart(session):
    from hpc_cluster import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=2, memory_limit="2GB", dashboard_address=None)
    _session.update(cluster=cluster, client=Client(cluster))
    _session["scheduler"] = dask.config.get("scheduler")


def pytest_runtest_setup(item):
    if "scheduler" in _session and dask.config.get("scheduler", None) is not _session["scheduler"]:
        dask.config.set(scheduler=_session["scheduler"])


def pytest_sessionfinish(session):
    for name in ("client", "cluster"):
        thing = _session.pop(name, None)
        if thing is not None:
            thing.close()


def pytest_report_header(config):
    return [f"dask's scheduler: hpc_cluster's Client of {_session.get('cluster')!r}"]
