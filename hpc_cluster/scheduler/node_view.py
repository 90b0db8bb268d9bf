"""A job over several nodes, as the workers of one node see its accounting (issue 33, point 5).

With nodes= a SLURM job starts one worker set per node, each its own job step (JOB.0 on the
first node, JOB.1 ...), under --no-kill: a node that fails ends its own workers and the job
goes on without it. The job's state then says nothing about the workers that died (it still
RUNS) and everything about none of them; what a worker's death is judged on is its own node's
part: the node taken out of the job (SLURM resizes it: the adapter's `released_nodes`), its
own step's end, or, once the whole job ended, the job with only this node's steps.

Pure: accounting dicts in (an AccountingRecord as the job manager hands it over, with
`final`), the same shape out. A one-node job, or a worker whose host is not among the job's
nodes, gets the record unchanged.
"""

from __future__ import annotations

FINAL_STEP_STATES = frozenset({"completed", "failed", "timeout", "out-of-memory", "cancelled", "preempted",
                               "node-fail", "boot-fail", "deadline"})


def _short(name: str) -> str:
    return name.split(".", 1)[0]


def node_name(host: str, nodes: list[str]) -> str | None:
    """The batch system's name for `host` (what the worker's gethostname() said) among `nodes`:
    the same name, or the same short name (node12.cluster.org is node12)."""
    if host in nodes:
        return host
    return next((n for n in nodes if _short(n) == _short(host)), None)


def on_node(record: dict | None, host: str | None) -> dict | None:
    """`record` as the workers on `host` see it: see the module's docstring."""
    if not record or not host:
        return record
    released = list(record.get("released_nodes") or [])
    nodes = list(record.get("nodes") or []) + released
    if len(set(nodes)) <= 1:
        return record
    name = node_name(host, nodes)
    if name is None:
        return record
    steps = [s for s in record.get("steps") or [] if name in (s.get("nodes") or [])]
    rss = [s["max_rss"] for s in steps if s.get("max_rss") is not None]
    view = dict(record, steps=steps, max_rss=max(rss) if rss else None)
    if name in released:
        # Under --no-kill SLURM does not fail the job: it takes the dead node out and goes on.
        view.update(state="node-fail", final=True, node=name, exit_code=None, signal=None, cancelled_by=None,
                    raw_state=f"RESIZING: SLURM took the failed node {name} out of the job, which goes on on "
                              f"{record.get('node') or 'the others'}")
        return view
    if record.get("final"):
        return view                  # the whole job ended: its state is every node's (node: all of them)
    own = [s for s in steps if s.get("step_id") not in ("batch", "extern")]
    if own and own[-1].get("state") in FINAL_STEP_STATES:
        step = own[-1]
        view.update(state=step["state"], raw_state=f"{step.get('raw_state')} (step {step.get('step_id')}; the job "
                                                   f"goes on on its other nodes)",
                    exit_code=step.get("exit_code"), signal=step.get("signal"), cancelled_by=None, final=True,
                    node=name, elapsed=step.get("elapsed", record.get("elapsed")))
    return view
