"""Jobs the batch system queued but the cluster never heard of (issue 34), and how they are found.

With slurmctld paused (a failover, an overloaded controller), `sbatch` gives up after its
MessageTimeout ("Socket timed out on send/recv operation") while its request waits in the
controller's socket; the controller queues the job when it runs again. We counted that as a
failed submission and submitted again: the job nobody tracked ran its workers uncounted, `down`
neither listed nor cancelled it, and had the daemon died it would have run to its walltime.

So every job is tagged when submitted (SLURM: `--comment=hpc-cluster:<cluster id>:<index>`),
and:
- a submission whose answer was lost (a timeout, not a refusal) is *in doubt*: nothing more is
  submitted until a lookup of the cluster's tagged jobs in the queue has answered (adapter
  `tagged_jobs`); the doubted job found there is adopted into its pool, not submitted again.
  A doubt the queue does not show in two lookups is dropped (the request never arrived). The
  lookup runs even when nothing more is wanted: the doubted job's worker may have registered
  first (adopted, below), and the failed submission should still say where its job went;
- `down` (PoolManager.close) looks the cluster's tagged jobs up too and cancels every one;
- a worker registering from a job id no pool knows is adopted into its pool (pools.py), the
  backstop for a job the lookups missed.
Batch systems without `tagged_jobs` (or a submit without `tag`) keep the old behaviour.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re

from ...adapters.base import BatchError
from ...config.pools import DEFAULT_POOL

logger = logging.getLogger("hpc_cluster.jobs")

TAG = "hpc-cluster:"
LOOKUPS_BEFORE_GIVING_UP = 2   # lookups that must miss a doubted job before it counts as never queued

# A failed submission whose request may still have reached the batch system: its answer timed
# out or the connection broke after sending. A refusal (bad partition, over a limit) is not.
_ANSWER_LOST = re.compile(r"timed out|did not finish within|Connection reset|Communication failure|"
                          r"Broken pipe|Unable to contact", re.I)


def job_tag(cluster: str, index: int) -> str:
    """The tag of the cluster's job of workers' index `index` (ids are safe: launch.cluster_id)."""
    return f"{TAG}{cluster}:{index}"


def tag_index(comment: str, job_id: str) -> int | None:
    """The workers' index a tag names, for `job_id` (an array element's is the array's first
    index plus its own, `2013_4`); None when the tag carries none."""
    number = comment.rpartition(":")[2]
    if not number.isdigit():
        return None
    element = job_id.rpartition("_")[2] if "_" in job_id else ""
    return int(number) + (int(element) if element.isdigit() else 0)


def answer_lost(message: str) -> bool:
    return bool(_ANSWER_LOST.search(message or ""))


def accepts(method, keyword: str) -> bool:
    """Whether an adapter's `method` takes `keyword` (plugins' older adapters may not)."""
    try:
        return keyword in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


class Untracked:
    """The cluster's submissions in doubt and the lookups that settle them; one per cluster,
    shared by its pools' job managers (pools.py)."""

    def __init__(self, adapter, cluster: str | None, clock):
        self.adapter, self.cluster, self.clock = adapter, cluster, clock
        self.enabled = bool(cluster) and callable(getattr(adapter, "tagged_jobs", None)) \
            and accepts(adapter.submit, "tag")
        self.doubts: dict[int, dict] = {}        # index -> {"pool", "error" (jobs.SubmitError), "missed"}
        self._lock = asyncio.Lock()

    @property
    def prefix(self) -> str:
        return f"{TAG}{self.cluster}:"

    def submit_kwargs(self, index: int) -> dict:
        return {"tag": job_tag(self.cluster, index)} if self.enabled else {}

    def doubt(self, index: int, pool: str, error) -> bool:
        """A submission of `index` failed with `error` (jobs.SubmitError): in doubt if its answer
        may have been lost. True when it is."""
        if not self.enabled or not answer_lost(error.message):
            return False
        self.doubts[index] = {"pool": pool, "error": error, "missed": 0}
        logger.warning("the answer to submitting the job of workers' index %d was lost (%s); the queue is "
                       "looked up for it (its comment %s) before anything more is submitted", index,
                       error.message, job_tag(self.cluster, index))
        return True

    def mine(self, manager) -> bool:
        """Whether a submission of `manager`'s pool is in doubt."""
        return any(d["pool"] == manager.pool for d in self.doubts.values())

    async def settle(self, managers: dict) -> bool:
        """Before a submission: True when no submission is in doubt (any more). Else looks the
        cluster's jobs up, adopts those found, and drops doubts missed by enough lookups; False
        while a doubt remains or the lookup failed (the controller may still be away)."""
        if not self.doubts:
            return True
        async with self._lock:
            if not self.doubts:
                return True
            try:
                await self.find(managers)
            except BatchError as exc:
                logger.warning("could not look up the cluster's jobs (%s); submitting nothing until it answers",
                               exc)
                return False
            for index, doubt in list(self.doubts.items()):
                doubt["missed"] += 1
                if doubt["missed"] >= LOOKUPS_BEFORE_GIVING_UP:
                    del self.doubts[index]
                    logger.info("the job of workers' index %d is not in the queue after %d lookups: its "
                                "submission never arrived; submitting again", index, doubt["missed"])
            return not self.doubts

    async def find(self, managers: dict) -> list[str]:
        """Adopt every tagged job of the cluster in the queue that no pool knows (into the pool
        that submitted it, else the default pool); their ids. BatchError when the lookup failed."""
        if not self.enabled:
            return []
        listed = await asyncio.to_thread(self.adapter.tagged_jobs, self.prefix)
        known = {jid for m in managers.values() for jid in m.jobs}
        adopted = []
        for job_id, (status, comment) in sorted(listed.items()):
            index = tag_index(comment, job_id)
            doubt = self.doubts.pop(index, None) if index is not None else None
            if job_id in known:
                # Adopted already: its worker registered before this lookup (pools.py). The failed
                # submission still says where its job went.
                if doubt:
                    doubt["error"].message += f" (the answer was lost; the job was queued anyway: job {job_id}, " \
                                              "adopted when its worker registered)"
                continue
            pool = doubt["pool"] if doubt else DEFAULT_POOL
            manager = managers.get(pool) or managers[DEFAULT_POOL]
            now = self.clock()
            running = status.state == "running"
            job = manager.adopt(job_id, {"state": status.state, "index": index or 0, "submitted": now,
                                         "started": now - (status.elapsed or 0) if running else None})
            job.raw_state, job.node, job.reason, job.ran = status.raw_state, status.node, status.reason, running
            if doubt:
                doubt["error"].message += f" (the answer was lost; the job was queued anyway: job {job_id}, adopted)"
            logger.warning("job %s (%s, %s) is the cluster's but was not tracked%s: adopted into pool %s",
                           job_id, comment, status.raw_state,
                           " (its submission's answer was lost)" if doubt else "", manager.pool)
            manager.poke()
            adopted.append(job_id)
        return adopted
