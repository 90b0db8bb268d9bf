"""HTCondorAdapter end to end against the command-level HTCondor simulator (tests/helpers/htcondor_sim):
each test submits a rendered submit description with condor_submit, polls condor_q /
condor_history until the job ends, and checks the record the adapter reads back."""

from __future__ import annotations

import functools
import os
import sys
import time

import pytest

from hpc_cluster.adapters.htcondor import HTCondorAdapter
from hpc_cluster.runners.local import LocalRunner

import condorsim  # noqa: E402
from helpers.sims import cancel_running, run_to_end, sim_job, stop_simulator, use_simulator  # noqa: E402

MiB = 2**20


@pytest.fixture
def condor_sim(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    monkeypatch.chdir(tmp_path)
    home = use_simulator(monkeypatch, condorsim, tmp_path / "htcondor_sim_home", "CONDOR_SIM_HOME", **{"CONDOR_SIM_PERIODIC": "0.5"})
    yield home
    stop_simulator(condorsim, home)


def adapter() -> HTCondorAdapter:
    return HTCondorAdapter(LocalRunner())


spec = functools.partial(sim_job, walltime=600, batch_options={"disk": 10**9})     # HTCondor needs disk=


def test_completed_job_its_id_and_output(condor_sim, tmp_path):
    job_id, rec = run_to_end(adapter(), spec(tmp_path, 'echo "job $HPC_CLUSTER_JOB_ID said \'hi\' at $(date +%Y)"'))
    assert (rec.state, rec.exit_code, rec.signal) == ("completed", 0, None)
    assert rec.requested_memory == 512 * MiB and rec.time_limit == 600 and rec.node
    out = (tmp_path / "logs" / f"worker-{job_id}.out").read_text()
    assert out == f"job {job_id} said 'hi' at {time.strftime('%Y')}\n"      # quoting and macros survived


def test_exit_code_and_signal(condor_sim, tmp_path):
    _, rec = run_to_end(adapter(), spec(tmp_path, "bash -c 'exit 3'"))
    assert (rec.state, rec.exit_code, rec.signal) == ("failed", 3, None)
    segv = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"
    _, rec = run_to_end(adapter(), spec(tmp_path, segv))
    assert (rec.state, rec.exit_code, rec.signal) == ("failed", None, 11)


def test_the_periodic_remove_clock_is_whole_seconds_as_htcondors():
    # time() and JobCurrentStartDate are integers in HTCondor: a 2 s limit from a start
    # recorded as 100 fires at time() 103, never at 102.5 (CI: a job removed after 1.1 s)
    expr = "(JobStatus == 2) && (time() - JobCurrentStartDate > HpcClusterWalltime)"
    ad = {"JobStatus": 2, "JobCurrentStartDate": 100, "HpcClusterWalltime": 2}
    assert not condorsim.evaluate(expr, ad, 102.9)
    assert condorsim.evaluate(expr, ad, 103.0)


def test_walltime_is_our_periodic_remove(condor_sim, tmp_path):
    _, rec = run_to_end(adapter(), spec(tmp_path, "sleep 60", walltime=2))
    assert (rec.state, rec.time_limit) == ("timeout", 2) and rec.elapsed >= 2
    assert "HpcClusterWalltime" in rec.raw_state and rec.raw_state.startswith("Removed; removed: The job attribute")


def test_memory_over_request_is_held_then_removed(condor_sim, tmp_path):
    hog = (f"{sys.executable} -c 'import time; x = bytearray(300 * 1024 * 1024); "
           f"x[::4096] = b\"x\" * len(x[::4096]); time.sleep(60)'")
    a = adapter()
    job_id, rec = run_to_end(a, spec(tmp_path, hog, memory=100 * MiB))
    assert rec.state == "out-of-memory" and rec.requested_memory == 100 * MiB
    assert rec.max_rss > rec.requested_memory and "Job has gone over cgroup memory limit of 100 megabytes" in rec.raw_state
    # The held job was removed by the adapter: it left the queue, its history says why.
    time.sleep(0.5)
    again = HTCondorAdapter(LocalRunner()).accounting([job_id])[job_id]
    assert again.state == "out-of-memory" and "via condor_rm" in again.raw_state


def test_condor_rm_of_a_running_job_and_unknown_ids(condor_sim, tmp_path):
    a = adapter()
    job_id = a.submit(a.render(spec(tmp_path, "sleep 60")))
    rec = cancel_running(a, job_id)
    assert (rec.state, rec.cancelled_by) == ("cancelled", os.environ.get("USER", "root"))
    a.cancel([job_id])                                  # already gone: quiet
    assert a.status(["4242.0"])["4242.0"].state == "unknown" and a.accounting(["4242.0"]) == {}
