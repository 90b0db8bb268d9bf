"""Our pytest plugin for dask's own tests (loaded with `-p dask_plugin` in the inner runs).

For the whole session it starts ONE cluster (dask_clusters.py: a scheduler and WORKERS
worker processes of THREADS threads, each worker in its own mount namespace with a private
/tmp) and a Client, and makes that client dask's scheduler, so every compute of every test
runs on the cluster unless the test itself asks for another scheduler:

* `--dask-client ours`: our LocalCluster and Client;
* `--dask-client distributed`: distributed's scheduler and workers and its Client, which
  makes itself dask's default scheduler as it does for its users.

Before the first test a probe computes through dask's default scheduler and checks that
the tasks ran in the workers, each with its own /tmp; before each test the plugin checks
that dask's scheduler is still the cluster (a test that changed it for good is named, and
the scheduler is put back). Both go into `dask-run.json` in the run's directory, which the
harness reads. `--dask-only FILE` runs only the test ids listed in FILE (one a line, as in
docs/dask-collections.md), for re-running our failures on distributed's client;
`--dask-shard I/N` runs every N-th test from the I-th, one part of a long file.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import dask
import psutil
import pytest

from dask_clusters import (THREADS, WORKERS, DistributedProcesses, PrivateTmpLocalCluster, check_probe,
                           kept_under_tmp, private_tmp_wrapper, probe_task)
from dask_fetch import IDS

REPORT = "dask-run.json"
PROBE_TIMEOUT = 60


def pytest_addoption(parser):
    group = parser.getgroup("hpc-cluster", "hpc-cluster: dask's tests on a cluster")
    group.addoption("--dask-client", choices=["ours", "distributed"], default="ours",
                    help="whose Client (and cluster) runs every compute")
    group.addoption("--private-tmp", choices=["root", "userns", "off"], default="root",
                    help="how each worker gets its own /tmp (dask_clusters.private_tmp_mode)")
    group.addoption("--dask-run-dir", default=".", help="where the cluster's logs and dask-run.json go")
    group.addoption("--dask-only", metavar="FILE", help="run only the test ids listed in FILE")
    group.addoption("--dask-shard", metavar="I/N", help="run only every N-th test, from the I-th (0-based)")


class Session:
    def __init__(self, config):
        self.kind = config.getoption("--dask-client")
        self.private_tmp = config.getoption("--private-tmp")
        self.directory = Path(config.getoption("--dask-run-dir")).resolve()
        self.report = {"client": self.kind, "private_tmp": self.private_tmp, "workers": WORKERS,
                       "threads_per_worker": THREADS, "scheduler_changed_by": []}
        self.cluster = self.client = None
        self.expected = None
        self.last_test = None

    def start(self) -> None:
        wrapper = private_tmp_wrapper(self.private_tmp, [*kept_under_tmp(), str(self.directory)])
        memory = psutil.virtual_memory().total // WORKERS
        logs = self.directory / "cluster-logs"
        logs.mkdir(exist_ok=True)
        if self.kind == "ours":
            from hpc_cluster import Client
            self.cluster = PrivateTmpLocalCluster(n_workers=WORKERS, threads_per_worker=THREADS,
                                                  memory_limit=memory, log_directory=str(logs),
                                                  wrapper=wrapper, timeout=60,
                                                  # not dask's 8787, where a test's own
                                                  # distributed.LocalCluster would fail to start
                                                  dashboard_address="127.0.0.1:0")
            # Our Client makes itself dask's default scheduler, as distributed's does (with
            # dataframe.shuffle.method 'tasks'); before it did, the plugin did it by hand:
            # dask.config.set(scheduler=self.client.get, **{"dataframe.shuffle.method": "tasks"})
            self.client = Client(self.cluster)
        else:
            from distributed import Client
            self.cluster = DistributedProcesses(logs, WORKERS, THREADS, memory, wrapper)
            self.client = Client(self.cluster.address, timeout=60)
            self.client.wait_for_workers(WORKERS, timeout=60)
        self.expected = dask.config.get("scheduler", None)
        self.report["scheduler"] = repr(self.expected)
        self.report["shuffle_method"] = dask.config.get("dataframe.shuffle.method", None)
        if self.expected is None:
            raise RuntimeError(f"{self.kind}: creating the Client did not make it dask's scheduler")
        self.probe()

    def probe(self) -> None:
        with tempfile.TemporaryDirectory(dir=self.directory, prefix="probe-") as shared:
            tasks = [dask.delayed(probe_task, pure=False)(shared, i, WORKERS, PROBE_TIMEOUT) for i in range(WORKERS)]
            results = list(dask.compute(*tasks))          # through dask's default scheduler
        self.report["probe"] = results
        self.report["probe_problems"] = check_probe(results, self.private_tmp != "off")

    def check_scheduler(self, item) -> None:
        now = dask.config.get("scheduler", None)
        # By value: a test may restore a deep copy of dask's config, with a copy of ours in it.
        if type(now) is not type(self.expected) or repr(now) != repr(self.expected):
            self.report["scheduler_changed_by"].append(
                {"after": self.last_test, "scheduler": repr(now)})
            dask.config.set(scheduler=self.expected)
        self.last_test = IDS.from_nodeid(item.nodeid)

    def close(self) -> None:
        for thing in (self.client, self.cluster):
            if thing is not None:
                try:
                    thing.close()
                except Exception as e:  # noqa: BLE001  (the report says so; closing goes on)
                    self.report.setdefault("close_errors", []).append(repr(e))
        self.client = self.cluster = None
        self.write()

    def write(self) -> None:
        (self.directory / REPORT).write_text(json.dumps(self.report, indent=1, default=repr))


_session: Session | None = None


def pytest_sessionstart(session):
    global _session
    _session = Session(session.config)
    try:
        _session.start()
    except BaseException as e:
        _session.report["start_error"] = repr(e)
        _session.close()
        pytest.exit(f"{_session.kind}: the cluster did not start: {e!r}", returncode=3)
    _session.write()
    if _session.report["probe_problems"]:
        _session.close()
        pytest.exit(f"{_session.kind}: the probe found: {_session.report['probe_problems']}", returncode=3)


def pytest_collection_modifyitems(config, items):
    only = config.getoption("--dask-only")
    if only:
        wanted = set(Path(only).read_text().split("\n")) - {""}
        keep = [i for i in items if IDS.from_nodeid(i.nodeid) in wanted]
        config.hook.pytest_deselected(items=[i for i in items if IDS.from_nodeid(i.nodeid) not in wanted])
        items[:] = keep
    shard = config.getoption("--dask-shard")
    if shard:
        keep = in_shard(items, shard)
        kept = {id(x) for x in keep}
        config.hook.pytest_deselected(items=[x for x in items if id(x) not in kept])
        items[:] = keep


def in_shard(items: list, spec: str) -> list:
    """The items of shard `I/N`: every N-th, from the I-th. The parameter variants of one
    test (its slow and fast cases) spread over the shards, so they take about as long."""
    i, n = (int(x) for x in spec.split("/"))
    if not 0 <= i < n:
        raise ValueError(f"--dask-shard {spec}: I/N with 0 <= I < N")
    return items[i::n]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _session is not None:
        _session.check_scheduler(item)


def pytest_sessionfinish(session):
    if _session is not None and _session.client is not None:
        _session.close()


def pytest_report_header(config):
    if _session is not None:
        return [f"dask's scheduler: {_session.kind} client, {_session.cluster!r}, private /tmp: {_session.private_tmp}"]
    return []
