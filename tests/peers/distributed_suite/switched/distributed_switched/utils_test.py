"""distributed.utils_test as distributed's tests import it, but its `cluster()` starts ours.

Everything else (inc, slowinc, varying, captured_logger, ...) is distributed's own helper: the
functions the tests submit. `cluster()` yields what distributed's does (the scheduler's and each
worker's info, with its "address") for an hpc_cluster LocalCluster, and puts the cluster's secret
in the environment meanwhile, so that `Client(s["address"])` connects as distributed's would."""

from __future__ import annotations

import os
from contextlib import contextmanager

import distributed.utils_test as _theirs

from hpc_cluster import Client, LocalCluster
from hpc_cluster.protocol.clusterfile import SECRET_ENV


@contextmanager
def cluster(nworkers=2, nanny=False, worker_kwargs=None, active_rpc_timeout=10, scheduler_kwargs=None,
            config=None):
    before = os.environ.get(SECRET_ENV)
    worker_kwargs = dict(worker_kwargs or {})
    # What distributed's cluster() gives its workers: one thread each, as much memory as asked.
    with LocalCluster(n_workers=nworkers, threads_per_worker=worker_kwargs.pop("nthreads", 1), nanny=nanny,
                      memory_limit=worker_kwargs.pop("memory_limit", "2GB"), dashboard_address=None) as c:
        os.environ[SECRET_ENV] = c.secret.hex()
        try:
            with Client(c, set_as_default=False) as client:
                client.wait_for_workers(nworkers, timeout=60)
                workers = sorted(client.scheduler_info()["workers"])
            yield {"address": c.scheduler_address}, [{"address": w} for w in workers]
        finally:
            if before is None:
                os.environ.pop(SECRET_ENV, None)
            else:
                os.environ[SECRET_ENV] = before


def __getattr__(name: str):
    return getattr(_theirs, name)
