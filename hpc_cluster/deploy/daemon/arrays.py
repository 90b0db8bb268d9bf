"""Job arrays (the site's `job_array: true`, issue 18 point 5): a scale-up of k jobs as one
submission, where the batch system has arrays (an adapter's `supports_arrays`).

Only the submission is shared. Each element is a job of its own to the job manager: its own
id as the batch system prints it (`2013_4`, `123[4].server`, `123.4`), its own index and so
its own worker names (NAME-<first index + element index>, computed inside the job from the
batch system's array variable), and it is polled, cancelled, accounted and diagnosed alone.
So nothing in the job manager but `_submit` knows arrays exist. This lives apart from
deploy/daemon/jobs.py because that module is near its size limit and its polling changes on its own.
"""

from __future__ import annotations

import asyncio
import logging

from ...adapters.base import BatchError

logger = logging.getLogger("hpc_cluster.jobs")


def use_array(manager, n: int) -> bool:
    """Whether `manager` (a JobManager) submits its next `n` jobs as one array: the site asked
    for arrays, there are at least two jobs, and the adapter can. When it cannot, say so
    once per job manager (the site's setting is not silently ignored) and submit n jobs."""
    spec, adapter = manager.spec, manager.adapter
    if not spec.job_array or n < 2:
        return False
    if not adapter.supports_arrays:
        _note_once(manager, f"job_array: true, but the {adapter.name} adapter cannot submit job arrays: "
                            "submitting its jobs one by one (remove job_array from the site to silence this)")
        return False
    variable = adapter.array_index_variable
    if spec.template and variable and variable not in adapter.render(spec.replace(array_size=n)):
        # A site's own template that never reads the element's index would give every element
        # the same worker names: refuse the array for it, not the names.
        _note_once(manager, f"job_array: true, but template={spec.template!r} never reads ${variable}, so "
                            f"every element of an array would start workers of the same name: submitting "
                            f"jobs one by one. Compute HPC_CLUSTER_WORKER_INDEX and HPC_CLUSTER_JOB_ID from "
                            f"it as the built-in {adapter.template_name} does to use arrays")
        return False
    return True


def _note_once(manager, message: str) -> None:
    if getattr(manager, "_array_note", None) != message:
        manager._array_note = message
        logger.warning(message)


def take_indices(manager, n: int) -> list[int]:
    """n consecutive job indices (no await between them, so no other submission interleaves)."""
    if manager.pools:
        return [manager.pools.next_index() for _ in range(n)]
    return list(range(manager._next_index, manager._next_index + n))


async def submit_array(manager, n: int, job_class) -> None:
    """One array of `n` elements; each element becomes a `job_class` (jobs.Job) in manager.jobs."""
    indices = take_indices(manager, n)
    adapter = manager.adapter
    script = adapter.render(manager.spec.replace(worker_index=indices[0], array_size=n))
    try:
        array_id = await asyncio.to_thread(adapter.submit, script)
        ids = adapter.array_element_ids(array_id, n)
    except BatchError as exc:
        manager.submit_failed(exc)
        return
    manager._next_index = indices[-1] + 1
    now = manager.clock()
    for job_id, index in zip(ids, indices):
        manager.jobs[job_id] = job_class(job_id, now, index=index)
    logger.info("submitted array %s of pool %s: %d jobs %s .. %s (workers' index %d-%d)",
                array_id, manager.pool, n, ids[0], ids[-1], indices[0], indices[-1])
    manager.poke()                       # the queue shows them soon: poll fast (deploy/daemon/polling.py)
