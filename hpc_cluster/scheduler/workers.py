"""What the scheduler says about its workers: the table clients read, and how often the
workers should beat for the cluster's size. Split from server.py, which serves them."""

from __future__ import annotations

from .state.placement import worker_pool


def heartbeat_interval(workers: int) -> float:
    """The least interval between a worker's heartbeats with this many workers: dask's rule
    (distributed's heartbeat_interval), so that the scheduler reads at most about 200
    heartbeats a second however large the cluster: 0.5 s up to 10 workers, 1 s under 50, 2 s
    under 200, then workers/200 + 1 s (3.5 s at 500). A worker beats at this or at its own
    --heartbeat-interval, the longer."""
    if workers <= 10:
        return 0.5
    if workers < 50:
        return 1.0
    if workers < 200:
        return 2.0
    return workers / 200 + 1.0


ANNOUNCE_STEP = 1.25      # the rule's interval must move by more than this factor to be announced


def paced_interval(announced: float, workers: int) -> float | None:
    """The heartbeat interval to tell every worker now that the cluster has `workers`, or None
    to keep the `announced` one. Above 200 workers the rule's interval changes with every worker
    that joins or leaves; announcing each change to every worker cost ~480,000 messages while
    1,000 workers registered (one to all at each of the last 800). Only a move of more than a
    quarter is announced: a handful of rounds, and the workers beat within 25% of the rule."""
    interval = heartbeat_interval(workers)
    if announced / ANNOUNCE_STEP < interval < announced * ANNOUNCE_STEP:
        return None
    return interval


def worker_table(state) -> list[dict]:
    """A row per worker, as clients see it (scheduler_info()["workers"], `status`)."""
    return [{"address": ws.address, "name": ws.name, "id": ws.name, "nthreads": ws.nthreads,
             "memory_limit": ws.memory_limit, "resources": ws.resources,
             "processing": len(ws.processing), "executing": len(ws.executing),
             "stored": len(ws.has_what), "joined": ws.joined, "last_seen": ws.last_seen, **ws.info,
             "pool": worker_pool(ws),
             "reserved_memory": ws.used_memory,
             "status": "paused" if ws.paused else "running", "memory": dict(ws.memory),
             # dask's names for the same numbers (scheduler_info()["workers"][addr]["metrics"])
             "metrics": {"memory": ws.memory.get("rss", 0), "managed_bytes": ws.memory.get("managed", 0),
                         "spilled_bytes": {"memory": ws.memory.get("spilled", 0),
                                           "disk": ws.memory.get("spilled_disk", 0)}}}
            for ws in state.workers.values()]
