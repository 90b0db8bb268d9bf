"""Many light workers at once (issue 19, point 3): correctness at a scale the suite can
afford, 30 one-thread workers without a nanny. Speed at 100-500 workers is measured by
benchmarks/many_workers.py, never asserted here."""

import os
import statistics
import time

from hpc_cluster import Client, LocalCluster
from helpers.wait import wait_until

N = 30


def slow_pid(x):
    time.sleep(0.3)            # long enough that no worker takes a second one before all took one
    return os.getpid()


def test_thirty_light_workers_all_run_tasks_and_the_scheduler_answers_a_client():
    with LocalCluster(n_workers=N, threads_per_worker=1, nanny=False, memory_limit=None,
                      dashboard_address=None, timeout=120) as cluster, Client(cluster, timeout=120) as client:
        client.wait_for_workers(N, timeout=120)
        workers = client.scheduler_info()["workers"]          # a round trip with all of them in it
        assert len(workers) == N
        pids = {w["pid"] for w in workers.values()}
        assert len(pids) == N
        # Tasks without inputs go one per free thread (root-task queuing): the first N land on
        # N different workers; the rest follow as threads free up.
        got = client.gather(client.map(slow_pid, range(2 * N)))
        assert set(got) == pids
        assert client.submit(sum, [1, 2, 3]).result(timeout=60) == 6      # and it still answers
        # 30 workers beat every second, not every 0.5 s (scheduler/server.py heartbeat_interval):
        # the gaps between the times each idle worker was last heard from.
        seen: dict[str, list[float]] = {}

        def gaps_seen():
            for addr, w in client.scheduler_info()["workers"].items():
                times = seen.setdefault(addr, [])
                if not times or w["last_seen"] != times[-1]:
                    times.append(w["last_seen"])
            return sum(len(t) - 2 for t in seen.values() if len(t) > 2) >= 3 * N
        wait_until(gaps_seen, 60, "three heartbeats of every worker", interval=0.1)
        gaps = [b - a for t in seen.values() for a, b in zip(t[1:], t[2:])]
        assert statistics.median(gaps) > 0.9, sorted(gaps)
