"""adapt() on the real SLURM cluster: grows with queued work, drains back down without losing results."""

from __future__ import annotations

import time
import uuid

import pytest

from hpc_cluster import Client, SLURMCluster

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
        # Held results and a shrink to no worker at all: they have nowhere to go, are recomputed
        # from lineage, and adapt grows back (a known limitation, docs/user-guide.md); so this
        # test, about shrinking when idle, lets go of what it has checked first. With them held,
        # whether it reached 0 depended on how the three drains interleaved (CI failed on it).
        del futures, kept
        deadline = time.time() + 120
        while time.time() < deadline and _running_jobs(cl) > 0:
            time.sleep(0.5)
        assert _running_jobs(cl) == 0, "adapt did not scale down when idle"
        assert all(d["cause"] == "retired" and not d["blame"] for d in c.deaths())
        table = cl.status_table()
        assert table["adaptive"] == [0, 3]
