"""What the scheduler tells a client about itself (issue 31, point 10): distributed's
`Scheduler.identity()`, which `client.scheduler_info()` returns, and the sizes of the results it
knows (`client.nbytes()`). Plain reads of the state; the client shapes them as distributed's
(client/identity.py)."""

from __future__ import annotations

from ..protocol.messages import Op
from .workers import worker_table

OPS = frozenset({Op.IDENTITY, Op.NBYTES})


def answer(sched, op: str, msg: dict):
    """The reply to one of OPS."""
    if op == Op.IDENTITY:
        return identity(sched)
    return nbytes(sched.state, msg.get("keys"))


def identity(sched) -> dict:
    """distributed's identity: what, where, since when, and the workers (a row each, as
    scheduler_info()["workers"] holds them) with their totals."""
    rows = worker_table(sched.state)
    return {"type": "Scheduler", "address": sched.address, "services": dict(sched.services),
            "started": sched.started, "n_workers": len(rows),
            "total_threads": sum(r["nthreads"] or 0 for r in rows),
            "total_memory": sum(r["memory_limit"] or 0 for r in rows), "workers": rows}


def nbytes(state, keys) -> dict[str, int]:
    """Bytes of each result held in memory (of `keys`, if given: those it knows)."""
    if keys is None:
        return {k: ts.nbytes for k, ts in state.tasks.items() if ts.state == "memory"}
    tasks = (state.tasks.get(k) for k in keys if isinstance(k, str))
    return {ts.key: ts.nbytes for ts in tasks if ts is not None and ts.state == "memory"}
