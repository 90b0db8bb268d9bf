"""The shared test helpers do what the tests lean on (tests/helpers: wait, fakes, tasks)."""

from __future__ import annotations

import asyncio
import functools
import time
import types

import pytest

from hpc_cluster.adapters.base import BatchError
from hpc_cluster.scheduler.state import SchedulerState
from helpers import aio, capture, files, fixtures, funcs, sims, slurm, wire
from helpers.ask import task_counts, worker_pids
from helpers.cli import run_cli
from helpers.fakes import STATUS_ERROR, FakeAdapter, ScriptedRunner
from helpers.tasks import computes, sent, task
from helpers.wait import WaitTimeout, wait_for_file, wait_until, wait_until_async


def test_wait_until_returns_the_value_and_fails_naming_what_it_waited_for():
    seen = iter([0, None, "here"])
    assert wait_until(lambda: next(seen), 5, interval=0.001) == "here"
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"after 0.05 s waiting for the moon") as caught:
        wait_until(lambda: False, 0.05, "the moon")
    assert time.monotonic() - t0 >= 0.05          # (no upper bound: a loaded machine may oversleep)
    # Callers catch either to add what they saw (the SLURM scenarios TimeoutError, SGE's AssertionError).
    assert isinstance(caught.value, AssertionError) and isinstance(caught.value, TimeoutError)


def test_wait_until_async_lets_the_loop_run_meanwhile():
    async def run():
        box = []
        asyncio.get_running_loop().call_later(0.02, box.append, 7)
        return await wait_until_async(lambda: box and box[0], 5)

    assert asyncio.run(run()) == 7
    with pytest.raises(WaitTimeout):
        asyncio.run(wait_until_async(lambda: None, 0.02))


def test_wait_for_file_returns_when_it_appears_or_at_the_deadline(tmp_path):
    gate = tmp_path / "gate"
    t0 = time.monotonic()
    assert wait_for_file(str(gate), 0.05) == str(gate) and not gate.exists()
    assert time.monotonic() - t0 >= 0.05
    gate.touch()
    assert wait_for_file(str(gate), 30) == str(gate)


def test_fake_adapter_numbers_jobs_reports_states_and_fails_when_told():
    spec = types.SimpleNamespace(worker_command="w", worker_index=3, memory=10)
    adapter = FakeAdapter(first_id=101)
    assert [adapter.submit(adapter.render(spec)) for _ in range(2)] == ["101", "102"]
    assert adapter.scripts == ["w #3 mem=10"] * 2
    adapter.states["102"] = "running"
    assert {j: s.state for j, s in adapter.status(["101", "102"], within=5).items()} == {
        "101": "pending", "102": "running"}
    assert adapter.status_calls[0][1:] == (["101", "102"], 5)
    adapter.cancel(["101"])
    assert adapter.cancelled == ["101"] and adapter.status(["101"])["101"].raw_state == "CANCELLED"
    adapter.fail = 1
    with pytest.raises(BatchError, match="Socket timed out"):
        adapter.status(["101"])
    assert STATUS_ERROR.startswith("squeue") and adapter.status(["101"])
    with pytest.raises(BatchError, match="too large"):
        FakeAdapter(refuse="array too large").submit("x")


def test_scripted_runner_answers_by_prefix_records_and_refuses_the_unexpected():
    runner = ScriptedRunner([(["qstat", "-f"], (0, "out", "")), (["qstat"], (1, "", "err"))])
    assert runner.run(["qstat", "-f", "1"]).stdout == "out"
    assert runner.run(["qstat", "2"], input="x").returncode == 1
    assert runner.calls == [(["qstat", "-f", "1"], None), (["qstat", "2"], "x")]
    assert runner.commands == [["qstat", "-f", "1"], ["qstat", "2"]]
    with pytest.raises(AssertionError, match="unexpected command"):
        runner.run(["qdel", "1"])


def test_task_builds_an_update_graph_entry_the_state_machine_places():
    assert task("b", ["a"], memory=None, retries=2) == {"key": "b", "func": task("x")["func"], "args": task("x")["args"],
                                                         "deps": ["a"], "priority": 0, "retries": 2}
    s = SchedulerState(prefetch=0)
    s.add_worker("w", nthreads=1, now=0)
    s.update_graph("c", [task("a"), task("b", ["a"])], ["b"])
    out = s.take_outbox()
    # b goes ahead to wait for a on w (state/ahead.py): sent, but not placed yet
    assert [m["key"] for m in sent(out, "w")] == ["a", "b"] and computes(out, "w") == ["a"]


def test_run_runs_a_coroutine_and_a_timeout_stops_a_hung_one():
    async def answer():
        await asyncio.sleep(0)
        return 42

    assert aio.run(answer()) == 42 and aio.run(answer(), timeout=5) == 42
    with pytest.raises(asyncio.TimeoutError):
        aio.run(asyncio.sleep(30), timeout=0.05)


def test_run_cli_gives_the_exit_code_and_output_of_argparse_exits_too(capsys):
    code, out, err = run_cli(capsys, "--help")
    assert code == 0 and "usage" in out.lower() and err == ""
    code, out, err = run_cli(capsys, "no-such-command")
    assert code == 2 and "invalid choice" in err


def test_the_capture_scripts_save_verbatim_and_say_so_unless_told(tmp_path, capsys):
    capture.saver(tmp_path)("a.txt", "one\ntwo\n")
    capture.saver(tmp_path, say=False)("b.txt", "x")
    assert (tmp_path / "a.txt").read_text() == "one\ntwo\n" and (tmp_path / "b.txt").read_text() == "x"
    assert capsys.readouterr().out == "  wrote a.txt (2 lines)\n"
    done = capture.command(["sh", "-c", "cat; echo err >&2; exit 3"], input="in")
    assert (done.returncode, done.stdout, done.stderr) == (3, "in", "err\n")


def test_the_slurm_captures_ask_in_the_adapters_own_formats(monkeypatch):
    from hpc_cluster.adapters.slurm_text import SACCT_FIELDS, SQUEUE_FORMAT
    asked = []
    monkeypatch.setattr(capture, "command", lambda argv, **kw: asked.append((argv, kw)) or types.SimpleNamespace(
        stdout="out"))
    assert capture.slurm_squeue(["1", "2"]) == capture.slurm_squeue({"a": "3"}.values(), header=False) == "out"
    assert capture.slurm_sacct(["4"]) == "out"
    assert asked == [(["squeue", "-t", "all", "-j", "1,2", "-o", SQUEUE_FORMAT], {"check": True}),
                     (["squeue", "-h", "-t", "all", "-j", "3", "-o", SQUEUE_FORMAT], {"check": True}),
                     (["sacct", "-P", "-j", "4", "--format=" + ",".join(SACCT_FIELDS)], {"check": True})]


def test_fixtures_are_read_by_system_and_bash_n_fails_with_bashs_message_and_the_script():
    assert fixtures.fixture("slurm", "sbatch_parsable.txt") == fixtures.manifest("slurm")["jobs"]["completed"] + "\n"
    with pytest.raises(FileNotFoundError):
        fixtures.fixture("slurm", "no-such-capture.txt")
    fixtures.bash_n("#!/bin/bash\necho 'fine'\n")
    with pytest.raises(AssertionError, match=r"syntax error[\s\S]*---\nif then"):
        fixtures.bash_n("if then\n")


def test_the_simulators_job_logs_under_tmp_path_and_a_suite_binds_its_defaults(tmp_path):
    job = sims.sim_job(tmp_path, "true", walltime=60)
    assert (job.worker_command, job.job_name, job.walltime, job.memory, job.log_directory) == (
        "true", "simjob", 60, 512 * 2**20, str(tmp_path / "logs"))
    suites = functools.partial(sims.sim_job, walltime=600, batch_options={"disk": 1})
    job = suites(tmp_path, "x", walltime=2, memory=7)
    assert (job.walltime, job.memory, job.batch_options) == (2, 7, {"disk": 1})


def test_squeue_ids_lists_the_queue_and_a_failing_squeue_raises_unless_told(tmp_path):
    import subprocess
    squeue = tmp_path / "squeue"
    squeue.write_text('#!/bin/sh\n[ "$*" = "-h -o %i" ] || exit 9\nprintf "12\\n13_1\\n12\\n"\n')
    squeue.chmod(0o755)
    assert slurm.squeue_ids(str(squeue)) == {"12", "13_1"}
    squeue.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Socket timed out' >&2\nexit 1\n")
    with pytest.raises(subprocess.CalledProcessError):
        slurm.squeue_ids(str(squeue))
    assert slurm.squeue_ids(str(squeue), check=False) == set()


def test_the_simulators_state_numbers_jobs_saves_them_whole_and_reads_directives(tmp_path, monkeypatch, capsys):
    import simstate     # beside pbssim.py (the simulators' own processes import it from there)
    monkeypatch.delenv("X_SIM_HOME", raising=False)
    with pytest.raises(SystemExit) as stopped:
        simstate.sim_home("X_SIM_HOME", "xsim")
    assert stopped.value.code == 2 and capsys.readouterr().err.startswith("xsim: set X_SIM_HOME")
    monkeypatch.setenv("X_SIM_HOME", str(tmp_path / "home"))
    home = simstate.sim_home("X_SIM_HOME", "xsim")
    assert home == str(tmp_path / "home") and (tmp_path / "home" / "jobs").is_dir()
    assert [simstate.next_seq(home) for _ in range(2)] == [1, 2]
    (tmp_path / "home" / "jobs" / "2").mkdir()
    simstate.save(home, 2, {"b": 1, "a": [2]}, indent=1)
    assert list(simstate.load(home, 2).items()) == [("b", 1), ("a", [2])]
    assert [p.name for p in (tmp_path / "home" / "jobs" / "2").iterdir()] == ["job.json"]    # renamed into place
    script = "#!/bin/bash\n\n#PBS -N 'a b'\n# a comment\n#BSUB -q x\n#PBS -l walltime=1:00\necho hi\n#PBS -q late\n"
    assert simstate.directives(script, "#PBS") == ["-N", "a b", "-l", "walltime=1:00"]
    assert simstate.directives(script, "#BSUB") == ["-q", "x"]


def _finds_the_helpers_package():
    import importlib.util
    return importlib.util.find_spec("helpers") is not None


def test_the_task_functions_travel_by_value_to_workers_that_cannot_import_them(client):
    # The workers' sys.path lacks tests/: helpers/funcs.py's functions reach them by value.
    assert client.submit(_finds_the_helpers_package).result(30) is False
    assert client.submit(funcs.inc, 1).result(30) == 2 and client.submit(funcs.add, 2, 3).result(30) == 5
    assert client.submit(funcs.grow, 3 << 20, chunk=1 << 20, pause=0).result(30) == 3 << 20


def test_asking_a_cluster_counts_its_tasks_and_names_its_workers_pids(client):
    gate = client.submit(funcs.sleep_then, 1, 0.5, pure=False)
    assert sum(task_counts(client, timeout=10).values()) >= 1
    pids = worker_pids(client)
    assert len(pids) == 2 and all(isinstance(p, int) and p > 0 for p in pids.values())
    assert gate.result(30) == 1


def test_read_message_reads_one_whole_message_however_it_arrives_and_files_mode(tmp_path):
    import socket
    import struct
    a, b = socket.socketpair()
    with a, b:
        body = struct.pack("<Q", 3) + b"abc"
        sent = struct.pack("<IQ", 1, len(body)) + body
        a.sendall(sent[:5])
        a.sendall(sent[5:] + b"next")
        assert wire.read_message(b) == sent and b.recv(4) == b"next"
        a.close()
        with pytest.raises(ConnectionError, match="closed after 0 of 12 bytes"):
            wire.read_message(b)
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0o600)
    assert files.mode(secret) == 0o600
