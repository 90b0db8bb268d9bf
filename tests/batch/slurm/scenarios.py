"""Worker deaths staged for real on the SLURM test cluster, each with its own SLURMCluster.

Each scenario makes one kind of death happen (walltime, cgroup OOM, a segfault, a cancel,
preemption, a node failure ...) under a real computation, then reads back what the user
would see: the death record (`client.deaths()`), the exception, `client.why()`, and every
other result. It returns a plain outcome dict; test_scenarios.py asserts on it and
docs/why-did-my-worker-die.md quotes it. Nothing is mocked: the jobs are real, the kills
are the kernel's, SLURM's or ours from outside, as they would be on a production cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import cloudpickle

from hpc_cluster.deploy.cluster import SLURMCluster

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from slurm_jobs import job_pids, restore_node, wait_for  # noqa: E402
from helpers.funcs import grow, segfault, sleep_then, slow_inc, slow_square  # noqa: E402
from helpers.scenarios import VERDICT_TIMEOUT, deployed  # noqa: E402
from helpers.wait import wait_until  # noqa: E402
from helpers.slurm import squeue_ids  # noqa: E402

# The task functions below travel by value: the workers cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MB = 10**6


# ---------------------------------------------------------------------------- tasks

def hard_exit(code=1):
    os._exit(code)


def segfault_after(seconds: float):
    """A crash a moment after the task starts: the tasks queued behind it reach its worker first."""
    import ctypes
    import time
    time.sleep(seconds)
    ctypes.string_at(0)


# ---------------------------------------------------------------------------- helpers

# The engine a scenario's clusters run (with_engine): ours unless said. Per thread, since the
# scenarios run side by side in threads.
_engine = threading.local()


def with_engine(engine: str, fn):
    """Scenario `fn` staged on `engine` ("distributed": distributed's scheduler and workers,
    the user's client distributed's; helpers.scenarios.DistributedClients): the same staging."""
    def staged(*args):
        _engine.name = engine
        try:
            return fn(*args)
        finally:
            _engine.name = None
    staged.__name__ = getattr(fn, "__name__", "scenario")
    return staged


def on_slurm(name: str, nanny: bool, log_dir: Path, jobs: int = 1, **kwargs):
    """helpers.scenarios.deployed: a SLURMCluster named sc-<name>, with `jobs` workers up, its
    outcome named after the scenario; closed, and its jobs gone from squeue, on exit."""
    kwargs = {"cores": 1, "memory": "300MB", "walltime": "00:10:00", **kwargs}
    if getattr(_engine, "name", None):
        kwargs["engine"] = _engine.name
    cluster = SLURMCluster(log_directory=str(log_dir / f"{name}-{'nanny' if nanny else 'bare'}"),
                           nanny=nanny, name=f"sc-{name}", **kwargs)
    # A failing squeue lists no job: the outcome is recorded either way, and the test says so.
    return deployed(cluster, lambda: squeue_ids(check=False), jobs, outcome={"scenario": name, "nanny": nanny})


def capture(fut) -> dict:
    """What .result() gave: the value, or the exception's type, message and attributes."""
    try:
        return {"value": fut.result(timeout=VERDICT_TIMEOUT)}
    except Exception as exc:  # the scenario asserts on what it was
        return {"error": type(exc).__name__, "message": str(exc), "cause": getattr(exc, "cause", None),
                "advice": getattr(exc, "advice", None), "evidence": getattr(exc, "evidence", None),
                "attempts": getattr(exc, "attempts", None)}


def capture_error(fut, timeout: float) -> str | None:
    """'ExceptionType: message' of a future that failed (None if it finished)."""
    exc = fut.exception(timeout=timeout)
    return None if exc is None else f"{type(exc).__name__}: {exc}"


def wrong_results(futures, expected) -> list:
    """Indexes of futures whose result is not the expected one (or that failed)."""
    bad = []
    for i, (f, want) in enumerate(zip(futures, expected)):
        got = capture(f)
        if got.get("value") != want:
            bad.append((i, got.get("value", got.get("error"))))
    return bad


# ---------------------------------------------------------------------------- scenarios

def walltime(nanny: bool, log_dir: Path, long_at: int = 38) -> dict:
    """1-minute jobs on 2 workers running 2-second tasks. Workers drain ahead of the walltime
    (walltime_margin: 12 s for a 1-minute job) and leave as `retired`; one 50-second task,
    started ~40 s into a job, is still running when SLURM's time limit ends that job: a
    `walltime` death, not charged, and the task reruns on a fresh job. SLURM checks time
    limits every 30 s, so it ends a 1-minute job 60-90 s in: the 50 s task is certain to be
    running then only if it starts 40 s in or later (`long_at`), and before the drain at 48 s.
    (Not much longer: a rerun must fit a fresh job, what it ran before plus 10 %.) It may run
    only on that job's worker or a later job's (this_job_or_later)."""
    with on_slurm("walltime", nanny, log_dir, jobs=2, walltime="00:01:00") as run:
        n = 60
        futs = run.client.map(slow_square, range(n))
        job = wait_until(lambda: old_enough(run.jobs(), long_at), 120, f"a job {long_at} s into its minute",
                         interval=0.5)
        long = run.client.submit(sleep_then, 42, 50, key="long-50s", priority=10,
                                 workers=this_job_or_later(job, run.jobs()))
        run.outcome["long"] = capture(long)
        bad = wrong_results(futs, [x * x for x in range(n)])
        run.jobs()
        deaths = [run.death(lambda d, i=i: d["id"] == i) for i in [d["id"] for d in run.client.deaths()]]
        killed = [d for d in deaths if "long-50s" in d["executing"]]
        run.record(killed[0] if killed else deaths[0])
        run.outcome.update(wrong=bad, deaths=deaths, charged_any=any(d["blame"] for d in deaths),
                           why=run.client.why(long))
        return run.outcome


def old_enough(jobs: dict, long_at: int) -> dict | None:
    """A running job, not leaving, whose worker is `long_at` to `long_at` + 3 s into it: its
    running 2 s task ends, and the long one starts, before the drain at 48 s even on a loaded
    machine (a job that is past the window is skipped: the next job comes into it)."""
    ok = [j for j in jobs.values() if j.get("worker_names") and not j.get("retiring")
          and long_at <= (j.get("uptime") or 0) < long_at + 3]
    return max(ok, key=lambda j: j["uptime"]) if ok else None


def this_job_or_later(job: dict, jobs: dict) -> list[str]:
    """The long task's workers: this job's, or a job's submitted after now (NAME-<index>), not
    the other job running now. The two jobs may start seconds apart (under load, tens): on the
    younger one the 50 s task could end before its kill, and no death would have run it. A
    later job is where it reruns after its walltime death."""
    prefix = job["worker_names"][0].rsplit("-", 1)[0]
    last = max(j["index"] for j in jobs.values())
    return list(job["worker_names"]) + [f"{prefix}-{i}" for i in range(last + 1, last + 50)]


def batch_oom(nanny: bool, log_dir: Path) -> dict:
    """A task needs ~1 GB in a 300 MB job: the kernel's OOM killer (cgroup) ends it."""
    # With a nanny, its own memory kill is turned off, so the kernel kills first. (A budget
    # above the job's memory no longer does it: as in dask, a worker's memory limit is capped
    # at its cgroup's, and the nanny would stop the worker at 95% of that.)
    extra = {"memory_terminate_fraction": False} if nanny else {}
    with on_slurm("batch-oom", nanny, log_dir, jobs=1, allowed_failures=0, **extra) as run:
        hog = run.client.submit(grow, 1 << 30, chunk=4 << 20, key="hog-1GB")
        normal = run.client.map(slow_inc, range(20), delay=0.1)
        run.outcome["error"] = capture(hog)
        run.outcome["wrong"] = wrong_results(normal, [x + 1 for x in range(20)])
        run.record(run.death(lambda d: "hog-1GB" in d["executing"]))
        run.outcome["why"] = run.client.why(hog)
        run.jobs()
        return run.outcome


def nanny_memory(nanny: bool, log_dir: Path) -> dict:
    """The nanny's budget (300 MB) is below the job's 1 GB: the nanny stops the worker."""
    with on_slurm("nanny-memory", nanny, log_dir, jobs=1, memory="1GB", memory_limit="300MB",
                  allowed_failures=0) as run:
        hog = run.client.submit(grow, 800 * MB, chunk=4 << 20, key="hog-800MB")
        normal = run.client.map(slow_inc, range(20), delay=0.1)
        run.outcome["error"] = capture(hog)
        run.outcome["wrong"] = wrong_results(normal, [x + 1 for x in range(20)])
        run.record(run.death(lambda d: "hog-800MB" in d["executing"]))
        run.outcome["why"] = run.client.why(hog)
        return run.outcome


def _crash(name: str, func, nanny: bool, log_dir: Path) -> dict:
    with on_slurm(name, nanny, log_dir, jobs=1, allowed_failures=0) as run:
        bad = run.client.submit(func, key=f"{name}-task")
        normal = run.client.map(slow_inc, range(20), delay=0.1)
        run.outcome["error"] = capture(bad)
        run.outcome["wrong"] = wrong_results(normal, [x + 1 for x in range(20)])
        run.record(run.death(lambda d: f"{name}-task" in d["executing"]))
        run.outcome["why"] = run.client.why(bad)
        run.jobs()
        return run.outcome


def segfault_task(nanny: bool, log_dir: Path) -> dict:
    return _crash("segfault", segfault, nanny, log_dir)


def exit_task(nanny: bool, log_dir: Path) -> dict:
    return _crash("exit1", hard_exit, nanny, log_dir)


def _kill_busy_worker(name: str, nanny: bool, log_dir: Path, kill, jobs: int = 2, **kwargs) -> dict:
    """A 10 s task runs on one of two workers; `kill(run, worker_row)` ends that worker."""
    with on_slurm(name, nanny, log_dir, jobs=jobs, **kwargs) as run:
        long = run.client.submit(sleep_then, 42, 10, key=f"{name}-long")
        w = run.worker_of(lambda w: w["executing"] >= 1, what="the long task to start")
        normal = run.client.map(slow_inc, range(20), delay=0.1)
        try:
            kill(run, w)
            run.record(run.death(lambda d: d["worker"] == w["address"]))
            run.outcome["long"] = capture(long)
            run.outcome["wrong"] = wrong_results(normal, [x + 1 for x in range(20)])
            run.outcome["why"] = run.client.why(long)
            run.outcome["killed_job"] = str(w["job_id"])
        finally:
            run.outcome.setdefault("cleanup", []).append(getattr(kill, "cleanup", lambda r, w: None)(run, w))
        return run.outcome


def _scancel(run, w):
    subprocess.run(["scancel", str(w["job_id"])], check=True, timeout=60)


def scancel(nanny: bool, log_dir: Path) -> dict:
    return _kill_busy_worker("scancel", nanny, log_dir, _scancel)


def _sigstop(run, w):
    os.kill(int(w["pid"]), signal.SIGSTOP)
    run.outcome["stopped_pid"] = int(w["pid"])


def _sigcont(run, w):
    try:
        os.kill(int(w["pid"]), signal.SIGCONT)
        return "SIGCONT sent"
    except ProcessLookupError:
        return "already gone"


_sigstop.cleanup = _sigcont


def sigstop(nanny: bool, log_dir: Path) -> dict:
    return _kill_busy_worker("sigstop", nanny, log_dir, _sigstop)


def scale_down(nanny: bool, log_dir: Path) -> dict:
    """scale(2) -> scale(1) while 40 one-second tasks run: the worker that leaves is 'retired'."""
    with on_slurm("scale-down", nanny, log_dir, jobs=2) as run:
        futs = run.client.map(slow_square, range(40), seconds=1.0)
        wait_for(lambda: sum(f.done() for f in futs) >= 4, 120, "some tasks to finish")
        run.cluster.scale(1)
        run.record(run.death())
        run.outcome["wrong"] = wrong_results(futs, [x * x for x in range(40)])
        run.jobs()
        return run.outcome


def preempted(log_dir: Path) -> list[dict]:
    """Workers in 'low' (20 GB each) lose their job to a 20 GB job in 'high'. Run one after
    the other (nanny, then none): two 20 GB jobs in 'low' could not both fit the node."""
    return [preempt_busy_worker(nanny, log_dir) for nanny in (True, False)]


def preempt_busy_worker(nanny: bool, log_dir: Path, memory_mb: int = 20_000, on_its_node: bool = False) -> dict:
    """A busy worker in 'low' (`memory_mb`) loses its job to a job as big in 'high'. On a cluster
    of several nodes (`on_its_node`) the preemptor is sent to the worker's node: elsewhere it
    would just start, preempting nothing."""
    preemptor = None

    def submit_preemptor(run, w):
        nonlocal preemptor
        where = ["-w", w["host"]] if on_its_node else []
        res = subprocess.run(["sbatch", "--parsable", "-p", "high", f"--mem={memory_mb}M", "-n", "1", *where,
                              "-J", "sc-preemptor", "-o", "/dev/null", "--wrap", "sleep 8"],
                             capture_output=True, text=True, check=True, timeout=60)
        preemptor = res.stdout.strip().split(";")[0]
        run.outcome["preemptor"] = preemptor

    def cancel_preemptor(run, w):
        if preemptor:
            subprocess.run(["scancel", preemptor], timeout=60)
        return f"preemptor {preemptor} cancelled"
    submit_preemptor.cleanup = cancel_preemptor
    return _kill_busy_worker("preempted", nanny, log_dir, submit_preemptor, jobs=1, queue="low",
                             memory=f"{memory_mb}MB")


def startup(nanny: bool, log_dir: Path) -> dict:
    """The job cannot start its worker: a bad python= (nanny) or a failing prologue (none)."""
    bad = ({"python": "/nonexistent/python"} if nanny
           else {"job_script_prologue": ["module load does-not-exist/1.0"]})
    with on_slurm("startup", nanny, log_dir, jobs=0, **bad) as run:
        waiting = run.client.submit(slow_inc, 1, delay=0.1)              # work that no worker will ever run
        run.cluster.scale(1)
        table = wait_for(lambda: (t := run.cluster.status_table())["halted"] and t, 240,
                         "the cluster to halt submissions", interval=1)
        # It fails, saying why, instead of waiting forever; so does work submitted now.
        run.outcome["waiting"] = capture_error(waiting, 30)
        run.outcome["later"] = capture_error(run.client.submit(slow_inc, 2, delay=0.1), 30)
        try:
            run.client.wait_for_workers(1, timeout=30)
        except Exception as exc:  # the scenario asserts on what it was
            run.outcome["wait_for_workers"] = f"{type(exc).__name__}: {exc}"
        wait_for(lambda: len([d for d in run.client.deaths() if d["cause"] == "startup"]) >= 3, 60,
                 "three startup deaths")
        first = run.death(lambda d: d["cause"] == "startup")
        run.record(first)
        n_jobs = len(run.jobs())
        # Halted means no new submission over the next polls (the job manager polls every 2 s).
        t0 = time.monotonic()
        wait_for(lambda: time.monotonic() - t0 > 8, 20, "8 s to pass")
        run.outcome.update(halted=table["halted"], jobs_at_halt=n_jobs, jobs_later=len(run.jobs()),
                           startup_deaths=[d for d in run.client.deaths() if d["cause"] == "startup"])
        return run.outcome


def node_failure(node: str, log_dir: Path) -> list[dict]:
    """Both variants at once (one node to fail): each cluster runs a long task; the node dies
    (its slurmd and the jobs' processes killed, marked down), then comes back."""
    runs, stack = [], []
    outs = []
    try:
        for nanny in (True, False):
            cm = on_slurm("node-failure", nanny, log_dir, jobs=1, job_extra_directives=["--no-requeue"])
            run = cm.__enter__()
            stack.append(cm)
            long = run.client.submit(sleep_then, 42, 10, key="nf-long")
            normal = run.client.map(slow_inc, range(20), delay=0.1)
            w = run.worker_of(lambda w: w["executing"] >= 1, what="the long task to start")
            runs.append((run, long, normal, w))
        job_ids = [str(w["job_id"]) for _, _, _, w in runs]
        for jid in job_ids:
            wait_for(lambda j=jid: job_pids(j), 30, f"processes of job {jid}")
        os.kill(int(Path("/run/slurm/slurmd.pid").read_text()), signal.SIGKILL)
        for jid in job_ids:
            for pid in job_pids(jid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                        "reason=hpc-cluster scenario: node failure"], check=True, timeout=60)
        # Bring the node back as soon as SLURM has ended the jobs: other jobs wait on it.
        wait_for(lambda: not (set(job_ids) & squeue_ids(check=False)), 60, f"jobs {job_ids} to end")
        restore_node(node)
        for run, long, normal, w in runs:
            run.record(run.death(lambda d, a=w["address"]: d["worker"] == a))
        for run, long, normal, w in runs:
            run.outcome["long"] = capture(long)
            run.outcome["wrong"] = wrong_results(normal, [x + 1 for x in range(20)])
            run.outcome["why"] = run.client.why(long)
            run.jobs()
            outs.append(run.outcome)
    finally:
        restore_node(node)
        while stack:
            stack.pop().__exit__(None, None, None)
    return outs


SCENARIOS = {
    "walltime": (walltime, (True, False)),
    "memory-batch": (batch_oom, (True, False)),
    "memory-nanny": (nanny_memory, (True,)),
    "segfault": (segfault_task, (True, False)),
    "exit1": (exit_task, (True, False)),
    "scancel": (scancel, (True, False)),
    "scale-down": (scale_down, (True, False)),
    "startup": (startup, (True, False)),
    "sigstop": (sigstop, (True, False)),
}


def safely(fn, *args) -> dict | list:
    """Run a scenario; an exception becomes an outcome saying so (the tests then fail on it)."""
    t0 = time.monotonic()
    try:
        out = fn(*args)
    except Exception as exc:
        out = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    for o in (out if isinstance(out, list) else [out]):
        o["wall"] = round(time.monotonic() - t0, 1)
    return out


# -- what the tests assert of every outcome (test_scenarios.py, test_scenario_node_failure.py)
def outcome(outcomes, name, nanny) -> dict:
    o = outcomes[(name, nanny)]
    assert "failed" not in o, o.get("traceback") or o["failed"]
    assert o["jobs"] and not o["left_in_queue"], f"jobs left in squeue: {o['left_in_queue']}"
    return o


def forensics(o) -> str:
    """What SLURM and the kernel say of a scenario's jobs, for a failing assertion's message:
    sacct's record of each job and step, and the kernel's OOM kills in their cgroups (which
    process it picked: the worker, or the job's slurmstepd, which shares its memory cgroup and
    cannot protect itself where root lacks CAP_SYS_RESOURCE, as on our CI machines)."""
    ids = o.get("jobs") or []
    if not ids:
        return "(no jobs recorded)"
    sacct = subprocess.run(["sacct", "-n", "-P", "-j", ",".join(ids), "-o",
                            "JobID,State,ExitCode,Start,End,MaxRSS,ReqMem"],
                           capture_output=True, text=True, timeout=60).stdout.strip()
    kernel = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=60).stdout.splitlines()
    oom = [line for line in kernel if ("oom-kill:" in line or "reap" in line)
           and any(f"/job_{j}/" in line or f"/job_{j}," in line for j in ids)]
    return f"sacct:\n{sacct}\nkernel OOM kills in these jobs' cgroups:\n" + ("\n".join(oom) or "(none)")


def all_correct(o):
    assert o["wrong"] == [], f"other results wrong or failed: {o['wrong']}"


def innocent(o, cause):
    """Not the task's fault: not charged, its task rerun elsewhere, every other result right."""
    assert (o["cause"], o["blame"]) == (cause, False), o["death"]["text"]
    assert o["long"] == {"value": 42}, o["long"]      # the task it was running was rerun elsewhere
    assert o["death"]["executing"], "the worker should have died mid-task"
    all_correct(o)


@contextmanager
def own_config(base: Path):
    """Our own cluster files and no site config for the clusters of a module's scenarios."""
    import pytest
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(base / "xdg"))
        mp.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(base / "etc"))
        for k in ("HPC_CLUSTER_CONFIG", "HPC_CLUSTER_SITE"):
            mp.delenv(k, raising=False)
        yield
