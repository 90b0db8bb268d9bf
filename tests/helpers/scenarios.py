"""Worker deaths staged on a real batch system: one scenario's cluster and client, the job ids it
ever had, and the final verdict of a death. The SLURM scenarios (tests/batch/slurm/scenarios.py)
and the Grid Engine deaths (tests/batch/sge/test_sge_deaths.py) both use these, so a fix to how a
scenario waits for its verdict or cleans up its jobs reaches both."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

from hpc_cluster import Client
from helpers.by_value import by_value
from helpers.wait import WaitTimeout, wait_until

# The evidence collector stops asking the batch system's accounting after ~90 s; be generous.
VERDICT_TIMEOUT = 180
# A job may wait in the queue behind other jobs (the test clusters are shared by the suite).
START_TIMEOUT = 240
# Closing a cluster cancels its jobs; the batch system then takes a few polls to forget them.
LEAVE_TIMEOUT = 120


class Run:
    """One scenario's cluster and client, the job ids it ever had, and its `outcome` (a dict the
    scenario fills with what the user saw)."""

    def __init__(self, cluster, client: Client, outcome: dict | None = None):
        self.cluster, self.client = cluster, client
        self.outcome = {} if outcome is None else outcome
        self.job_ids: set[str] = set()

    def jobs(self) -> dict[str, dict]:
        """The cluster's jobs now; their ids are remembered, to check at the end that they left."""
        jobs = self.cluster.jobs
        self.job_ids |= set(jobs)
        return jobs

    def worker_of(self, predicate, timeout: float = 180, what: str = "a worker") -> dict:
        """A worker row (scheduler_info) for which `predicate(row)` holds."""
        def find():
            return next((w for w in self.client.scheduler_info()["workers"].values() if predicate(w)), None)
        return wait_until(find, timeout, what, interval=0.2)

    def death(self, predicate=lambda d: True, timeout: float = VERDICT_TIMEOUT) -> dict:
        """The first death matching `predicate` once its verdict is final (`final_at` set: the
        batch system's accounting was read)."""
        def final():
            found = [d for d in self.client.deaths() if predicate(d)]
            return found[0] if found and found[0].get("final_at") is not None else None
        try:
            # Each poll is a round trip to the scheduler; the verdict takes seconds to come.
            return wait_until(final, timeout, "a final verdict", interval=0.5)
        except WaitTimeout:
            seen = [(d["name"], d["cause"], d.get("final_at")) for d in self.client.deaths()]
            raise TimeoutError(f"no final verdict in {timeout} s; deaths so far: {seen}") from None

    def record(self, death: dict) -> None:
        """Put `death` in the outcome, with how long its verdict took to be final."""
        self.outcome.update(death=death, cause=death["cause"], blame=death["blame"],
                            to_final=round(death["final_at"] - death["time"], 1))


class DistributedClients:
    """engine="distributed": the user's client is distributed's (`distributed.Client(cluster)`:
    submit, map, wait_for_workers, futures), and what a user asks hpc-cluster about deaths goes
    to ours (`hpc_cluster.Client(cluster_file=...)`: deaths, scheduler_info with each worker's
    job) and to `hpc-cluster why KEY NAME`. One object, so that a scenario written for our
    engine's Client stages the same death on distributed's. Task functions go by value
    (helpers/by_value.py: distributed's scheduler and workers cannot import tests/)."""

    def __init__(self, cluster):
        import distributed
        self.cluster = cluster
        self.user = distributed.Client(cluster)
        self.ours = Client(cluster_file=str(cluster.cluster_file))

    def __getattr__(self, name):                  # wait_for_workers, gather, get_events ...
        return getattr(self.user, name)

    def submit(self, fn, *args, **kwargs):
        return self.user.submit(by_value(fn), *args, **kwargs)

    def map(self, fn, *iterables, **kwargs):
        return self.user.map(by_value(fn), *iterables, **kwargs)

    def deaths(self) -> list[dict]:
        return self.ours.deaths()

    def scheduler_info(self) -> dict:
        """Ours (each worker's job id, pid, pool), with the number of tasks executing on each
        as distributed's scheduler last heard it (our state runs none of them)."""
        theirs = self.user.scheduler_info(n_workers=-1)["workers"]
        info = self.ours.scheduler_info()
        for addr, row in info["workers"].items():
            counts = ((theirs.get(addr) or {}).get("metrics") or {}).get("task_counts") or {}
            row["executing"] = counts.get("executing", 0)
        return info

    def why(self, future) -> str:
        """`hpc-cluster why KEY NAME`, as the user types it: the deaths while it was executing."""
        out = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "why", str(future.key), self.cluster.id],
                             capture_output=True, text=True, timeout=120)
        return out.stdout + out.stderr

    def close(self) -> None:
        try:
            self.user.close()
        finally:
            self.ours.close()


def clients_for(cluster):
    """The client a scenario uses: ours, or on engine="distributed" distributed's with ours beside."""
    return DistributedClients(cluster) if getattr(cluster, "engine", None) == "distributed" else Client(cluster)


@contextmanager
def deployed(cluster, queued, jobs: int = 1, wait: bool = True, outcome: dict | None = None):
    """A Run of `cluster` (a batch system's cluster, just made) with `jobs` workers up (jobs=0:
    none asked for; wait=False: asked for, not waited on). On exit its client and cluster are
    closed and its jobs gone from `queued()`, the ids the batch system still lists. The outcome
    gets `jobs` (every id it had) and `left_in_queue` (those still listed), even when they
    did not leave in time: the scenario's test asserts on both."""
    outcome = {} if outcome is None else outcome
    client = run = None
    try:
        client = clients_for(cluster)
        run = Run(cluster, client, outcome)
        if jobs:
            cluster.scale(jobs)
            if wait:
                client.wait_for_workers(jobs, timeout=START_TIMEOUT)
        run.jobs()
        yield run
    finally:
        if run is not None:
            try:
                run.jobs()                  # the ids of jobs started since the scenario last looked
            except Exception:  # noqa: BLE001  (the cluster may be what failed; closing goes on)
                pass
        if client is not None:
            client.close()
        cluster.close()
        ids = run.job_ids if run else set()
        try:
            # Each poll runs the batch system's queue command: once a second is enough.
            wait_until(lambda: not (ids & queued()), LEAVE_TIMEOUT, f"jobs {sorted(ids)} to leave the queue",
                       interval=1)
        finally:
            outcome["jobs"] = sorted(ids)
            outcome["left_in_queue"] = sorted(ids & queued())
