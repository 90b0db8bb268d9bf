"""The death-diagnosis table, evidence by evidence. Pure: no processes, no batch system.

The accounting dicts have the shape of AccountingRecord (adapters/base.py) as the job
manager hands them over; the nanny dicts are the nanny's exit report.
"""

import asyncio
import re
import signal

import pytest

from hpc_cluster.scheduler.diagnosis import (ADVICE, BLAMED, CAUSES, MEMORY_CAUSES, Evidence, diagnose,
                                             needs_accounting)
from hpc_cluster.scheduler import evidence
from hpc_cluster.scheduler.state import SchedulerState
from helpers.fakes import FixedAccounting
from helpers.wait import wait_until_async

RUNNING = ["f-3a9c"]


def acct(state, raw, **kw):
    return {"job_id": "123", "state": state, "raw_state": raw, "final": True, "steps": [], **kw}


def nanny(**kw):
    base = {"pid": 4242, "exit_code": None, "signal": None, "peak_rss": 2**30, "killed_by_nanny": False,
            "cgroup_oom": False, "memory_limit": 2**30, "memory_budget": int(0.95 * 2**30)}
    base.update(kw)
    return base


CASES = [
    # (name, evidence, cause, blamed)
    ("scale-down intent beats everything", Evidence(intent="scale-down", connection="closed",
                                                    nanny=nanny(signal=9), executing=RUNNING), "retired", False),
    ("job never registered", Evidence(registered=False, job_id="7", accounting=acct("failed", "FAILED",
                                                                                    exit_code=1, signal=0)),
     "startup", False),
    # Found on the real cluster: a replacement job started on a node that failed under it
    # was called a startup failure (a deployment fault) although SLURM said NODE_FAIL.
    ("job never registered, node failed under it", Evidence(
        registered=False, job_id="359", accounting=acct("node-fail", "NODE_FAIL", exit_code=0, signal=0)),
     "node-failure", False),
    ("job never registered, cancelled by a user", Evidence(
        registered=False, job_id="8", accounting=acct("cancelled", "CANCELLED by 0", cancelled_by="0")),
     "cancelled", False),
    ("sacct TIMEOUT", Evidence(connection="closed", executing=RUNNING, job_id="123",
                               accounting=acct("timeout", "TIMEOUT", elapsed=73, time_limit=60)), "walltime", False),
    ("time-limit line in the log, nanny said goodbye", Evidence(
        connection="goodbye", nanny=nanny(exit_code=0), executing=RUNNING,
        log_tail=["slurmstepd: error: *** JOB 123 ON vm CANCELLED AT 2026-11-22T03:00:00 DUE TO TIME LIMIT ***"]),
     "walltime", False),
    ("sacct PREEMPTED", Evidence(connection="closed", executing=RUNNING, accounting=acct("preempted", "PREEMPTED")),
     "preempted", False),
    ("sacct NODE_FAIL", Evidence(connection="heartbeat-lost", executing=RUNNING,
                                 accounting=acct("node-fail", "NODE_FAIL", node="vm")), "node-failure", False),
    ("nanny memory kill", Evidence(connection="closed", executing=RUNNING,
                                   nanny=nanny(signal=9, killed_by_nanny=True)), "memory-nanny", True),
    ("cgroup OOM seen by the nanny", Evidence(connection="closed", executing=RUNNING,
                                              nanny=nanny(signal=9, cgroup_oom=True)), "memory-batch", True),
    ("sacct OUT_OF_MEMORY, no nanny", Evidence(connection="closed", executing=RUNNING, accounting=acct(
        "out-of-memory", "OUT_OF_MEMORY", exit_code=0, signal=125, max_rss=1.02 * 2**30,
        requested_memory=2**30)), "memory-batch", True),
    ("OOM only on the batch step (job lives on)", Evidence(
        connection="closed", executing=RUNNING, nanny=nanny(signal=9),
        accounting={**acct("running", "RUNNING"), "final": False,
                    "steps": [{"step_id": "123.batch", "state": "out-of-memory", "raw_state": "OUT_OF_MEMORY"}]}),
     "memory-batch", True),
    ("scancel by a user", Evidence(connection="closed", executing=RUNNING,
                                   accounting=acct("cancelled", "CANCELLED by 1000", cancelled_by="1000")),
     "cancelled", False),
    ("SIGSEGV in a task (nanny)", Evidence(connection="closed", executing=RUNNING, nanny=nanny(signal=11)),
     "crash", True),
    ("SIGABRT in a task (nanny)", Evidence(connection="closed", executing=RUNNING,
                                           nanny=nanny(signal=int(signal.SIGABRT))), "crash", True),
    ("SIGSEGV in a task (sacct, no nanny)", Evidence(connection="closed", executing=RUNNING,
                                                      accounting=acct("failed", "FAILED", exit_code=0, signal=11)),
     "crash", True),
    ("segfault while idle is not charged", Evidence(connection="closed", executing=[], nanny=nanny(signal=11)),
     "crash", False),
    ("os._exit(1) while running", Evidence(connection="closed", executing=RUNNING, nanny=nanny(exit_code=1)),
     "crash", True),
    # Found on the real cluster (tests/batch/slurm/test_scenarios.py): without a nanny the worker
    # is the batch step, and sacct's FAILED 1:0 is the task's os._exit(1).
    ("os._exit(1) while running (sacct FAILED 1:0, no nanny)", Evidence(
        connection="closed", executing=RUNNING, accounting=acct("failed", "FAILED", exit_code=1, signal=0)),
     "crash", True),
    ("job FAILED 1:0 while idle, no nanny: not a task's crash", Evidence(
        connection="closed", executing=[], accounting=acct("failed", "FAILED", exit_code=1, signal=0)),
     "connection-lost", False),
    ("clean goodbye", Evidence(connection="goodbye", nanny=nanny(exit_code=0)), "retired", False),
    ("SIGKILL from outside", Evidence(connection="closed", executing=RUNNING, nanny=nanny(signal=9)),
     "unknown", False),
    # Issue 14, point 1: a worker that lost the scheduler exits with code 4 at the end of its
    # reconnect window; a paused scheduler's innocent task was failed as a crash on it.
    ("worker gave up on the scheduler while running (nanny: exit 4)", Evidence(
        connection="heartbeat-lost", executing=RUNNING, nanny=nanny(exit_code=4, unresponsive={"status": "zombie"})),
     "scheduler-lost", False),
    ("worker gave up on the scheduler, no nanny (sacct FAILED 4:0)", Evidence(
        connection="closed", executing=RUNNING, accounting=acct("failed", "FAILED", exit_code=4, signal=0)),
     "scheduler-lost", False),
    ("heartbeat silence", Evidence(connection="heartbeat-lost", executing=RUNNING), "heartbeat-lost", False),
    ("heartbeat silence, then the nanny ended the stopped process", Evidence(
        connection="heartbeat-lost", executing=RUNNING, nanny=nanny(signal=9, unresponsive={"status": "stopped"})),
     "heartbeat-lost", False),
    ("connection closed, nothing else", Evidence(connection="closed", executing=RUNNING),
     "connection-lost", False),
    ("no evidence at all", Evidence(), "unknown", False),
]


@pytest.mark.parametrize("name,ev,cause,blamed", CASES, ids=[c[0] for c in CASES])
def test_table(name, ev, cause, blamed):
    v = diagnose(ev)
    assert (v.cause, v.blame) == (cause, blamed), v.text
    assert v.cause in CAUSES
    if v.cause in MEMORY_CAUSES:        # the fix names a size to ask for
        assert re.search(r"'\d+(\.\d+)?[kMGT]B' or more", v.advice), v.advice
    else:
        assert v.advice == ADVICE[v.cause]


def test_a_memory_check_of_the_batch_system_is_not_called_a_cgroup_oom_and_its_request_is_the_fix():
    """Grid Engine: execd killed the job over its h_vmem (600 MiB), asked apart from memory= (the
    workers' 2.79 GiB budget). The job ended at its request: that is the floor and the fix."""
    sge = acct("out-of-memory", "failed 37  : qmaster enforced h_rt, h_cpu, or h_vmem limit; exit_status 137",
               exit_code=137, signal=9, max_rss=int(641.46 * 2**20), requested_memory=600 * 2**20)
    memory = {"limit": 3 * 10**9, "rss": 30 * 2**20, "peak_rss": 30 * 2**20, "start_rss": 30 * 2**20,
              "start_managed": 0, "managed": 0}
    v = diagnose(Evidence(connection="closed", executing=RUNNING, job_id="36", accounting=sge, memory=memory))
    assert (v.cause, v.blame) == ("memory-batch", True)
    assert "the batch system's memory check ended the job: failed 37" in v.text and "cgroup" not in v.text
    assert "the running task grew by 570.00 MiB" in v.text, v.text
    assert "the job's memory request, what the batch system enforced, was 600.00 MiB" in v.advice, v.advice
    assert "to '1GB' or more" in v.advice, v.advice
    # SLURM's OUT_OF_MEMORY is the kernel's, in the job's cgroup, as before.
    slurm = diagnose(Evidence(connection="closed", executing=RUNNING, accounting=acct(
        "out-of-memory", "OUT_OF_MEMORY", requested_memory=2**30)))
    assert "the kernel's OOM killer fired in its cgroup" in slurm.text


def test_the_figures_of_one_memory_death_agree():
    """Issue 34: one record said "peak RSS 859 MiB" (its verdict, from one sampler) and "the worker
    reached 952 MiB" (its advice: the cgroup's limit, a floor above every sample) with nothing saying
    why they differ. Now the verdict and the advice name the same sampled figure, the larger of the
    nanny's peak and the job's MaxRSS, and the advice says the limit is a floor above it."""
    mib = 2**20
    memory = {"limit": 952 * mib, "rss": 300 * mib, "peak_rss": 300 * mib, "start_rss": 200 * mib,
              "start_managed": 0, "managed": 0}
    ev = Evidence(connection="closed", executing=RUNNING, job_id="7", memory=memory,
                  nanny=nanny(signal=9, peak_rss=859 * mib, cgroup_oom=True, memory_limit=952 * mib),
                  accounting=acct("out-of-memory", "OUT_OF_MEMORY", max_rss=800 * mib, requested_memory=10**9))
    v = diagnose(ev)
    assert v.cause == "memory-batch", v.text
    assert "peak RSS 859.00 MiB of 953.67 MiB requested" in v.text, v.text
    assert "MaxRSS" not in v.text and "MaxRSS" not in v.advice
    assert "the worker filled its 952.00 MiB limit" in v.advice, v.advice
    assert "peak RSS 859.00 MiB" in v.advice, v.advice
    assert "reached 952" not in v.advice
    # The job's MaxRSS above the nanny's peak (it counts the nanny too) is the record's figure.
    ev.accounting = acct("out-of-memory", "OUT_OF_MEMORY", max_rss=990 * mib, requested_memory=10**9)
    ev.memory = {**memory, "limit": None}
    v = diagnose(ev)
    assert "MaxRSS 990.00 MiB of 953.67 MiB requested" in v.text, v.text
    assert "MaxRSS 990.00 MiB counts its other processes too" in v.advice, v.advice


def test_every_cause_is_reachable_and_only_memory_and_crash_blame():
    reached = {c[2] for c in CASES}
    assert reached == set(CAUSES)
    assert BLAMED == {"memory-batch", "memory-nanny", "crash"}


def test_memory_explanation_carries_the_numbers_from_sacct():
    ev = Evidence(connection="closed", executing=RUNNING, job_id="123", accounting=acct(
        "out-of-memory", "OUT_OF_MEMORY", exit_code=0, signal=125, max_rss=int(1.02 * 2**30),
        requested_memory=2**30))
    v = diagnose(ev)
    assert "MaxRSS 1.02 GiB of 1.00 GiB requested" in v.text
    assert any(e.startswith("accounting: job 123 OUT_OF_MEMORY 0:125") for e in v.evidence)
    assert "raise memory=" in v.advice


def test_crash_explanation_names_signal_and_task():
    v = diagnose(Evidence(connection="closed", executing=RUNNING, nanny=nanny(signal=11)))
    assert "signal 11 (SIGSEGV)" in v.text and "'f-3a9c'" in v.text


def test_walltime_explanation_names_limit_and_elapsed():
    v = diagnose(Evidence(connection="closed", executing=RUNNING, job_id="9",
                          accounting=acct("timeout", "TIMEOUT", elapsed=73, time_limit=60)))
    assert "00:01:00" in v.text and "00:01:13" in v.text and "raise walltime=" in v.advice


def test_verdict_is_refined_as_evidence_arrives():
    ev = Evidence(connection="closed", executing=RUNNING, job_id="123")
    assert diagnose(ev).cause == "connection-lost" and needs_accounting(ev)
    ev.accounting = acct("out-of-memory", "OUT_OF_MEMORY")
    assert diagnose(ev).cause == "memory-batch" and not needs_accounting(ev)


def test_log_lines_become_evidence():
    ev = Evidence(connection="closed", executing=RUNNING,
                  log_tail=["starting", "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=5.batch."])
    v = diagnose(ev)
    assert v.cause == "memory-batch"
    assert any("oom-kill event" in e for e in v.evidence)


def test_the_last_traceback_line_of_a_job_log_is_evidence():
    tail = ["Traceback (most recent call last):", '  File "<string>", line 1, in <module>',
            "ModuleNotFoundError: No module named 'numpyy'"]
    v = diagnose(Evidence(registered=False, job_id="7", log_tail=tail,
                          accounting=acct("failed", "FAILED", exit_code=1, signal=0)))
    assert v.cause == "startup"
    assert "log: ModuleNotFoundError: No module named 'numpyy'" in v.evidence, v.evidence
    # A line that merely mentions an error is not taken for one.
    v = diagnose(Evidence(connection="closed", log_tail=["retrying after a ConnectionError in 1 s"]))
    assert not any(e.startswith("log:") for e in v.evidence)


FAULTHANDLER = [   # what a worker (faulthandler on, this thread only) printed for a segfault, here
    "2026-11-22 21:30:01 hpc_cluster.worker INFO worker tcp://127.0.0.1:4242 connected",
    "Fatal Python error: Segmentation fault",
    "",
    "Stack (most recent call first):",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
    '  File "/home/me/mylib/fast.py", line 42 in parse',
    '  File "/home/me/venv/lib/python3.11/site-packages/hpc_cluster/worker/worker.py", line 287 in _execute',
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/concurrent/futures/thread.py", line 58 in run',
]


def test_a_crash_names_where_the_task_was_from_the_faulthandler_stack():
    v = diagnose(Evidence(connection="closed", executing=RUNNING, nanny=nanny(signal=11), log_tail=FAULTHANDLER))
    assert v.cause == "crash" and v.blame
    assert v.text.endswith("while running 'f-3a9c', in string_at (ctypes/__init__.py:519)"), v.text
    assert "log: crashed in string_at (ctypes/__init__.py:519) <- parse (mylib/fast.py:42)" in v.evidence
    assert "log: Fatal Python error: Segmentation fault" in v.evidence
    # No stack (a worker killed before it could print one): no site, and nothing invented.
    v = diagnose(Evidence(connection="closed", executing=RUNNING, nanny=nanny(signal=11)))
    assert v.text.endswith("while running 'f-3a9c'") and not any("crashed in" in e for e in v.evidence)


def _collector_with_a_nanny_worker():
    """An evidence collector (clock at 1000 s, no batch system) and one worker under nanny n1."""
    from hpc_cluster.scheduler import evidence
    from hpc_cluster.scheduler.state import SchedulerState

    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    state.add_worker("tcp://w:1", 1, 990.0, name="w", info={"nanny_id": "n1"})
    return col


def test_the_nanny_log_tail_is_read_for_evidence():
    import asyncio

    col = _collector_with_a_nanny_worker()

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        col.exit_report({"nanny_id": "n1", "signal": 11, "exit_code": None, "peak_rss": 2**20,
                         "log_tail": ["worker log line", "Fatal Python error: Segmentation fault"]})
        return record

    record = asyncio.run(run())
    assert record["cause"] == "crash" and record["final_at"] == 1000.0
    assert "log: Fatal Python error: Segmentation fault" in record["evidence"], record["evidence"]
    assert record["log_tail"][-1] == "Fatal Python error: Segmentation fault"


def test_a_death_awaiting_a_report_from_a_nanny_that_is_gone_becomes_final():
    import asyncio

    col = _collector_with_a_nanny_worker()

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        assert record["final_at"] is None                  # the nanny's report may still come
        col.nanny_gone("n1")                                # ... but the nanny died too
        return record

    record = asyncio.run(run())
    assert record["final_at"] == 1000.0 and record["cause"] == "connection-lost"


def test_a_new_death_is_asked_about_at_once_while_an_older_one_backs_off(monkeypatch):
    import asyncio

    from hpc_cluster.scheduler import evidence
    from hpc_cluster.scheduler.state import SchedulerState

    monkeypatch.setattr(evidence, "BACKOFF", (0.05, 30.0, 30.0))
    asked = []

    class Source(FixedAccounting):
        async def accounting(self, job_ids):
            asked.append(sorted(job_ids))
            return {j: {**acct("running", "RUNNING", job_id=j), "final": False} for j in job_ids
                    if j == "1"} | {j: acct("out-of-memory", "OUT_OF_MEMORY", job_id=j, requested_memory=1,
                                            time_limit=60) for j in job_ids if j == "2"}

    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    col.source = Source({})
    state.add_worker("tcp://w:1", 1, 990.0, name="w1", info={"job_id": "1"})
    state.add_worker("tcp://w:2", 1, 990.0, name="w2", info={"job_id": "2"})

    async def run():
        col.worker_removed("tcp://w:1", "heartbeat-lost", None)
        await wait_until_async(lambda: asked == [["1"]], 5, "job 1's accounting asked")   # it now waits 30 s
        second = col.worker_removed("tcp://w:2", "closed", None)
        await wait_until_async(lambda: second["final_at"] is not None, 5, "the second verdict")
        col._task.cancel()
        return second

    second = asyncio.run(run())
    assert asked == [["1"], ["2"]] and second["cause"] == "memory-batch"


def test_a_worker_ended_for_silence_says_what_state_its_process_was_in():
    v = diagnose(Evidence(connection="heartbeat-lost", executing=["f-1"],
                          nanny=nanny(signal=9, unresponsive={"status": "stopped"})))
    assert "its nanny found the process stopped and ended it" in v.text and "'f-1'" in v.text
    assert any("after the scheduler lost its heartbeat (process stopped)" in e for e in v.evidence), v.evidence


def test_exit_code_without_nanny_is_named_from_sacct():
    v = diagnose(Evidence(connection="closed", executing=RUNNING, job_id="77",
                          accounting=acct("failed", "FAILED", exit_code=1, signal=0)))
    assert v.cause == "crash" and "exited with code 1" in v.text and "'f-3a9c'" in v.text
    # sacct's ExitCode 1:0 has no signal: shown as 1:0, as sacct writes it, not 1:None
    assert any(e.startswith("accounting: job 123 FAILED 1:0") for e in v.evidence), v.evidence


# -- the evidence collector: when is a verdict final? ----------------------------------------

def _collect(records, nanny_id="n1", monkeypatch=None):
    import asyncio

    from hpc_cluster.scheduler import evidence
    from hpc_cluster.scheduler.state import SchedulerState

    monkeypatch.setattr(evidence, "BACKOFF", (0.01,) * 3)
    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    col.source = FixedAccounting(records)
    state.add_worker("tcp://w:1", 1, 990.0, name="w", info={"job_id": "5", "nanny_id": nanny_id})

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        assert record["final_at"] is None                 # sacct (and the nanny) still to come
        await asyncio.wait_for(col._task, 5)
        return record

    return asyncio.run(run()), col


def test_node_failure_with_a_nanny_is_final_without_its_report(monkeypatch):
    # Found on the real cluster: the node died with the nanny on it, so its exit report never
    # came, and the verdict (node-failure) was never marked final.
    record, _ = _collect({"5": acct("node-fail", "NODE_FAIL", node="vm")}, monkeypatch=monkeypatch)
    assert record["cause"] == "node-failure" and record["final_at"] == 1000.0


def test_a_stopped_worker_with_a_nanny_is_final_once_we_stop_asking(monkeypatch):
    # SIGSTOP: heartbeat lost, the job runs on and the nanny has nothing to report.
    record, col = _collect({"5": {**acct("running", "RUNNING"), "final": False}}, monkeypatch=monkeypatch)
    assert record["final_at"] == 1000.0
    col.exit_report({"nanny_id": "n1", "signal": 9, "exit_code": None})   # a late report still refines
    assert record["cause"] == "unknown" and "SIGKILL" in record["text"]


class _Growing(FixedAccounting):
    """sacct as seen on the real cluster: the first final record lacks ReqMem and Timelimit."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), 0

    async def accounting(self, job_ids):
        self.calls += 1
        return {"5": self.answers[min(self.calls, len(self.answers)) - 1]}


def _collect_from(source, monkeypatch):
    """Run the collector on one lost worker of job 5 until it stops asking `source`."""
    import asyncio

    from hpc_cluster.scheduler import evidence
    from hpc_cluster.scheduler.state import SchedulerState

    monkeypatch.setattr(evidence, "BACKOFF", (0.01,) * 6)
    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    col.source = source
    state.add_worker("tcp://w:1", 1, 990.0, name="w", info={"job_id": "5"})

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        await asyncio.wait_for(col._task, 5)
        return record

    return asyncio.run(run())


def test_a_final_record_without_the_request_is_asked_for_again(monkeypatch):
    oom = acct("out-of-memory", "OUT_OF_MEMORY", job_id="5", max_rss=int(1.02 * 2**30))
    source = _Growing([oom, {**oom, "requested_memory": 2**30, "time_limit": 600}])
    record = _collect_from(source, monkeypatch)
    assert source.calls == 2 and record["final_at"] == 1000.0
    assert "MaxRSS 1.02 GiB of 1.00 GiB requested" in record["text"], record["text"]


def test_a_record_that_never_gains_the_request_still_becomes_final(monkeypatch):
    from hpc_cluster.scheduler.evidence import FINAL_ROUNDS

    source = _Growing([acct("out-of-memory", "OUT_OF_MEMORY", job_id="5", max_rss=2**30)])
    record = _collect_from(source, monkeypatch)
    assert source.calls == FINAL_ROUNDS and record["final_at"] == 1000.0
    assert record["cause"] == "memory-batch" and "MaxRSS 1.00 GiB)" in record["text"], record["text"]


def test_the_scheduler_lost_exit_code_is_the_workers():
    from hpc_cluster.scheduler.diagnosis import EXIT_SCHEDULER_LOST
    from hpc_cluster.worker.worker import EXIT_LOST_SCHEDULER
    assert EXIT_SCHEDULER_LOST == EXIT_LOST_SCHEDULER


def test_results_stored_since_the_last_heartbeat_count_as_held_at_a_death_between_tasks():
    # A worker that stores 30 MB results from quick tasks is stopped by its nanny between two
    # of them: its last heartbeat reported none held, but the scheduler was told of each result.
    import asyncio

    from hpc_cluster.protocol.frames import Opaque
    from hpc_cluster.scheduler.evidence import memory_evidence

    col = _collector_with_a_nanny_worker()
    state, mb = col.state, 2**20
    state.workers["tcp://w:1"].memory_limit = 300 * mb
    state.heartbeat("tcp://w:1", 991.0)
    state.workers["tcp://w:1"].memory = {"rss": 60 * mb, "managed": 0}
    state.update_graph("c", [{"key": f"fill-{i}", "func": Opaque(b"f"), "args": Opaque(b"a"), "deps": [],
                              "priority": i, "retries": 0, "resources": {}} for i in range(9)],
                       [f"fill-{i}" for i in range(9)])
    for i in range(9):
        state.task_started("tcp://w:1", f"fill-{i}", 992.0 + i / 10)
        state.task_finished("tcp://w:1", f"fill-{i}", 30 * mb)
    assert memory_evidence(state, state.workers["tcp://w:1"])["managed"] == 270 * mb

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        col.exit_report({"nanny_id": "n1", "signal": None, "exit_code": None, "killed_by_nanny": True,
                         "peak_rss": 290 * mb, "memory_limit": 300 * mb, "memory_budget": 285 * mb})
        return record

    record = asyncio.run(run())
    assert record["cause"] == "memory-nanny" and not record["blame"], record
    assert "it held 270.00 MiB of stored results in memory" in record["text"], record["text"]
    assert "stored results filled the worker" in record["advice"], record["advice"]


def test_a_startup_death_advises_what_the_refusing_worker_said():
    """A worker that refused to start (a version mismatch on the distributed engine) said why in
    its last line: that is the fix, not the general 'check python= and the prologue'."""
    said = ("hpc-cluster worker: this worker's packages differ from the scheduler's (distributed 2025.1.0 here, "
            "2026.8.0 on the scheduler): install the same versions")
    v = diagnose(Evidence(registered=False, job_id="7", accounting=acct("failed", "FAILED", exit_code=3),
                          log_tail=["some import noise", said, "nanny: worker ended (exit code 3); nanny exits"]))
    assert v.cause == "startup"
    assert v.advice.startswith("the worker said: this worker's packages differ") and "2025.1.0" in v.advice
    plain = diagnose(Evidence(registered=False, job_id="7", accounting=acct("failed", "FAILED", exit_code=1),
                              log_tail=["ModuleNotFoundError: No module named 'hpc_cluster'"]))
    assert plain.advice == ADVICE[plain.cause]


# -- a silent worker: a partition that ends, one that does not (issue 33) ---------------------

STILL_RUNNING = {**acct("running", "RUNNING", node="hpcn2"), "final": False}


def test_a_silent_worker_that_came_back_is_a_partition_that_ended_and_nothing_to_fix():
    v = diagnose(Evidence(connection="heartbeat-lost", accounting=STILL_RUNNING, nanny_silent=True,
                          reattached_after=26.4))
    assert (v.cause, v.blame) == ("heartbeat-lost", False)
    assert "came back 26 s later and was reattached (its job was RUNNING throughout)" in v.text, v.text
    assert "network to its node hpcn2 was cut" in v.text, v.text
    assert any(e.startswith("reconnection: the worker registered again 26 s") for e in v.evidence), v.evidence
    assert v.advice.startswith("nothing to do") and "hpcn2" in v.advice


def test_a_silent_worker_whose_nanny_is_silent_too_points_at_the_node_not_the_process():
    v = diagnose(Evidence(connection="heartbeat-lost", executing=RUNNING, accounting=STILL_RUNNING, nanny_silent=True))
    assert (v.cause, v.blame) == ("heartbeat-lost", False)
    assert "its nanny on hpcn2 did not answer either while the job was still RUNNING" in v.text, v.text
    assert any(e.startswith("nanny: did not answer the scheduler's ping") for e in v.evidence), v.evidence


def test_a_node_that_fails_after_its_worker_fell_silent_says_it_never_came_back():
    v = diagnose(Evidence(connection="heartbeat-lost", nanny_silent=True,
                          accounting=acct("node-fail", "NODE_FAIL", node="hpcn2")))
    assert (v.cause, v.blame) == ("node-failure", False)
    assert "node hpcn2 failed while idle, after the worker had fallen silent (it never came back)" in v.text, v.text


def test_a_silent_worker_that_registers_again_makes_its_death_final_and_says_so():
    state = SchedulerState()
    now = [1000.0]
    col = evidence.EvidenceCollector(state, clock=lambda: now[0], flush=lambda: None)
    state.add_worker("tcp://10.77.0.12:4000", 1, 990.0, name="w1", info={"job_id": "7", "nanny_id": "n1"})

    async def run():
        record = col.worker_removed("tcp://10.77.0.12:4000", "heartbeat-lost", None)
        assert record["final_at"] is None                   # the nanny may still report
        col.nanny_unanswered("n1")
        assert "did not answer either" in record["text"] and record["final_at"] is None
        now[0] += 25
        state.add_worker("tcp://10.77.0.12:4000", 1, now[0], name="w1", info={"job_id": "7", "nanny_id": "n1"})
        col.reattached("tcp://10.77.0.12:4000")
        return record

    record = asyncio.run(run())
    assert record["final_at"] == 1025.0 and record["cause"] == "heartbeat-lost" and not record["blame"]
    assert "came back 25 s later and was reattached" in record["text"], record["text"]
    # A later worker at another address is not taken for it; a second registration changes nothing.
    col.reattached("tcp://10.77.0.12:4000")
    assert len(state.deaths) == 1


def test_a_fresh_worker_after_a_crash_is_not_a_reattachment():
    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    state.add_worker("tcp://w:1", 1, 990.0, name="w1", info={"job_id": "7", "nanny_id": "n1"})

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        col.reattached("tcp://w:1")                   # only a worker removed as silent can come back
        return record

    record = asyncio.run(run())
    assert record["final_at"] is None and "reattached" not in record["text"]


def test_a_quiet_node_declared_down_after_our_first_90_s_is_still_node_failure(monkeypatch):
    # SLURM marks a silent node DOWN after SlurmdTimeout (300 s by default): its jobs say RUNNING
    # until then. The collector used to stop asking after its 12 tries (~90 s) and leave the
    # death "connection lost"; it keeps asking while the job runs and no nanny spoke.
    running = {**acct("running", "RUNNING", job_id="5"), "final": False}
    failed = acct("node-fail", "NODE_FAIL", job_id="5", node="hpcn2", requested_memory=2**30, time_limit=600)
    source = _Growing([running] * 16 + [failed])
    monkeypatch.setattr(evidence, "BACKOFF", (0.01,) * 6)
    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    col.source = source
    state.add_worker("tcp://w:1", 1, 990.0, name="w", info={"job_id": "5", "nanny_id": "n1"})

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        col.nanny_gone("n1")                             # the node died with the nanny on it
        await asyncio.wait_for(col._task, 5)
        return record

    record = asyncio.run(run())                          # 6 tries of its own, then the quiet node's
    assert source.calls == 17 and record["cause"] == "node-failure", record["text"]


def test_a_stopped_worker_without_a_nanny_is_final_after_the_usual_tries(monkeypatch):
    # SIGSTOP, no nanny: nobody can speak for it, and its job runs on. The quiet-node wait (for
    # a nanny that went silent) must not hold its verdict open for 10 minutes (CI: the sigstop
    # scenario had no final verdict in 180 s).
    running = {**acct("running", "RUNNING", job_id="5"), "final": False}
    source = _Growing([running] * 30)
    record = _collect_from(source, monkeypatch)
    assert source.calls == 6 and record["final_at"] is not None


class _DownThenBack(FixedAccounting):
    """slurmdbd stopped: sacct fails `down` times, then answers."""

    def __init__(self, down, record):
        self.down, self.record, self.calls = down, record, 0

    async def accounting(self, job_ids):
        self.calls += 1
        if self.calls <= self.down:
            raise RuntimeError("sacct failed (exit 1): sacct: error: Problem talking to the database: Connection refused")
        return {"5": self.record}


def test_with_accounting_down_a_reported_death_is_final_on_the_nannys_word_then_corrected(monkeypatch):
    monkeypatch.setattr(evidence, "BACKOFF", (0.01,) * 12)
    monkeypatch.setattr(evidence, "ACCOUNTING_DOWN_GRACE", 0.03)
    oom = acct("out-of-memory", "OUT_OF_MEMORY", job_id="5", requested_memory=2**30, time_limit=600)
    source = _DownThenBack(8, oom)
    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    col.source = source
    seen = []
    col.verdicts.append(lambda r: seen.append((source.calls, r["cause"], r["final_at"] is not None, list(r["evidence"]))))
    state.add_worker("tcp://w:1", 1, 990.0, name="w", info={"job_id": "5", "nanny_id": "n1"})

    async def run():
        record = col.worker_removed("tcp://w:1", "closed", None)
        col.exit_report({"nanny_id": "n1", "signal": 9, "exit_code": None, "pid": 7})
        await asyncio.wait_for(col._task, 5)
        return record

    record = asyncio.run(run())
    early = [s for s in seen if s[2] and s[0] <= 8]
    assert early, seen                                   # final while sacct still failed
    assert early[0][1] == "unknown" and any("accounting: not available (sacct failed" in e for e in early[0][3])
    assert record["cause"] == "memory-batch" and record["final_at"] is not None     # corrected once back
    assert not any("not available" in e for e in record["evidence"])


def test_a_killed_nanny_is_read_from_the_jobs_accounting_not_called_a_network_fault():
    # Found on the real SLURM: the nanny SIGKILLed, its job FAILED 0:9, and the verdict said
    # "connection-lost ... check the network" even once that record was in.
    v = diagnose(Evidence(connection="closed", executing=RUNNING,
                          accounting=acct("failed", "FAILED", exit_code=0, signal=9)))
    assert (v.cause, v.blame) == ("unknown", False)
    assert "main process (the nanny, or the worker without one) was killed by SIGKILL from outside" in v.text
    assert "FAILED 0:9" in v.text and "network" not in v.advice


def test_a_requeued_job_is_the_batch_system_taking_it_back_not_a_retirement():
    # scontrol requeue: SIGTERM to the job (the worker leaves cleanly), the job pending again.
    for connection, intent in (("goodbye", None), ("closed", "scale-down")):
        v = diagnose(Evidence(connection=connection, intent=intent, executing=RUNNING,
                              accounting={**acct("pending", "REQUEUED"), "final": False}))
        assert (v.cause, v.blame) == ("preempted", False), v.text
        assert "requeued by the batch system" in v.text and "will start again" in v.text


def test_a_worker_back_after_slurm_declared_its_node_failed_is_a_node_failure(monkeypatch):
    # Found on the multi-node cluster: a node cut off for good was marked DOWN (its job NODE_FAIL)
    # between two of our 30 s questions; its link came back, the worker reattached, and its death
    # was made final as "came back ... reattached" before the accounting was asked again.
    monkeypatch.setattr(evidence, "BACKOFF", (0.01, 0.01, 30.0))
    back = {"now": False}

    class Source(FixedAccounting):
        def __init__(self):
            self.calls = 0

        async def accounting(self, job_ids):
            self.calls += 1
            if back["now"]:
                return {"5": acct("node-fail", "NODE_FAIL", job_id="5", node="hpcn2", requested_memory=1,
                                  time_limit=600)}
            return {"5": {**acct("running", "RUNNING", job_id="5", node="hpcn2"), "final": False}}

    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    col.source = source = Source()
    state.add_worker("tcp://10.77.0.12:4000", 1, 990.0, name="w", info={"job_id": "5"})

    async def run():
        record = col.worker_removed("tcp://10.77.0.12:4000", "heartbeat-lost", None)
        await wait_until_async(lambda: source.calls >= 2, 5, "two questions")     # now waiting 30 s
        back["now"] = True
        col.reattached("tcp://10.77.0.12:4000")
        await wait_until_async(lambda: record["final_at"] is not None, 5, "the verdict")
        col._task.cancel()
        return record

    record = asyncio.run(run())
    assert record["cause"] == "node-failure", record["text"]
    assert "once the batch system had declared the node failed" in record["text"], record["text"]


def test_the_accounting_of_an_ended_job_is_remembered_for_its_leftover_workers(monkeypatch):
    # scheduler/links.py refuses a lost worker coming back at an address in ended_workers (a node
    # declared failed whose link came back with the worker still running).
    record, col = _collect({"5": acct("node-fail", "NODE_FAIL", node="hpcn2", requested_memory=1, time_limit=60)},
                           monkeypatch=monkeypatch)
    assert record["cause"] == "node-failure"
    assert col.ended_workers == {"tcp://w:1": "job 5 NODE_FAIL"}
