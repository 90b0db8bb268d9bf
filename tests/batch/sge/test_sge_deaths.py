"""Worker deaths staged for real on the one-host Grid Engine, each with its own SGECluster.

Every ending here is Grid Engine's own: qmaster's h_rt kill, execd's h_vmem kill, the
kernel's SIGSEGV, a real qdel, a job whose prologue fails. The test asserts what the user is
told: the death's cause and blame, the evidence (qacct's own words), the task's exception,
and that every other result is right and no job is left in the queue. Each test has its own
cluster (names and files under tmp), so they run beside the rest of the suite; all waits are
on conditions, with timeouts.

    python -m pytest -m sge tests/batch/sge -v        (tests/batch/sge/cluster.sh up first, or run as root)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

from hpc_cluster import SGECluster
from helpers.funcs import grow, segfault, sleep_then, square
from helpers.scenarios import VERDICT_TIMEOUT, deployed
from helpers.wait import wait_until

pytestmark = [pytest.mark.sge, pytest.mark.timeout(600)]
cloudpickle.register_pickle_by_value(sys.modules[__name__])     # the workers cannot import this module


# -- tasks --------------------------------------------------------------------------------------
def children_hog(mb, n=2):
    """What a task that runs tools does: `n` child processes of `mb` MB each, held 30 s."""
    import subprocess
    code = f"import time\nb = []\nfor i in range({mb} // 4):\n    b.append(bytearray(4 << 20)); time.sleep(0.02)\ntime.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    return [p.wait() for p in procs]


# -- helpers --------------------------------------------------------------------------------------
def queued_ids() -> set[str]:
    out = subprocess.run(["qstat"], capture_output=True, text=True, timeout=60, check=True).stdout
    return {line.split()[0] for line in out.splitlines()[2:] if line.strip()}


def on_sge(tmp: Path, name: str, jobs: int = 1, wait: bool = True, **kwargs):
    """helpers.scenarios.deployed: an SGECluster named sge-<name>, its logs under `tmp`, with
    `jobs` workers up (wait=False: asked for, not waited on); on exit closed, and its jobs gone
    from qstat."""
    kwargs = {"cores": 1, "memory": "1GB", "walltime": "00:05:00", **kwargs}
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    return deployed(SGECluster(name=f"sge-{name}", log_directory=str(logs), **kwargs), queued_ids, jobs, wait=wait)


def qacct_words(death: dict) -> str:
    """The accounting evidence of a death, as the user sees it."""
    return "\n".join(death["evidence"])


# -- the tests --------------------------------------------------------------------------------------
def test_a_small_computation_on_sge_workers(gridengine, isolated_home):
    with on_sge(isolated_home, "compute", jobs=2) as run:
        assert "#$ -l h_rt=00:05:00" in run.cluster.job_script()
        futures = run.client.map(square, range(200))
        assert run.client.gather(futures) == [x * x for x in range(200)]
        jobs = run.jobs()
        assert len(jobs) == 2 and all(j["state"] == "running" and j["node"] for j in jobs.values()), jobs
        assert set(jobs) <= queued_ids()                     # real Grid Engine jobs
        assert run.client.deaths() == []


def test_walltime_h_rt_kill_is_walltime_not_charged(gridengine, isolated_home):
    """A 40 s job; a 30 s task started 15 s in is still running when qmaster's h_rt ends the job."""
    with on_sge(isolated_home, "walltime", walltime="00:00:40") as run:
        wait_until(lambda: any((j.get("uptime") or 0) >= 15 for j in run.jobs().values()), 60, "15 s of the job", interval=0.5)
        first = next(iter(run.jobs()))
        long = run.client.submit(sleep_then, 42, 30, key="long-30s")
        death = run.death(lambda d: "long-30s" in d["executing"])
        assert (death["cause"], death["blame"]) == ("walltime", False), death["text"]
        assert death["job_id"] == first
        assert "reached its time limit (00:00:40)" in death["text"], death["text"]
        assert "qmaster enforced h_rt" in qacct_words(death), death["evidence"]
        assert "walltime" in run.client.why(long)
        assert long.result(timeout=120) == 42               # rerun on a fresh job, not failed
        run.jobs()


def test_h_vmem_kill_of_the_job_is_a_batch_memory_fault(gridengine, isolated_home):
    """h_vmem 600M for the job, the workers' budget above it (memory=3GB): the task starts two
    processes of 350 MB, each under h_vmem alone, together over it; execd ends the job (failed 37)."""
    with on_sge(isolated_home, "vmem", memory="3GB", resource_spec="h_vmem=600M", allowed_failures=0) as run:
        assert "#$ -l h_vmem=600M" in run.cluster.job_script()
        hog = run.client.submit(children_hog, 350, key="hog-2x350MB")
        others = run.client.map(square, range(20))
        err = hog.exception(timeout=VERDICT_TIMEOUT)
        death = run.death(lambda d: "hog-2x350MB" in d["executing"])
        assert (death["cause"], death["blame"]) == ("memory-batch", True), death["text"]
        assert type(err).__name__ == "TaskMemoryError" and err.cause == "memory-batch", repr(err)
        assert "qmaster enforced h_rt, h_cpu, or h_vmem limit" in qacct_words(death), death["evidence"]
        assert "the batch system's memory check ended the job: failed 37" in death["text"], death["text"]
        assert "MiB of 600.00 MiB requested" in death["text"], death["text"]     # maxvmem and h_vmem, from qacct
        assert "the job's memory request, what the batch system enforced, was 600.00 MiB" in err.advice, err.advice
        assert run.client.gather(others) == [x * x for x in range(20)]


@pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])
def test_h_vmem_inside_the_worker_fails_the_allocation_not_the_job(gridengine, isolated_home, nanny):
    """h_vmem is also each process's address-space limit, and execd's check counts about the
    resident size: a worker's address space is ~200 MB over that, so the worker's own allocation
    fails first (MemoryError in the task) and the worker lives on. Grid Engine's h_vmem cannot
    end a job for memory the worker itself takes (docs/sge.md)."""
    with on_sge(isolated_home, f"vmem-own-{'n' if nanny else 'b'}", nanny=nanny, memory="3GB",
                  resource_spec="h_vmem=800M") as run:
        hog = run.client.submit(grow, 1500 << 20, chunk=4 << 20, pause=0.05, key="hog-1500MB")
        err = hog.exception(timeout=VERDICT_TIMEOUT)
        assert isinstance(err, MemoryError), repr(err)
        assert run.client.submit(square, 7).result(timeout=60) == 49          # the same worker, alive
        assert run.client.deaths() == []


@pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])
def test_segfault_is_a_crash_charged_to_the_task(gridengine, isolated_home, nanny):
    with on_sge(isolated_home, f"segv-{'n' if nanny else 'b'}", nanny=nanny, allowed_failures=0) as run:
        bad = run.client.submit(segfault, key="segfault-task")
        others = run.client.map(square, range(20))
        err = bad.exception(timeout=VERDICT_TIMEOUT)
        death = run.death(lambda d: "segfault-task" in d["executing"])
        assert (death["cause"], death["blame"]) == ("crash", True), death["text"]
        assert "SIGSEGV" in death["text"] and type(err).__name__ == "TaskCrashedError", death["text"]
        if not nanny:     # the worker was the job: qacct's exit_status 139 is the evidence
            assert "exit_status 139" in qacct_words(death), death["evidence"]
        assert run.client.gather(others) == [x * x for x in range(20)]


def test_qdel_of_a_busy_worker_is_cancelled_and_its_task_reruns(gridengine, isolated_home):
    with on_sge(isolated_home, "qdel", jobs=2) as run:
        long = run.client.submit(sleep_then, 42, 8, key="long-8s")
        wait_until(lambda: any(w.get("executing") for w in run.client.scheduler_info()["workers"].values()),
                 60, "the long task to start", interval=0.2)
        busy = next(w for w in run.client.scheduler_info()["workers"].values() if w.get("executing"))
        subprocess.run(["qdel", str(busy["job_id"])], check=True, capture_output=True, timeout=60)
        death = run.death(lambda d: d["worker"] == busy["address"])
        assert (death["cause"], death["blame"]) == ("cancelled", False), death["text"]
        assert "failed 100 : assumedly after job; exit_status 137" in qacct_words(death), death["evidence"]
        assert long.result(timeout=120) == 42


def test_a_job_whose_prologue_fails_is_a_startup_failure_with_its_log(gridengine, isolated_home):
    with on_sge(isolated_home, "startup", wait=False, job_script_prologue=[
            f"{sys.executable} -c 'import no_such_module_for_sge_test'"]) as run:
        death = run.death(lambda d: True)              # the first death, whatever it is called
        assert death["cause"] == "startup", death
        assert "before its worker registered" in death["text"], death["text"]
        assert any("No module named 'no_such_module_for_sge_test'" in e for e in death["evidence"]), death["evidence"]
        assert "exit_status 1" in qacct_words(death), death["evidence"]


def test_a_job_grid_engine_cannot_start_is_a_startup_failure_and_leaves_no_error_job(gridengine, isolated_home):
    """Its output file cannot be opened: Grid Engine holds the job in error state (Eqw) for
    ever; we report why (qstat -j's reason) and delete it, so nothing is left in the queue."""
    with on_sge(isolated_home, "eqw", wait=False, job_directives_skip=["-o ", "-e "],
                  job_extra_directives=["-o /nonexistent/dir/"]) as run:
        death = run.death(lambda d: True)
        assert death["cause"] == "startup", death
        assert "Eqw: " in death["text"] and "before its worker registered" in death["text"], death["text"]
        assert "can't open output file" in qacct_words(death), death["evidence"]
        gone = death["job_id"]
        wait_until(lambda: gone not in queued_ids(), 60, f"the error-state job {gone} to be deleted", interval=0.5)
