"""What the simulator tests share: putting a simulator on PATH for one test, the job they run,
running an adapter's job to its end, and, for the deploy tests, the wait for a final verdict
(the tasks they submit are helpers/funcs.py's)."""

from __future__ import annotations

import os
from pathlib import Path

import cloudpickle

from hpc_cluster.adapters.base import JobSpec
from helpers.wait import wait_until


def use_simulator(monkeypatch, sim, home: Path, home_var: str, **env: str) -> Path:
    """`sim` (tests/helpers/lsf_sim or tests/helpers/htcondor_sim, a module with cleanup and live_pids) on PATH,
    its state in `home`; returns `home`. Call `stop_simulator` after the test."""
    home.mkdir()
    monkeypatch.setenv(home_var, str(home))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bin_dir = Path(sim.__file__).resolve().parent / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return home


def stop_simulator(sim, home: Path) -> None:
    sim.cleanup(str(home))
    wait_until(lambda: not sim.live_pids(str(home)), 15, "simulator processes to exit")


def run_to_end(adapter, job_spec, timeout: float = 20):
    """Submit, poll status until the job is no longer pending or running and accounting has its
    record; (job id, accounting record)."""
    job_id = adapter.submit(adapter.render(job_spec))
    record = wait_until(lambda: (adapter.accounting([job_id]).get(job_id) or None)
                        if adapter.status([job_id])[job_id].state not in ("pending", "running")
                        else None, timeout, f"job {job_id} to end", interval=0.1)
    return job_id, record


def sim_job(tmp_path: Path, command: str, walltime: int, memory: int = 512 * 2**20, **kw) -> JobSpec:
    """The simulator suites' job: `command`, named simjob, 512 MiB unless told, its logs in
    tmp_path/logs (the suites make it). Each suite binds its own walltime and batch_options."""
    return JobSpec(worker_command=command, job_name="simjob", walltime=walltime, memory=memory,
                   log_directory=str(tmp_path / "logs"), **kw)


def cancel_running(adapter, job_id: str):
    """Cancel a job once it runs; its final accounting record."""
    wait_until(lambda: adapter.status([job_id])[job_id].state == "running", 10, f"job {job_id} to run", interval=0.1)
    adapter.cancel([job_id])
    return wait_until(lambda: (r := adapter.accounting([job_id])[job_id]).final and r, 10, "the cancel", interval=0.1)


# -- verdicts for the deploy tests ----------------------------------------------------------------
def final_death(client, predicate, timeout=90) -> dict:
    """The first death matching `predicate`, once its verdict is final (accounting read)."""
    def final():
        found = [d for d in client.deaths() if predicate(d)]
        return found[0] if found and found[0].get("final_at") is not None else None
    return wait_until(final, timeout, "a final verdict", interval=0.3)


import sys  # noqa: E402
cloudpickle.register_pickle_by_value(sys.modules[__name__])
