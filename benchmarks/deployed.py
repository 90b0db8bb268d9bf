"""Both engines as hpc-cluster deploys them (issue 32, point 8): what throughput.py and
collections.py start for their "ours-slurm" and "dist-slurm" systems.

    ours-slurm   SLURMCluster(...)                        our scheduler, our workers
    dist-slurm   SLURMCluster(..., engine="distributed")  distributed's Scheduler and Worker

Each is the real thing a user gets: the cluster daemon started by the cluster class, one batch
job per worker (cores=threads, processes=1), the job script, our nanny in every job, and the
user's Client (ours, or distributed's Client(cluster) on the distributed engine). Only the
engine differs, so the comparison is of the engines under one deployment, not of two ways of
starting processes. The daemon is one process on either engine (distributed's Scheduler runs
in it beside ours, deploy/daemon/run.py): its CPU and memory are the "scheduler" figures.

The SLURM here is the one-host test cluster (tests/batch/slurm/cluster.sh): the jobs run on
this machine, so psutil can read every process a benchmark meters. memory_after() gives the
memory figure of the engines' comparison, for any system throughput.py runs.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import uuid
from dataclasses import dataclass
from typing import Callable

# system name -> (cluster class in hpc_cluster, engine keyword: None for the default)
SYSTEMS = {"ours-slurm": ("SLURMCluster", None), "dist-slurm": ("SLURMCluster", "distributed")}
DESCRIPTION = ("ours-slurm: SLURMCluster() with our engine; dist-slurm: SLURMCluster(engine='distributed') "
               "(distributed's Scheduler and Worker): one job per worker on the real SLURM")


@dataclass
class Deployed:
    client: object                 # hpc_cluster.Client or distributed.Client
    cluster: object
    scheduler_pid: int             # the cluster daemon (both schedulers on the distributed engine)
    deaths: Callable[[], list]     # our death records, on either engine


def start(stack: contextlib.ExitStack, system: str, workers: int, threads: int = 1, memory: str = "2GB",
          walltime: str = "01:00:00", timeout: float = 180) -> Deployed:
    """`workers` one-process jobs of `system`'s engine, all registered, closed with `stack`
    (the client first, then the cluster, which cancels its jobs)."""
    import hpc_cluster
    from hpc_cluster.protocol.clusterfile import read_cluster_file
    cls_name, engine = SYSTEMS[system]
    logging.getLogger("distributed").setLevel(logging.ERROR)
    logs = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"bench-{system}-"))
    name = f"bench-{system}-{uuid.uuid4().hex[:6]}"
    cluster = stack.enter_context(getattr(hpc_cluster, cls_name)(
        cores=threads, processes=1, memory=memory, walltime=walltime, name=name, job_name=name,
        log_directory=logs, **({"engine": engine} if engine else {})))
    cluster.scale(workers)
    if engine == "distributed":
        from distributed import Client
        client = stack.enter_context(Client(cluster, timeout=timeout))

        def deaths() -> list:
            # distributed's Client has no deaths(): ours, on the same cluster file, has them
            with hpc_cluster.Client(cluster_file=str(cluster.cluster_file)) as ours:
                return ours.deaths()
    else:
        client = stack.enter_context(hpc_cluster.Client(cluster, timeout=timeout))
        deaths = client.deaths
    client.wait_for_workers(workers, timeout=timeout)
    pid = int(read_cluster_file(cluster.cluster_file)["pid"])
    return Deployed(client, cluster, pid, deaths)


def _peak_rss(pid: int) -> int | None:
    """A process's peak RSS so far (Linux's VmHWM), in bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_after(meter) -> dict:
    """RSS in bytes of each process group a CPUMeter watches, summed, now (after the runs), and
    the scheduler's peak RSS (dask's LocalCluster: the client's process, which holds both)."""
    out = {}
    for name, procs in meter.procs.items():
        total = 0
        for p in procs:
            with contextlib.suppress(Exception):
                total += p.memory_info().rss
        out[name] = total
    sched = meter.procs.get("scheduler") or meter.procs.get("client+scheduler") or []
    if sched:
        out["scheduler_peak"] = _peak_rss(sched[0].pid)
    return out
