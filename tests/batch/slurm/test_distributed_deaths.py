"""Why did my worker die, on engine="distributed" (issue 32, points 3 and 4): the staged deaths
of scenarios.py, each run with distributed's scheduler and workers under our nanny and jobs,
the user's client `distributed.Client(cluster)`.

Each death must be explained as on our engine (test_scenarios.py asserts the same facts there):
its cause, evidence (the nanny's exit status and peak memory, cgroup OOM, sacct's accounting,
the log tail) and advice, read through `hpc_cluster.Client(cluster_file=...).deaths()` and
`hpc-cluster why KEY NAME`. Only memory and crash deaths charge, and only the tasks the nanny saw
executing (not those queued behind them on the same worker); after allowed_failures + 1 final
verdicts, `future.result()` raises one exception that is distributed's KilledWorker and our
TaskMemoryError / TaskCrashedError, its text the cause, the evidence and the fix. Innocent deaths
(scancel, preemption, node failure) never fail a task: its result still arrives.

Not here: scenarios.walltime. On this engine the walltime drain is distributed's retirement,
which closes the worker with its executing task 12 s before the limit, so a 50 s task in
1-minute jobs is cut at every attempt, never fails and never finishes (the walltime drain's
tests own that).

The scenarios run side by side in threads (preemption's two runs, one after the other, take
~80 s); scripts/test runs this module with the clock-bound tests (where preemption's 20 GB jobs
are staged one at a time), and its node failure last and alone (marker node_down).

    python -m pytest -m slurm tests/batch/slurm/test_distributed_deaths.py -v
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import distributed
import pytest

import scenarios as S
from helpers.scenarios import VERDICT_TIMEOUT
from hpc_cluster import TaskCrashedError, TaskMemoryError

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(1800)]

PARALLEL = 6
ENGINE = "distributed"
NANNY, BOTH = (True,), (True, False)
# The scenarios' variants on this engine. Without a nanny, what a dead worker was executing is
# its last heartbeat's list (bridge.py): staged for a memory death and the innocent ones.
RUNS = {
    "memory-batch": (S.batch_oom, BOTH),
    "memory-nanny": (S.nanny_memory, NANNY),
    "segfault": (S.segfault_task, NANNY),
    "exit1": (S.exit_task, NANNY),
    "scancel": (S.scancel, BOTH),
    "startup": (S.startup, NANNY),
}


def crash_twice(nanny: bool, log_dir: Path) -> dict:
    """allowed_failures=1: a task that crashes its worker two seconds after it starts fails after
    two final verdicts, not one; the tasks queued behind it on the same worker (distributed's
    `processing-tasks` at each removal) are not charged and all finish."""
    with S.on_slurm("crash-twice", nanny, log_dir, jobs=1, allowed_failures=1) as run:
        user = run.client.user
        bad = run.client.submit(S.segfault_after, 2.0, key="crash-twice-task")
        normal = run.client.map(S.slow_inc, range(20), delay=0.1)
        exc = bad.exception(timeout=VERDICT_TIMEOUT)
        o = run.outcome
        o.update(error_type=type(exc).__name__, error_text=str(exc),
                 is_theirs=isinstance(exc, distributed.KilledWorker), is_ours=isinstance(exc, TaskCrashedError),
                 attempts=len(getattr(exc, "attempts", None) or []))
        o["deaths"] = [run.death(lambda d, i=i: d["id"] == i) for i in range(len(run.client.deaths()))]
        o["queued_at_death"] = []
        for d in o["deaths"]:
            events = user.get_events(d["worker"])
            gone = [m for _, m in events if isinstance(m, dict) and m.get("action") == "remove-worker"]
            o["queued_at_death"].append(sorted(set().union(*(set(m["processing-tasks"]) for m in gone))
                                               - {"crash-twice-task"}))
        o["wrong"] = S.wrong_results(normal, [x + 1 for x in range(20)])
        o["why"] = run.client.why(bad)
        run.record(o["deaths"][0])
        run.jobs()
        return o


@pytest.fixture(scope="module")
def outcomes(slurm_cluster, tmp_path_factory):
    base = tmp_path_factory.mktemp("distributed-deaths")
    with S.own_config(base):
        logs = base / "logs"
        runs = {}
        with ThreadPoolExecutor(PARALLEL) as pool:
            runs["preempted"] = pool.submit(S.safely, S.with_engine(ENGINE, S.preempted), logs)
            runs[("crash-twice", True)] = pool.submit(S.safely, S.with_engine(ENGINE, crash_twice), True, logs)
            for name, (fn, variants) in RUNS.items():
                for nanny in variants:
                    runs[(name, nanny)] = pool.submit(S.safely, S.with_engine(ENGINE, fn), nanny, logs)
        out = {k: f.result() for k, f in runs.items()}
    got = out.pop("preempted")
    for o, nanny in zip(got if isinstance(got, list) else [got, got], (True, False)):
        out[("preempted", nanny)] = o
    report = {f"{k[0]}-{'nanny' if k[1] else 'bare'}": (o.get("to_final"), o.get("wall")) for k, o in out.items()}
    print("\ndistributed engine: seconds from death to final verdict, and each scenario's wall time:", report)
    return out


outcome, all_correct, innocent = S.outcome, S.all_correct, S.innocent
ON = pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])


def killed_worker_text(o, kind):
    """The user's exception: our class (named), with the cause, the evidence and the fix."""
    err = o["error"]
    assert err["error"] == kind, err
    assert "Cause: " in err["message"] and "Evidence:" in err["message"] and "Fix: " in err["message"], err
    assert "Inspecting worker logs" not in err["message"] and "worker logs" not in err["message"].lower()


def test_memory_over_the_job_limit_is_memory_batch(outcomes):
    o = outcome(outcomes, "memory-batch", True)
    assert (o["cause"], o["blame"]) == ("memory-batch", True), o["death"]["text"]
    assert o["death"]["executing"] == ["hog-1GB"]          # the nanny's list: not the queued ones
    killed_worker_text(o, "TaskMemoryError")
    err = o["error"]
    assert err["cause"] == "memory-batch" and "raise memory=" in err["advice"]
    assert any("cgroup OOM" in e or "oom-kill" in e or "OUT_OF_MEMORY" in e for e in err["evidence"]), err
    # The nanny's report (signal, peak RSS); unless the kernel killed the nanny too: a second
    # cgroup OOM, the nanny's own allocation a few ms after the first kill, before the worker's
    # memory was uncharged (nanny.prefer_as_oom_victim). Then the job itself ended OUT_OF_MEMORY,
    # accounting says so, and no report can come.
    ev = o["death"]["evidence"]
    assert any(e.startswith("nanny: ") and "peak RSS" in e for e in ev) \
        or any(re.match(r"accounting: job \S+ OUT_OF_MEMORY ", e) for e in ev), ev
    assert any(e.startswith("accounting: ") for e in ev), ev
    assert "'hog-1GB'" in o["death"]["text"]
    all_correct(o)                       # the 20 tasks queued behind the hog all finish
    assert "memory-batch" in o["why"] and "hog-1GB" in o["why"]


def test_memory_over_the_job_limit_without_a_nanny(outcomes):
    """No nanny: the job itself ends OUT_OF_MEMORY; the task its last heartbeat named is charged."""
    o = outcome(outcomes, "memory-batch", False)
    assert (o["cause"], o["blame"]) == ("memory-batch", True), o["death"]["text"]
    assert o["death"]["executing"] == ["hog-1GB"]
    killed_worker_text(o, "TaskMemoryError")
    assert re.search(r"MaxRSS [\d.]+ [KMG]iB of 28\d\.\d\d MiB requested", o["death"]["text"]), o["death"]["text"]
    all_correct(o)


def test_nanny_over_budget_is_memory_nanny(outcomes):
    o = outcome(outcomes, "memory-nanny", True)
    assert (o["cause"], o["blame"]) == ("memory-nanny", True), o["death"]["text"]
    killed_worker_text(o, "TaskMemoryError")
    assert "the nanny stopped the worker while running 'hog-800MB'" in o["death"]["text"]
    assert "286.10 MiB memory_limit" in o["death"]["text"]
    assert o["death"]["log_tail"], "the worker's log tail is kept"
    all_correct(o)


def test_segfault_is_a_crash_charged_to_the_task(outcomes):
    o = outcome(outcomes, "segfault", True)
    assert (o["cause"], o["blame"]) == ("crash", True), o["death"]["text"]
    killed_worker_text(o, "TaskCrashedError")
    assert "SIGSEGV" in o["death"]["text"] and "'segfault-task'" in o["death"]["text"]
    assert any("crashed in string_at (ctypes/__init__.py:" in e and "<- segfault (" in e
               for e in o["death"]["evidence"]), o["death"]["evidence"]
    assert any("signal 11 (SIGSEGV)" in e for e in o["death"]["evidence"])
    all_correct(o)


def test_exit_in_a_task_is_a_crash(outcomes):
    o = outcome(outcomes, "exit1", True)
    assert (o["cause"], o["blame"]) == ("crash", True), o["death"]["text"]
    killed_worker_text(o, "TaskCrashedError")
    assert "exited with code 1" in o["death"]["text"]
    all_correct(o)


def test_allowed_failures_plus_one_verdicts_and_only_the_executing_task(outcomes):
    o = outcome(outcomes, "crash-twice", True)
    assert o["is_theirs"] and o["is_ours"], o["error_type"]          # distributed's and ours, one object
    assert o["error_type"] == "TaskCrashedError" and o["attempts"] == 2, o["error_text"]
    text = o["error_text"]
    assert "allowed failures: 1" in text and "Cause: crash: " in text and "SIGSEGV" in text, text
    assert "Fix: " in text and "Evidence:" in text, text
    charged = [d for d in o["deaths"] if d["blame"]]
    assert len(charged) == 2, [(d["cause"], d["executing"]) for d in o["deaths"]]
    assert all(d["executing"] == ["crash-twice-task"] for d in charged), [d["executing"] for d in charged]
    # Tasks were queued behind it on the dying worker; none was charged, and each result came.
    assert any(o["queued_at_death"]), o["queued_at_death"]
    all_correct(o)
    assert "crash-twice-task" in o["why"] and "crash" in o["why"]


@ON
def test_scancel_is_cancelled_and_not_charged(outcomes, nanny):
    o = outcome(outcomes, "scancel", nanny)
    innocent(o, "cancelled")
    assert f"job {o['killed_job']} was cancelled by uid {os.getuid()}" in o["death"]["text"]
    assert any("CANCELLED" in e for e in o["death"]["evidence"]), o["death"]["evidence"]


@ON
def test_preemption_is_not_charged(outcomes, nanny):
    o = outcome(outcomes, "preempted", nanny)
    innocent(o, "preempted")
    assert any("PREEMPTED" in e for e in o["death"]["evidence"]), o["death"]["evidence"]


def test_a_worker_that_never_starts(outcomes):
    o = outcome(outcomes, "startup", True)
    assert (o["cause"], o["blame"]) == ("startup", False)
    assert len(o["startup_deaths"]) == 3 and o["jobs_at_halt"] == o["jobs_later"] == 3
    assert "3 jobs in a row ended before their worker started" in o["halted"]
    assert "/nonexistent/python" in "\n".join(o["death"]["log_tail"])
    assert "before its worker registered" in o["death"]["text"]
    # No worker will come: distributed's waiting work fails saying why, as on our engine.
    for what in ("waiting", "later"):
        assert o[what] and o[what].startswith("CancelledError") and "none will be started" in o[what], o[what]


# -- the node failure: alone, last (a node marked down ends every job on it) ---------------------
@pytest.fixture(scope="module")
def node_outcomes(slurm_cluster, slurm_node, tmp_path_factory):
    base = tmp_path_factory.mktemp("distributed-node-failure")
    with S.own_config(base):
        got = S.safely(S.with_engine(ENGINE, S.node_failure), slurm_node, base / "logs")
    return {("node-failure", n): o for o, n in zip(got if isinstance(got, list) else [got, got], (True, False))}


@pytest.mark.node_down
@ON
def test_node_failure_is_not_charged(node_outcomes, nanny):
    o = outcome(node_outcomes, "node-failure", nanny)
    innocent(o, "node-failure")
    assert any("NODE_FAIL" in e for e in o["death"]["evidence"]), o["death"]["evidence"]
