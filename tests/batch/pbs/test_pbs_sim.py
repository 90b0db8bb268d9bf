"""PBSAdapter end to end against the command-level PBS simulator (tests/helpers/pbs_sim).

Real jobs run here: each test submits a rendered script with `qsub`, polls `qstat`
until the job is final, and checks the record the adapter reads back.
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

from hpc_cluster.adapters.pbs import PBSAdapter

from hpc_cluster.runners.local import LocalRunner
from helpers.sims import run_to_end, sim_job
from helpers.wait import wait_until

MiB = 1024**2


@pytest.fixture
def sim(sim, tmp_path):
    """tests/conftest.py's simulator, with a logs directory for the jobs."""
    (tmp_path / "logs").mkdir()
    return sim


spec = functools.partial(sim_job, walltime=60)


def test_completed_job(sim, tmp_path):
    adapter = PBSAdapter(LocalRunner())
    job_id, rec = run_to_end(adapter, spec(tmp_path, 'echo "hello from $PBS_JOBID in $PWD"'))
    assert job_id.endswith(".pbssim")
    assert (rec.state, rec.exit_code, rec.signal) == ("completed", 0, None)
    assert rec.node and rec.start and rec.end
    assert rec.time_limit == 60 and rec.requested_memory == 512 * MiB
    out = (tmp_path / "logs" / f"simjob.o{job_id.split('.')[0]}").read_text()
    assert out == f"hello from {job_id} in {tmp_path}\n"     # cd'd to PBS_O_WORKDIR


def test_exit_code_three_is_failed(sim, tmp_path):
    # The worker command is exec'd (no epilogue): it must be a program, not a shell builtin.
    _, rec = run_to_end(PBSAdapter(LocalRunner()), spec(tmp_path, "bash -c 'exit 3'"))
    assert (rec.state, rec.exit_code, rec.raw_state) == ("failed", 3, "F Exit_status=3")


def test_segfault_of_the_execd_worker(sim, tmp_path):
    # Without an epilogue the worker is the job's top process: the MOM records 256 + 11.
    command = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"
    _, rec = run_to_end(PBSAdapter(LocalRunner()), spec(tmp_path, command))
    assert (rec.state, rec.exit_code, rec.signal) == ("failed", 267, 11)


def test_segfault_inside_the_script(sim, tmp_path):
    # With an epilogue the shell stays and exits with the worker's status, 128 + 11.
    command = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"
    _, rec = run_to_end(PBSAdapter(LocalRunner()), spec(tmp_path, command, epilogue=["echo epilogue"]))
    assert (rec.state, rec.exit_code, rec.signal) == ("failed", 139, 11)


def test_walltime_kill(sim, tmp_path):
    job_id, rec = run_to_end(PBSAdapter(LocalRunner()), spec(tmp_path, "sleep 60", walltime=2))
    assert (rec.state, rec.exit_code) == ("timeout", -29)
    assert rec.time_limit == 2 and rec.elapsed >= 2
    err = (tmp_path / "logs" / f"simjob.e{job_id.split('.')[0]}").read_text()
    assert "=>> PBS: job killed: walltime" in err


def test_memory_kill(sim, tmp_path):
    hog = (f"{sys.executable} -c 'import time; x = bytearray(300 * 1024 * 1024); "
           f"x[::4096] = b\"x\" * len(x[::4096]); time.sleep(60)'")
    job_id, rec = run_to_end(PBSAdapter(LocalRunner()), spec(tmp_path, hog, memory=100 * MiB))
    assert (rec.state, rec.exit_code) == ("out-of-memory", -27)
    assert rec.requested_memory == 100 * MiB
    assert rec.max_rss > rec.requested_memory
    err = (tmp_path / "logs" / f"simjob.e{job_id.split('.')[0]}").read_text()
    assert "=>> PBS: job killed: mem" in err


def test_qdel_of_a_running_job(sim, tmp_path):
    adapter = PBSAdapter(LocalRunner())
    job_id = adapter.submit(adapter.render(spec(tmp_path, "sleep 60")))
    wait_until(lambda: adapter.status([job_id])[job_id].state == "running", 10, "running", interval=0.1)
    adapter.cancel([job_id])
    rec = wait_until(lambda: (r := adapter.accounting([job_id])[job_id]).final and r, 10, "cancel", interval=0.1)
    assert (rec.state, rec.exit_code, rec.signal) == ("cancelled", 271, 15)
    adapter.cancel([job_id])                          # already finished: not an error


def test_qdel_of_a_held_job_and_unknown_ids(sim, tmp_path):
    adapter = PBSAdapter(LocalRunner())
    job_id = adapter.submit(adapter.render(spec(tmp_path, "true", extra_directives=["-h"])))
    status = adapter.status([job_id, "999.pbssim"])
    assert status[job_id].state == "pending" and status[job_id].raw_state == "H"
    assert status["999.pbssim"].state == "unknown"
    assert adapter.accounting(["999.pbssim"]) == {}
    adapter.cancel([job_id])
    rec = adapter.accounting([job_id])[job_id]
    assert (rec.state, rec.exit_code) == ("cancelled", None)


def test_torque_flavor_falls_back_to_text(sim, tmp_path, monkeypatch):
    monkeypatch.setenv("PBS_SIM_FLAVOR", "torque")
    adapter = PBSAdapter(LocalRunner())
    _, rec = run_to_end(adapter, spec(tmp_path, "sleep 60", walltime=1))
    assert adapter._json is False
    assert (rec.state, rec.raw_state) == ("timeout", "C exit_status=-11")
    assert rec.start and rec.end                     # start_time and comp_time


def test_many_jobs_in_one_qstat_call(sim, tmp_path):
    calls = []

    class CountingRunner(LocalRunner):
        def run(self, argv, *args, **kw):
            calls.append(list(argv))
            return super().run(argv, *args, **kw)

    adapter = PBSAdapter(CountingRunner())
    ids = [adapter.submit(adapter.render(spec(tmp_path, f"bash -c 'exit {n}'"))) for n in range(3)]
    calls.clear()
    records = wait_until(lambda: (r := adapter.accounting(ids)) and all(x.final for x in r.values())
                         and len(r) == 3 and r, 20, "three jobs to end", interval=0.1)
    assert [records[i].exit_code for i in ids] == [0, 1, 2]
    assert all(c[0] == "qstat" and set(ids) <= set(c) for c in calls)


def test_simulator_text_and_json_read_the_same(sim, tmp_path, monkeypatch):
    """The long, wrapped `qstat -f` text must parse to the same record as the JSON."""
    from hpc_cluster.adapters.pbs import parse_qstat_full, parse_qstat_json
    # A long PATH becomes a long PBS_O_PATH in Variable_List, which qstat wraps.
    monkeypatch.setenv("PATH", os.environ["PATH"] + "".join(f":/opt/tool{n}/bin" for n in range(20)))
    adapter = PBSAdapter(LocalRunner())
    job_id, _ = run_to_end(adapter, spec(tmp_path, "bash -c 'exit 5'"))
    runner = LocalRunner()
    text = runner.run(["qstat", "-x", "-f", job_id]).stdout
    assert "\n\t" in text                           # wrapped continuation lines
    (from_text,) = parse_qstat_full(text)
    (from_json,) = parse_qstat_json(runner.run(["qstat", "-x", "-f", "-F", "json", job_id]).stdout)
    from_text.raw = from_json.raw = ""
    assert from_text == from_json
    assert from_text.exit_code == 5
