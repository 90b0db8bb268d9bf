"""What the deployment tests of the distributed engine (issue 32) share: a cluster made with
engine="distributed" whose jobs start distributed's workers, reached with distributed's own
Client, and what our scheduler (the daemon's control plane) knows of those workers.

The tasks submitted are builtins (pow, sum): distributed's scheduler and workers unpickle the
graph and cannot import tests/ (helpers/by_value.py says why)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from hpc_cluster import Client as OurClient
from helpers.sims import stop_simulator
from helpers.wait import wait_until


def our_workers(cluster) -> dict[str, dict]:
    """Our scheduler's workers (address -> its record: name, pool, job, memory_limit): each of
    distributed's workers is mirrored there (engines/bridge.py)."""
    with OurClient(cluster_file=str(cluster.cluster_file), timeout=30) as ours:
        return ours.scheduler_info()["workers"]


@contextlib.contextmanager
def on_distributed(cluster, jobs: int = 1, workers: int | None = None, timeout: float = 180):
    """`cluster` (just made, engine="distributed") scaled to `jobs` jobs, with distributed's Client
    connected and `workers` (default: `jobs`) workers joined; yields that client. Checks first that
    the job script starts the distributed engine's worker and that the cluster's address is
    distributed's scheduler's (the cluster file's engine_address). On exit the client and the
    cluster are closed, and the cluster file and distributed's scheduler file are gone."""
    from distributed import Client
    info = json.loads(Path(cluster.cluster_file).read_text())
    scheduler_file = Path(info["scheduler_file"])
    try:
        assert "--engine distributed" in cluster.job_script()
        assert info["engine"] == "distributed" and cluster.scheduler_address == info["engine_address"]
        assert json.loads(scheduler_file.read_text())["address"] == info["engine_address"]
        cluster.scale(jobs=jobs)
        with Client(cluster, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(workers or jobs, timeout=timeout)
            yield client
    finally:
        cluster.close()
    assert not Path(cluster.cluster_file).exists() and not scheduler_file.exists()


def joins_and_computes(cluster, jobs: int = 1) -> dict[str, dict]:
    """on_distributed's run in short: the workers compute a task through distributed's Client,
    each of them is known to our scheduler with its job, and the job table names them; returns
    the job table as it was then."""
    with on_distributed(cluster, jobs) as client:
        assert client.submit(pow, 2, 10).result(timeout=60) == 1024
        assert client.gather(client.map(pow, range(20), [2] * 20)) == [x * x for x in range(20)]
        theirs = set(client.scheduler_info(n_workers=-1)["workers"])
        ours = wait_until(lambda: (w := our_workers(cluster)) and set(w) == theirs and w, 30,
                          "our scheduler to mirror distributed's workers")
        jobs_table = wait_until(lambda: (t := cluster.jobs) and all(r["workers"] for r in t.values()) and t,
                                30, "every job to show its worker")
        assert {a for r in jobs_table.values() for a in r["workers"]} == theirs
        assert {str(w.get("job_id")) for w in ours.values()} == set(jobs_table), ours
    return jobs_table


def joins_and_computes_on_simulator(sim, home: Path, make_cluster) -> dict[str, dict]:
    """joins_and_computes of the cluster `make_cluster()` makes, on the command-level simulator
    `sim` (lsfsim, condorsim) that helpers/sims.py's use_simulator put on PATH with its state in
    `home`; the simulator is stopped after, whatever happened."""
    try:
        return joins_and_computes(make_cluster())
    finally:
        stop_simulator(sim, home)
