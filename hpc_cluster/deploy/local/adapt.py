"""LocalCluster.adapt(): as many workers as the queued work needs, between bounds, as
distributed's Adaptive sizes its LocalCluster and our batch clusters size their jobs (the same
rules as deploy/daemon/policy.py, for worker processes instead of jobs).

A thread of the cluster's owner decides every `interval`. It asks the scheduler for its
workload (expected seconds of queued, waiting and running work, from learned task durations:
placement.workload) and its workers, and wants enough workers to finish the work in about
`target_duration`, each running `threads_per_worker` tasks at once, within minimum and
maximum. Up at once; down only after `wait_count` decisions in a row agree (no start/stop
churn), as far as each of them wanted, and gracefully: a started worker that has not registered yet is stopped at once
(nothing to lose), a registered one is drained by the scheduler (its unstarted tasks handed
back, results only it holds copied to a peer), then retired, and its process ends.

While any worker holds results, at least one worker stays: shrinking to none would lose them
to recomputation (distributed's Adaptive likewise keeps workers for the data held).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from dataclasses import dataclass

from ...protocol.messages import Op
from ...units import parse_memory

logger = logging.getLogger("hpc_cluster.deploy")

# A retired worker's process still running this long after the scheduler let it go is stopped.
STRAGGLER_GRACE = 30.0


@dataclass(frozen=True)
class AdaptSettings:
    """adapt()'s settings, with distributed's meanings and defaults."""

    minimum: int = 0
    maximum: float = math.inf
    interval: float = 1.0              # seconds between decisions
    wait_count: int = 3                # decisions in a row that must agree before shrinking
    target_duration: float = 5.0       # finish the queued work in about this many seconds


def wanted_workers(settings: AdaptSettings, workload: float, threads_per_worker: int, holding: bool) -> int:
    """Workers to finish `workload` seconds of work in about target_duration, within the bounds;
    at least one while results are held (`holding`)."""
    want = math.ceil(workload / (settings.target_duration * max(1, threads_per_worker)))
    if holding:
        want = max(want, 1)
    return int(min(settings.maximum, max(settings.minimum, want)))


def least_busy(rows: list[dict], count: int) -> list[dict]:
    """The `count` workers to retire: fewest tasks, then fewest results to copy away."""
    return sorted(rows, key=lambda r: (r.get("processing", 0), r.get("stored", 0), str(r.get("name"))))[:count]


def _seconds(value, what: str) -> float:
    from dask.utils import parse_timedelta
    try:
        seconds = parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or seconds < 0:
        raise ValueError(f"adapt({what}={value!r}): give seconds (2, 0.5) or a duration string ('1s', '500ms')")
    return float(seconds)


def adapt_settings(cluster, Adaptive=None, minimum: float = 0, maximum: float = math.inf,
                   minimum_cores: int | None = None, maximum_cores: int | None = None,
                   minimum_memory=None, maximum_memory=None, interval="1s", wait_count: int = 3,
                   target_duration="5s", **unknown) -> AdaptSettings:
    """LocalCluster.adapt()'s keywords (distributed's SpecCluster.adapt and Adaptive's) as
    settings: cores and memory bounds counted in workers of the cluster's size."""
    if Adaptive is not None:
        raise TypeError("LocalCluster.adapt(Adaptive=...): our LocalCluster adapts with its own policy (no "
                        "Adaptive class); drop Adaptive= and set minimum, maximum, interval, wait_count, "
                        "target_duration")
    if unknown:
        raise TypeError(f"LocalCluster.adapt() got {', '.join(map(repr, sorted(unknown)))}; it takes minimum, "
                        "maximum, minimum_cores, maximum_cores, minimum_memory, maximum_memory, interval, "
                        "wait_count, target_duration")
    threads, memory = cluster.threads_per_worker, cluster.memory_limit
    lo, hi = minimum or 0, math.inf if maximum is None else maximum
    if minimum_cores is not None:
        lo = max(lo, math.ceil(minimum_cores / threads))
    if maximum_cores is not None:
        hi = min(hi, math.floor(maximum_cores / threads))
    for value, what in ((minimum_memory, "minimum_memory"), (maximum_memory, "maximum_memory")):
        if value is not None and not memory:
            raise ValueError(f"adapt({what}=...): the cluster's workers have no memory_limit to count it in; "
                             "give minimum/maximum workers instead")
    if minimum_memory is not None:
        lo = max(lo, math.ceil(parse_memory(minimum_memory, "minimum_memory") / memory))
    if maximum_memory is not None:
        hi = min(hi, math.floor(parse_memory(maximum_memory, "maximum_memory") / memory))
    if lo < 0 or hi < lo:
        raise ValueError(f"adapt(): the bounds give minimum {lo} and maximum {hi} workers; need "
                         "0 <= minimum <= maximum")
    if isinstance(wait_count, bool) or not isinstance(wait_count, int) or wait_count < 1:
        raise ValueError(f"adapt(wait_count={wait_count!r}): give a whole number of decisions, 1 or more")
    return AdaptSettings(int(lo), hi if hi == math.inf else int(hi), max(0.05, _seconds(interval, "interval")),
                         wait_count, max(0.001, _seconds(target_duration, "target_duration")))


class LocalAdaptive:
    """What adapt() started: its settings (minimum, maximum, interval, wait_count,
    target_duration), `state` ("running", "stopped"), `log` (its latest decisions, as
    distributed's Adaptive.log) and `stop()`. The cluster keeps the workers it has then."""

    def __init__(self, cluster, settings: AdaptSettings):
        self.cluster, self.settings = cluster, settings
        self.minimum, self.maximum = settings.minimum, settings.maximum
        self.interval, self.wait_count, self.target_duration = (settings.interval, settings.wait_count,
                                                                 settings.target_duration)
        self.log: collections.deque = collections.deque(maxlen=100)
        self.state = "running"
        self._lower = 0                                   # decisions in a row that wanted fewer
        self._lower_most = 0                              # the most workers one of them wanted
        self._retiring: dict[str, float | None] = {}      # name -> when the scheduler let it go
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpc-local-adapt", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop adapting; returns once the decision under way (if any) is carried out."""
        if self.state == "stopped":
            return
        self.state = "stopped"
        self._stopping.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.cluster.timeout + 15)

    def __repr__(self) -> str:
        return f"<LocalAdaptive minimum={self.minimum} maximum={self.maximum} {self.state}>"

    def _run(self) -> None:
        client = None
        try:
            while not self._stopping.is_set():
                try:
                    if client is None:
                        from ...client.client import Client
                        client = Client(self.cluster, timeout=self.cluster.timeout, set_as_default=False, reconnect=0)
                    self.adapt_once(client)
                except Exception:
                    logger.warning("adapt: could not resize the cluster; trying again", exc_info=True)
                    if client is not None:
                        client.close()
                        client = None
                self._stopping.wait(self.interval)
        finally:
            if client is not None:
                client.close()

    def adapt_once(self, client) -> None:
        """One decision: ask the scheduler, then start or retire workers."""
        reply = client._lt.run(client._request({"op": Op.WORKLOAD}), client.timeout)
        workers = self.cluster.workers
        ours = {r["name"]: r for r in reply["workers"] if r.get("name") in workers}
        self._reap(ours)
        live = [n for n, p in list(workers.items()) if p.poll() is None and n not in self._retiring]
        holding = any(r.get("stored") for r in reply["workers"])
        target = wanted_workers(self.settings, reply["workload"], self.cluster.threads_per_worker, holding)
        if target > len(live):
            self._lower = 0
            for _ in range(target - len(live)):
                if self._stopping.is_set():
                    return
                self.cluster._start_worker()
            self.log.append((time.time(), {"status": "up", "n": target}))
        elif target < len(live):
            # Down only as far as every agreeing decision wanted, as the batch clusters' policy
            # (deploy/daemon/policy.py): 1, 1 then 0 keeps one worker for the work coming next.
            self._lower_most = max(target, self._lower_most) if self._lower else target
            self._lower += 1
            if self._lower >= self.wait_count:
                self._lower, target = 0, self._lower_most
                self._shrink(client, live, ours, len(live) - target)
                self.log.append((time.time(), {"status": "down", "n": target}))
        else:
            self._lower = 0

    def _shrink(self, client, live: list[str], ours: dict[str, dict], count: int) -> None:
        starting = [n for n in live if n not in ours][:count]
        for name in starting:                             # not registered yet: nothing to lose
            self.cluster._stop_worker(name)
        chosen = least_busy([ours[n] for n in live if n in ours], count - len(starting))
        if chosen:
            for row in chosen:
                self._retiring[row["name"]] = None
            client._send({"op": Op.DRAIN_WORKERS, "workers": [r["address"] for r in chosen], "intent": "adapt"})

    def _reap(self, ours: dict[str, dict]) -> None:
        """Retiring workers whose process ended leave the cluster; one still running well after
        the scheduler let it go is stopped."""
        now = time.monotonic()
        for name, gone_at in list(self._retiring.items()):
            proc = self.cluster.workers.get(name)
            if proc is None or proc.poll() is not None:
                self.cluster.workers.pop(name, None)
                del self._retiring[name]
            elif name not in ours:
                if gone_at is None:
                    self._retiring[name] = now
                elif now - gone_at > STRAGGLER_GRACE:
                    logger.warning("adapt: worker %s was retired but its process goes on; stopping it", name)
                    self.cluster._stop_worker(name)
                    del self._retiring[name]
