"""Why did my worker die? Every cause staged for real on the SLURM test cluster.

Each scenario (tests/batch/slurm/scenarios.py) runs its own SLURMCluster with and without a
nanny, makes a worker die one way, and records what the user is told. They run side by
side in threads (the walltime ones alone take ~100 s); the node failure is in
test_scenario_node_failure.py, alone, because a node marked down ends every job on it. Each test below then asserts on
one scenario's outcome: the cause, the blame, the key facts of the explanation, every
other result, and that none of its jobs is left in squeue.

    python -m pytest -m slurm tests/batch/slurm/test_scenarios.py -v
    HPC_SCENARIO_REPORT=/tmp/scenarios.json ... also writes every outcome as JSON
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

import scenarios as S

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(1800)]

PARALLEL = 6          # clusters at once: 2 cores here, and the node has 16 CPUs for everyone


@pytest.fixture(scope="module")
def outcomes(slurm_cluster, tmp_path_factory):
    base = tmp_path_factory.mktemp("scenarios")
    with S.own_config(base):
        logs = base / "logs"
        runs = {}
        with ThreadPoolExecutor(PARALLEL) as pool:
            runs["preempted"] = pool.submit(S.safely, S.preempted, logs)
            for name, (fn, variants) in S.SCENARIOS.items():
                for nanny in variants:
                    runs[(name, nanny)] = pool.submit(S.safely, fn, nanny, logs)
        out = {k: f.result() for k, f in runs.items()}
    # The node failure is test_scenario_node_failure.py's: a node marked down ends every job
    # on it, these and those of the tests that run beside them (scripts/test runs it last).
    for key in ("preempted",):
        got = out.pop(key)
        for o, nanny in zip(got if isinstance(got, list) else [got, got], (True, False)):
            out[(key, nanny)] = o
    if os.environ.get("HPC_SCENARIO_REPORT"):
        with open(os.environ["HPC_SCENARIO_REPORT"], "w") as f:
            json.dump([dict(o, key=list(k)) for k, o in out.items()], f, indent=1, default=str)
    return out


outcome, all_correct = S.outcome, S.all_correct


BOTH = pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])


@BOTH
def test_walltime_kills_are_not_charged_and_every_result_is_right(outcomes, nanny):
    o = outcome(outcomes, "walltime", nanny)
    causes = [(d["cause"], d["text"]) for d in o["deaths"]]
    # Idle-ish workers drain and leave before the limit; the one running the long task is killed.
    assert {c for c, _ in causes} <= {"walltime", "retired"}, causes
    assert all("walltime drain" in t for c, t in causes if c == "retired"), causes
    assert (o["cause"], o["blame"]) == ("walltime", False), causes
    assert o["death"]["executing"] == ["long-50s"]
    assert not o["charged_any"]
    assert o["long"] == {"value": 42}, o["long"]      # rerun on a fresh job, not failed
    all_correct(o)
    d = o["death"]
    assert "reached its time limit (00:01:00)" in d["text"] and f"job {d['job_id']}" in d["text"]
    assert any("TIMEOUT" in e for e in d["evidence"]), d["evidence"]
    assert "walltime" in o["why"]


@BOTH
def test_task_over_the_jobs_memory_is_a_batch_memory_fault(outcomes, nanny):
    o = outcome(outcomes, "memory-batch", nanny)
    assert (o["cause"], o["blame"]) == ("memory-batch", True), f"{o['death']['text']}\n{S.forensics(o)}"
    err = o["error"]
    assert err["error"] == "TaskMemoryError" and err["cause"] == "memory-batch"
    assert "raise memory=" in err["advice"]
    assert any("OUT_OF_MEMORY" in e or "oom-kill" in e or "cgroup OOM" in e for e in err["evidence"]), err
    assert "'hog-1GB'" in o["death"]["text"]
    if not nanny:   # the job itself ended OUT_OF_MEMORY: sacct's numbers, request included
        assert re.search(r"MaxRSS [\d.]+ [KMG]iB of 28\d\.\d\d MiB requested", o["death"]["text"]), o["death"]["text"]
    # Only the hog is charged: the 20 tasks queued behind it on the same worker all finish.
    all_correct(o)
    assert "memory-batch" in o["why"]


def test_nanny_over_budget_is_a_nanny_memory_fault(outcomes):
    o = outcome(outcomes, "memory-nanny", True)
    assert (o["cause"], o["blame"]) == ("memory-nanny", True), o["death"]["text"]
    assert o["error"]["error"] == "TaskMemoryError"
    assert "the nanny stopped the worker while running 'hog-800MB'" in o["death"]["text"]
    assert "286.10 MiB memory_limit" in o["death"]["text"]        # 300 MB, as the user gave it
    all_correct(o)


@BOTH
def test_segfault_is_a_crash_charged_to_the_task(outcomes, nanny):
    o = outcome(outcomes, "segfault", nanny)
    assert (o["cause"], o["blame"]) == ("crash", True), o["death"]["text"]
    assert o["error"]["error"] == "TaskCrashedError"
    assert "SIGSEGV" in o["death"]["text"] and "'segfault-task'" in o["death"]["text"]
    # The worker's faulthandler stack (from the nanny, or the job log without one) names the site.
    assert any("crashed in string_at (ctypes/__init__.py:" in e and "<- segfault (helpers/funcs.py:" in e
               for e in o["death"]["evidence"]), o["death"]["evidence"]
    all_correct(o)


@BOTH
def test_exit_in_a_task_is_a_crash(outcomes, nanny):
    o = outcome(outcomes, "exit1", nanny)
    assert (o["cause"], o["blame"]) == ("crash", True), o["death"]["text"]
    assert o["error"]["error"] == "TaskCrashedError"
    assert "exited with code 1" in o["death"]["text"]
    if not nanny:       # the job itself: sacct's FAILED 1:0
        assert any("FAILED 1:0" in e for e in o["death"]["evidence"]), o["death"]["evidence"]
    all_correct(o)


_innocent = S.innocent


@BOTH
def test_scancel_is_cancelled_with_the_uid(outcomes, nanny):
    o = outcome(outcomes, "scancel", nanny)
    _innocent(o, "cancelled")
    assert f"job {o['killed_job']} was cancelled by uid {os.getuid()}" in o["death"]["text"]


@BOTH
def test_scale_down_is_retired(outcomes, nanny):
    o = outcome(outcomes, "scale-down", nanny)
    assert (o["cause"], o["blame"]) == ("retired", False), o["death"]["text"]
    assert "scale-down" in o["death"]["text"]
    assert o["to_final"] == 0
    all_correct(o)


@BOTH
def test_preemption(outcomes, nanny):
    o = outcome(outcomes, "preempted", nanny)
    _innocent(o, "preempted")
    assert any("PREEMPTED" in e for e in o["death"]["evidence"]), o["death"]["evidence"]


@BOTH
def test_startup_failure_halts_after_three(outcomes, nanny):
    o = outcome(outcomes, "startup", nanny)
    assert (o["cause"], o["blame"]) == ("startup", False)
    assert len(o["startup_deaths"]) == 3 and o["jobs_at_halt"] == o["jobs_later"] == 3
    assert "3 jobs in a row ended before their worker started" in o["halted"]
    for what in ("waiting", "later"):                    # no worker will come: work fails, saying why
        assert o[what] and o[what].startswith("CancelledError") and "none will be started" in o[what], o[what]
        assert "3 jobs in a row ended before their worker started" in o[what], o[what]
    assert o["wait_for_workers"].startswith("HPCClusterError") and "stopped starting them" in o["wait_for_workers"]
    tail = "\n".join(o["death"]["log_tail"])
    assert ("/nonexistent/python" in tail) if nanny else ("module" in tail), tail
    assert "before its worker registered" in o["death"]["text"]


@BOTH
def test_stopped_worker_is_heartbeat_lost(outcomes, nanny):
    o = outcome(outcomes, "sigstop", nanny)
    _innocent(o, "heartbeat-lost")
    if nanny:
        # The nanny ends the silent worker (freeing the job's slot for a fresh one) and says
        # what it found, so the verdict need not wait for sacct, which says "running" for good.
        assert "its nanny found the process stopped and ended it" in o["death"]["text"], o["death"]["text"]
        assert o["to_final"] < 10
        assert o["cleanup"] == ["already gone"]
    else:
        assert o["cleanup"] == ["SIGCONT sent"]
