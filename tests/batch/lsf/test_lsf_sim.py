"""LSFAdapter end to end against the command-level LSF simulator (tests/helpers/lsf_sim): each test
submits a rendered script with bsub, polls bjobs until the job ends, and checks the record the
adapter reads back."""

from __future__ import annotations

import functools
import sys

import pytest

from hpc_cluster.adapters.lsf import LSFAdapter
from hpc_cluster.runners.local import LocalRunner

import lsfsim  # noqa: E402
from helpers.sims import cancel_running, run_to_end, sim_job, stop_simulator, use_simulator  # noqa: E402

MiB = 2**20


@pytest.fixture
def lsf_sim(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    monkeypatch.chdir(tmp_path)
    home = use_simulator(monkeypatch, lsfsim, tmp_path / "lsf_sim_home", "LSF_SIM_HOME", **{"LSF_SIM_MINUTE": "2", "LSF_SIM_UNITS": "mb"})
    yield home
    stop_simulator(lsfsim, home)


def adapter() -> LSFAdapter:
    a = LSFAdapter(LocalRunner())
    a.configure({"lsf_units": "mb"})
    return a


spec = functools.partial(sim_job, walltime=600, batch_options={"lsf_units": "mb"})


def test_completed_job_and_its_output(lsf_sim, tmp_path):
    job_id, rec = run_to_end(adapter(), spec(tmp_path, 'echo "hello from $LSB_JOBID"'))
    assert (rec.state, rec.exit_code, rec.signal, rec.raw_state) == ("completed", 0, None, "DONE")
    assert rec.requested_memory == 537 * MiB          # -M 537 (MB, 1000-based as dask-jobqueue) read back
    assert rec.time_limit == 600 and rec.node
    assert (tmp_path / "logs" / f"simjob-{job_id}.out").read_text() == f"hello from {job_id}\n"


def test_exit_code_and_segfault(lsf_sim, tmp_path):
    _, rec = run_to_end(adapter(), spec(tmp_path, "bash -c 'exit 3'"))
    assert (rec.state, rec.exit_code, rec.signal) == ("failed", 3, None)
    segv = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"
    _, rec = run_to_end(adapter(), spec(tmp_path, segv))
    assert (rec.state, rec.exit_code, rec.signal) == ("failed", 139, 11)


def test_run_limit_is_a_timeout_with_sigusr2(lsf_sim, tmp_path):
    _, rec = run_to_end(adapter(), spec(tmp_path, "sleep 60", walltime=60))     # -W 00:01: 2 s here
    assert (rec.state, rec.exit_code, rec.signal) == ("timeout", 140, 12)
    assert rec.time_limit == 60 and rec.elapsed >= 60
    assert rec.raw_state == "EXIT (TERM_RUNLIMIT: job killed after reaching LSF run time limit)"


def test_memory_limit_is_out_of_memory(lsf_sim, tmp_path):
    hog = (f"{sys.executable} -c 'import time; x = bytearray(300 * 1024 * 1024); "
           f"x[::4096] = b\"x\" * len(x[::4096]); time.sleep(60)'")
    _, rec = run_to_end(adapter(), spec(tmp_path, hog, memory=100 * 10**6))
    assert rec.state == "out-of-memory" and rec.signal == 2            # SIGINT first, as LSF sends
    assert rec.requested_memory == 100 * MiB and rec.max_rss > rec.requested_memory


def test_bkill_of_a_running_job_and_unknown_ids(lsf_sim, tmp_path):
    a = adapter()
    job_id = a.submit(a.render(spec(tmp_path, "sleep 60")))
    rec = cancel_running(a, job_id)
    assert (rec.state, rec.cancelled_by) == ("cancelled", "the job's owner")
    a.cancel([job_id])                                  # already finished: quiet
    assert a.status(["424242"])["424242"].state == "unknown" and a.accounting(["424242"]) == {}
