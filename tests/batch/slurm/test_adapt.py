"""adapt() on the real SLURM cluster: grows with queued work, drains back down without losing results."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from hpc_cluster import Client, SLURMCluster
from hpc_cluster.protocol.clusterfile import read_cluster_file
from helpers.wait import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def one_second(i):
    import time
    time.sleep(1)
    return i + 1


def _running_jobs(cluster) -> int:
    return sum(1 for j in cluster.jobs.values() if j["state"] in ("pending", "running") and not j["retiring"])


def test_adapt_grows_with_work_and_shrinks_when_idle(slurm_cluster, tmp_path):
    name = f"adapt-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path), name=name) as cl, \
            Client(cl) as c:
        cl.adapt(minimum=0, maximum=3)
        assert _running_jobs(cl) == 0                       # no work, no jobs
        futures = c.map(one_second, range(150))             # ~150 s of work: wants the maximum
        deadline = time.time() + 120
        seen = 0
        while time.time() < deadline and seen < 3:
            seen = max(seen, _running_jobs(cl))
            time.sleep(0.5)
        assert seen == 3, f"adapt reached only {seen} jobs"
        assert c.gather(futures) == list(range(1, 151))     # nothing lost on the way down either
        kept = c.submit(one_second, 1000)
        assert kept.result(60) == 1001
        # Idle with results held: adapt's target falls 3 -> 0 and every worker drains at once,
        # with no peer to give its results to. Each stays while it alone holds results still
        # wanted (issue 34: they left, the futures were recomputed, adapt grew the cluster
        # back, and the cycle repeated), so the shrink ends and nothing is recomputed.
        wait_until(lambda: _running_jobs(cl) == 0, 120, "adapt to scale down when idle", interval=0.5)
        assert c.gather(futures) == list(range(1, 151)) and kept.result(10) == 1001
        assert all(d["cause"] == "retired" and not d["blame"] for d in c.deaths()), c.deaths()
        # Released, they go; and no job was ever started again.
        del futures, kept
        wait_until(lambda: not any(j["state"] in ("pending", "running") for j in cl.jobs.values()), 120,
                   "the drained jobs to end once their results were released", interval=0.5)
        assert len(cl.jobs) == 3, f"adapt started jobs again: {sorted(cl.jobs)}"
        assert c.deaths() and all(d["cause"] == "retired" and not d["blame"] for d in c.deaths())
        table = cl.status_table()
        assert table["adaptive"] == [0, 3]


def test_a_shrink_of_every_worker_at_once_keeps_what_only_they_hold(slurm_cluster, tmp_path):
    # adapt's target falling 3 -> 0 in one decision drains every worker at once, with no peer
    # to give its results to (issue 34). Each holds a result the client still wants: each stays
    # (the scheduler says so in the daemon log), nothing is recomputed, and each goes once
    # its result is released. (Before: all three left, the results were lost to lineage.)
    name = f"adapt-all-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path), name=name) as cl, \
            Client(cl) as c:
        cl.adapt(minimum=3, maximum=3)
        c.wait_for_workers(3, timeout=180)
        workers = sorted(c.scheduler_info()["workers"])
        held = [c.submit(one_second, i, workers=[w], pure=False) for i, w in enumerate(workers)]
        assert c.gather(held) == [1, 2, 3]
        cl.adapt(minimum=0, maximum=0)                   # the target falls to 0 in one decision
        log = Path(read_cluster_file(cl.cluster_file)["daemon_log"])

        def kept() -> set[str]:
            return {w for w in workers if f"worker {w} stays: it alone holds 1 results" in log.read_text()}
        wait_until(lambda: kept() == set(workers), 120, "each drained worker to stay for its result", interval=0.5)
        assert c.deaths() == [] and sorted(c.scheduler_info()["workers"]) == workers
        assert c.gather(held) == [1, 2, 3]              # from them, not recomputed: there is no other worker
        del held
        wait_until(lambda: len(c.deaths()) == 3, 120, "the three to leave once their results were released",
                   interval=0.5)
        assert all(d["cause"] == "retired" and not d["blame"] for d in c.deaths()), c.deaths()
        assert len(cl.jobs) == 3
