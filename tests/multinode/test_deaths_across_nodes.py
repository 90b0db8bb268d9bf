"""Every staged death again, with the workers spread over the nodes of the multi-node SLURM
(issue 33, point 3): the scenario table of tests/batch/slurm/scenarios.py (memory-batch,
memory-nanny, crash, walltime, cancelled, preempted, startup), with and without a nanny where the
one-node table has both, run side by side in threads. Each scenario must end as it does on one
node (cause, blame, the key evidence, every other result right, no job left), and besides:

- the deaths happened on at least 3 nodes (CR_LLN spreads the jobs), and
- each death's accounting line names the node its worker ran on (the host the worker
  registered from, or for a job that never started its worker, the node sacct gave it).

Cluster files and job logs live in the shared directory (pytest's tmp_path is under /tmp,
node-local here: a worker on hpcn2 could not read its cluster file there).

    python -m pytest -p no:cacheprovider tests/multinode/test_deaths_across_nodes.py -v
    HPC_SCENARIO_REPORT=/tmp/deaths.json ... also writes every outcome as JSON
"""

from __future__ import annotations

import json
import os
import re
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

import scenarios as S
from helpers import multinode as MN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# The preempted worker's job and its preemptor each ask for 2000 of a node's 3000 MB: the
# preemptor, sent to the worker's node, can start only by preempting it, and fits once it is
# gone whatever else runs there (while the worker's job runs, the rest have 1000 MB). The
# one-node table's 20 GB jobs fit no node here.
def preempted_on_its_node(nanny: bool, log_dir) -> dict:
    return S.preempt_busy_worker(nanny, log_dir, memory_mb=2000, on_its_node=True)


def walltime_certain(nanny: bool, log_dir) -> dict:
    """scenarios.walltime with its 50 s task started 41 s into a job, not 38: it then outlasts
    SLURM's latest kill of a 1-minute job (90 s). Started at 38 s, it once ended at 88 s,
    before a kill at 89 s: no walltime death (the one-node table's race too, seldom lost there)."""
    return S.walltime(nanny, log_dir, long_at=41)


TABLE = {
    "walltime": (walltime_certain, (True, False)),     # the long pole (~100-150 s): first in
    "memory-batch": (S.batch_oom, (True, False)),
    "memory-nanny": (S.nanny_memory, (True,)),
    "segfault": (S.segfault_task, (True, False)),
    "scancel": (S.scancel, (True, False)),
    "preempted": (preempted_on_its_node, (True, False)),
    "startup": (S.startup, (True, False)),
}


@pytest.fixture(scope="module")
def outcomes():
    base = MN.SHARED / "tests" / f"deaths-{uuid.uuid4().hex[:8]}"
    with S.own_config(base):
        runs = {}
        # All at once: each scenario mostly waits (on SLURM, a verdict, a time limit).
        with ThreadPoolExecutor(sum(len(v) for _, v in TABLE.values())) as pool:
            for name, (fn, variants) in TABLE.items():
                for nanny in variants:
                    runs[(name, nanny)] = pool.submit(S.safely, fn, nanny, base / "logs")
        out = {k: f.result() for k, f in runs.items()}
    if os.environ.get("HPC_SCENARIO_REPORT"):
        with open(os.environ["HPC_SCENARIO_REPORT"], "w") as f:
            json.dump([dict(o, key=list(k)) for k, o in out.items()], f, indent=1, default=str)
    return out


outcome, all_correct, innocent = S.outcome, S.all_correct, S.innocent
BOTH = pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])


def accounting_node(death: dict) -> str | None:
    """The node sacct named on the death's accounting line."""
    return next((m.group(1) for e in death["evidence"] if e.startswith("accounting:")
                 for m in [re.search(r", node (\S+?)[,; ]", e + " ")] if m), None)


def on_its_node(death: dict) -> str:
    """The death's node, after checking that its accounting line names the node its worker ran on."""
    node = accounting_node(death)
    assert node and re.fullmatch(r"hpcn\d+", node), death["evidence"]
    if death["worker"] is not None:             # a job that never started its worker has no host
        assert death.get("host") == node, (death.get("host"), death["evidence"])
    return node


@BOTH
def test_walltime(outcomes, nanny):
    o = outcome(outcomes, "walltime", nanny)
    causes = [(d["cause"], d["text"]) for d in o["deaths"]]
    assert {c for c, _ in causes} <= {"walltime", "retired"}, causes
    assert (o["cause"], o["blame"]) == ("walltime", False), causes
    assert o["death"]["executing"] == ["long-50s"] and not o["charged_any"]
    assert o["long"] == {"value": 42}, o["long"]
    all_correct(o)
    assert any("TIMEOUT" in e for e in o["death"]["evidence"]), o["death"]["evidence"]
    on_its_node(o["death"])


@BOTH
def test_memory_batch(outcomes, nanny):
    o = outcome(outcomes, "memory-batch", nanny)
    assert (o["cause"], o["blame"]) == ("memory-batch", True), o["death"]["text"]
    err = o["error"]
    assert err["error"] == "TaskMemoryError" and err["cause"] == "memory-batch"
    assert any("OUT_OF_MEMORY" in e or "oom-kill" in e or "cgroup OOM" in e for e in err["evidence"]), err
    all_correct(o)
    on_its_node(o["death"])


def test_memory_nanny(outcomes):
    o = outcome(outcomes, "memory-nanny", True)
    assert (o["cause"], o["blame"]) == ("memory-nanny", True), o["death"]["text"]
    assert o["error"]["error"] == "TaskMemoryError"
    assert "the nanny stopped the worker while running 'hog-800MB'" in o["death"]["text"]
    all_correct(o)
    on_its_node(o["death"])


@BOTH
def test_segfault(outcomes, nanny):
    o = outcome(outcomes, "segfault", nanny)
    assert (o["cause"], o["blame"]) == ("crash", True), o["death"]["text"]
    assert o["error"]["error"] == "TaskCrashedError" and "SIGSEGV" in o["death"]["text"]
    assert any("crashed in string_at (ctypes/__init__.py:" in e for e in o["death"]["evidence"]), o["death"]["evidence"]
    all_correct(o)
    on_its_node(o["death"])


@BOTH
def test_scancel(outcomes, nanny):
    o = outcome(outcomes, "scancel", nanny)
    innocent(o, "cancelled")
    assert f"job {o['killed_job']} was cancelled by uid {os.getuid()}" in o["death"]["text"]
    on_its_node(o["death"])


@BOTH
def test_preempted(outcomes, nanny):
    o = outcome(outcomes, "preempted", nanny)
    innocent(o, "preempted")
    assert any("PREEMPTED" in e for e in o["death"]["evidence"]), o["death"]["evidence"]
    on_its_node(o["death"])


@BOTH
def test_startup(outcomes, nanny):
    o = outcome(outcomes, "startup", nanny)
    assert (o["cause"], o["blame"]) == ("startup", False)
    assert len(o["startup_deaths"]) == 3 and o["jobs_at_halt"] == o["jobs_later"] == 3
    tail = "\n".join(o["death"]["log_tail"])
    assert ("/nonexistent/python" in tail) if nanny else ("module" in tail), tail
    for d in o["startup_deaths"]:
        on_its_node(d)


def test_the_deaths_happened_on_several_nodes(outcomes):
    nodes = {}
    for (name, nanny), o in outcomes.items():
        for d in [o.get("death")] + o.get("startup_deaths", []):
            if d:
                nodes.setdefault(accounting_node(d), set()).add(f"{name}-{'nanny' if nanny else 'bare'}")
    # ~20 jobs over 4+ idle nodes (CR_LLN: least loaded first) land on all of them; 3 leaves room
    # for nodes other modules' jobs still fill.
    assert len(set(nodes) - {None}) >= 3, nodes
