"""The `hpc-cluster` command without a batch system: arguments, exit codes, help, advice,
stale cluster files, job scripts, and `progress()` on a real LocalCluster.

Commands that need a running cluster on SLURM are in tests/batch/slurm/test_deploy.py.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_cluster import progress
from hpc_cluster.cli import cluster as cli_cluster
from hpc_cluster.cli import build_parser
from hpc_cluster.cli.lookup import plan_file
from hpc_cluster.cli.views import job_event, jobs_table, print_deaths
from hpc_cluster.protocol.clusterfile import cluster_file_for, new_secret, write_cluster_file
from helpers.cli import run_cli

SLURM_SITE = """\
default: lab
sites:
  lab:
    batch: slurm
    cores: 2
    memory: 1GB
    walltime: "00:10:00"
    queue: debug
    log_directory: {logs}
    job_script_prologue: ["echo 'prologue with a quote'"]
"""


@pytest.fixture(autouse=True)
def own_config_home(isolated_home):
    """Cluster files and user config under tmp: nothing of the real user is read or touched."""
    return isolated_home


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def fake_cluster(name: str, pid: int, address: str = "tcp://127.0.0.1:1") -> Path:
    return write_cluster_file(cluster_file_for(name), address, new_secret(), name=name, pid=pid,
                              batch="slurm", site="lab", log_directory=None, daemon_log=None)


# -- usage errors and help ------------------------------------------------------------

def test_no_command_prints_help_and_exits_2(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2 and "up" in err and "exit codes:" in err


def test_unknown_command_and_bad_numbers_are_usage_errors(capsys):
    assert run_cli(capsys, "launch")[0] == 2
    code, _, err = run_cli(capsys, "scale", "many")
    assert code == 2 and "invalid int value" in err
    code, _, err = run_cli(capsys, "scale", "-5")
    assert code == 2 and ">= 0" in err


def test_bad_cluster_name_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "up", "--name", "../escape", "-n", "1")
    assert code == 2 and "bad cluster name" in err
    assert not (cluster_file_for("x").parent.parent / "escape.json").exists()


def example_commands(help_text: str) -> list[list[str]]:
    """The hpc-cluster invocations in a help's examples: env prefixes, comments (two spaces or
    more), redirections and `&& other` commands cut off."""
    commands = []
    for line in help_text.split("examples:")[1].split("exit codes:")[0].splitlines():
        for part in line.split("&&"):
            part = re.split(r" {2,}| > | \| ", part.strip())[0]
            words = shlex.split(part)
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words.pop(0)
            if words[:1] == ["hpc-cluster"]:
                commands.append(words[1:])
    return commands


@pytest.mark.parametrize("command", ["up", "status", "scale", "list", "logs", "why", "job-script", "down",
                                     "config", "config check", "config init", "config show"])
def test_each_subcommand_help_has_real_examples_and_exit_codes(capsys, command):
    code, out, _ = run_cli(capsys, *command.split(), "--help")
    assert code == 0
    assert "examples:" in out and f"hpc-cluster {command}" in out.split("examples:")[1]
    examples = example_commands(out)
    own = [argv for argv in examples if " ".join(argv).startswith(command)]
    assert len(own) >= (1 if command in ("list", "config") else 2), out
    # Every example is a command line the parser accepts.
    parser = build_parser()
    for argv in examples:
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"help example `hpc-cluster {' '.join(argv)}` is not a valid command line")
    if command != "config":
        assert "exit codes:" in out and "0  " in out.split("exit codes:")[1]
    if not command.startswith("config"):
        assert "3  no such cluster" in out


def test_console_script_is_installed_and_documents_exit_codes():
    res = subprocess.run(["hpc-cluster", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for line in ("0  ok", "1  the operation failed", "2  usage error", "3  no such cluster"):
        assert line in res.stdout
    assert "hpc-cluster up -n 4" in res.stdout


def test_up_with_a_local_site_is_refused_with_advice(capsys, tmp_path):
    cfg = tmp_path / "local.yaml"
    cfg.write_text("default: here\nsites:\n  here:\n    batch: local\n")
    code, _, err = run_cli(capsys, "up", "--config", str(cfg), "-n", "1")
    assert code == 2 and "batch: slurm, pbs or sge" in err
    assert not cluster_file_for("default").exists()


def test_up_with_a_broken_config_is_exit_2_with_the_file_named(capsys, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("default: lab\nsites:\n  lab:\n    batch: slurm\n    coers: 4\n")
    code, _, err = run_cli(capsys, "up", "--config", str(cfg))
    assert code == 2 and "bad configuration" in err and "coers" in err and "cores" in err


# -- no cluster / stale clusters ------------------------------------------------------

@pytest.mark.parametrize("argv", [["list"], ["status"], ["status", "nope"], ["down"], ["why"],
                                  ["logs", "123"], ["scale", "2"], ["down", "nope"]])
def test_no_cluster_is_exit_3_with_advice(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 3, (out, err)
    assert "hpc-cluster up" in err
    if "nope" in argv:
        assert "no cluster named 'nope'" in err


def test_not_found_lists_the_running_clusters(capsys):
    fake_cluster("alpha", os.getpid())
    fake_cluster("beta", os.getpid())
    code, _, err = run_cli(capsys, "status", "gamma")
    assert code == 3 and "running clusters: alpha, beta" in err
    code, _, err = run_cli(capsys, "status")
    assert code == 2 and "several clusters are running (alpha, beta)" in err
    assert "e.g. `hpc-cluster status alpha`" in err


@pytest.mark.parametrize("argv, example", [(["scale", "4"], "scale 4 alpha"), (["scale", "--jobs", "2"], "scale --jobs 2 alpha"),
                                           (["logs", "123"], "logs 123 alpha"), (["why"], "why alpha"),
                                           (["why", "f-1"], "why f-1 alpha")])
def test_with_several_clusters_the_advice_repeats_the_command_typed(capsys, argv, example):
    # Issue 34 papercut: `scale 4` with two clusters running suggested `hpc-cluster status alpha`.
    fake_cluster("alpha", os.getpid())
    fake_cluster("beta", os.getpid())
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and f"e.g. `hpc-cluster {example}`" in err, err


def test_list_removes_stale_cluster_files_and_says_so(capsys):
    stale = fake_cluster("old", dead_pid())
    plan = plan_file("old")
    plan.write_text("{}")
    code, out, err = run_cli(capsys, "list")
    assert code == 3
    assert "removed the stale cluster file of 'old'" in err
    assert not stale.exists() and not plan.exists()


def test_list_shows_a_cluster_whose_daemon_does_not_answer(capsys):
    fake_cluster("mute", os.getpid())
    code, out, err = run_cli(capsys, "list")
    assert code == 0
    row = [ln for ln in out.splitlines() if ln.startswith("mute")][0]
    assert "tcp://127.0.0.1:1" in row and str(os.getpid()) in row and "not answering" in row


def test_status_of_a_stale_cluster_is_3_and_down_cleans_it(capsys):
    path = fake_cluster("gone", dead_pid())
    code, _, err = run_cli(capsys, "status", "gone")
    assert code == 3 and "is not running" in err and "hpc-cluster down gone" in err
    code, out, _ = run_cli(capsys, "down", "gone")
    assert code == 0 and "removed its stale cluster file" in out
    assert not path.exists()


def test_status_of_an_unreachable_daemon_is_1_with_advice(capsys):
    fake_cluster("mute", os.getpid())
    code, _, err = run_cli(capsys, "status", "mute")
    assert code == 1 and "does not answer" in err and "hpc-cluster down mute" in err


def test_why_alone_with_a_cluster_name_means_the_cluster(capsys):
    fake_cluster("solo", dead_pid())
    # the one positional names a cluster, so it is not taken as a worker/job/key
    code, _, err = run_cli(capsys, "why", "solo")
    assert code == 3 and "cluster 'solo' is not running" in err


# -- job-script ------------------------------------------------------------------------

def test_job_script_for_a_slurm_site_is_valid_bash(capsys, tmp_path):
    cfg = tmp_path / "site.yaml"
    cfg.write_text(SLURM_SITE.format(logs=tmp_path / "logs"))
    code, out, err = run_cli(capsys, "job-script", "--config", str(cfg), "--name", "mine")
    assert code == 0, err
    assert out.startswith("#!/usr/bin/env bash")
    for line in ("#SBATCH --cpus-per-task=2", "#SBATCH -t 00:10:00", "#SBATCH -p debug",
                 f"#SBATCH -o {tmp_path / 'logs'}/%x-%j.out", "#SBATCH -J dask-worker"):
        assert line in out
    assert str(cluster_file_for("mine")) in out and "-m hpc_cluster.worker" in out
    assert '--name "mine-${HPC_CLUSTER_WORKER_INDEX:-0}"' in out   # workers: the cluster's name + job index
    script = tmp_path / "job.sh"
    script.write_text(out)
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_job_script_for_a_pbs_site(capsys, tmp_path):
    cfg = tmp_path / "pbs.yaml"
    cfg.write_text("default: p\nsites:\n  p:\n    batch: pbs\n    cores: 4\n    memory: 2GB\n")
    code, out, _ = run_cli(capsys, "job-script", "--config", str(cfg))
    assert code == 0 and "#PBS -l select=1:ncpus=4" in out
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0


def test_a_site_without_cores_or_memory_is_refused_with_advice(capsys, tmp_path):
    # dask-jobqueue requires both; so do `job-script` and `up`, before anything starts.
    cfg = tmp_path / "site.yaml"
    cfg.write_text("default: p\nsites:\n  p:\n    batch: slurm\n    cores: 2\n")
    for command in (["job-script"], ["up", "-n", "1", "--name", "nomem"]):
        code, out, err = run_cli(capsys, *command, "--config", str(cfg))
        assert code == 2, (command, out, err)
        assert "does not say how many cores and how much memory a job asks for (memory unset)" in err
        assert "`memory: 16GB`" in err and "jobqueue.slurm" in err
    assert not cluster_file_for("nomem").exists()


def test_a_template_with_an_undefined_variable_is_a_config_error(capsys, tmp_path):
    template = tmp_path / "site.sh.j2"
    template.write_text("#!/bin/bash\n{{ sitee_modules }}\nexec {{ worker_command }}\n")
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"default: p\nsites:\n  p:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"
                   f"    template: {template}\n")
    for command in (["job-script"], ["up", "-n", "1", "--name", "tpl"]):
        code, out, err = run_cli(capsys, *command, "--config", str(cfg))
        assert code == 2, (command, out, err)
        assert f"template={str(template)!r}, line 2: 'sitee_modules' is undefined" in err
    # `up` refused before starting anything.
    assert not cluster_file_for("tpl").exists() and not plan_file("tpl").exists()


# -- logs: which files belong to a job ---------------------------------------------------

def test_job_log_files_match_the_job_id_exactly(tmp_path):
    names = ["hpc-cluster-123.out", "hpc-cluster-123.err", "hpc-cluster-1234.out", "x-5123.out",
             "slurm-123.out", "hpc-cluster.o123", "hpc-cluster.e123", "hpc-cluster.o1230", "notes.txt"]
    for n in names:
        (tmp_path / n).write_text("")
    got = {p.name for p in cli_cluster._job_log_files(tmp_path, "123")}
    assert got == {"hpc-cluster-123.out", "hpc-cluster-123.err", "slurm-123.out",
                   "hpc-cluster.o123", "hpc-cluster.e123"}
    assert {p.name for p in cli_cluster._job_log_files(tmp_path, "123.pbsserver")} == got


# -- views: robust to what the records hold ---------------------------------------------

def test_job_events_read_like_the_queue():
    assert job_event({"job_id": "7", "state": "pending", "reason": "Resources"}) == "job 7: pending (Resources)"
    assert job_event({"job_id": "7", "state": "running", "node": "vm"}) == "job 7: running on vm"
    assert job_event({"job_id": "7", "state": "timeout", "raw_state": "TIMEOUT"}) == "job 7: timeout"
    assert job_event({"job_id": "7", "state": "failed", "raw_state": "NODE_FAIL"}) == "job 7: failed (NODE_FAIL)"


def test_jobs_table_hides_old_finished_jobs():
    rows = [{"job_id": str(i), "state": "completed", "raw_state": "COMPLETED"} for i in range(15)]
    rows.append({"job_id": "99", "state": "running", "node": "vm", "worker_names": ["w-99"],
                 "uptime": 65, "time_left": 3600, "memory": 2_000_000_000})
    text = jobs_table(rows, max_finished=3)
    lines = text.splitlines()
    assert lines[0].split() == ["JOB", "STATE", "WORKERS", "NODE", "UPTIME", "TIME", "LEFT", "MEMORY"]
    assert lines[1].split() == ["99", "running", "w-99", "vm", "1m05s", "1h00m", "2GB"]
    assert [ln.split()[0] for ln in lines[2:5]] == ["12", "13", "14"]
    assert "12 older finished job(s) not shown" in text
    # with its workers' reports: what they use, what they spilled, how many are paused
    rows[-1].update(memory_used=1_200_000_000, spilled=3_400_000_000, paused=1)
    assert jobs_table(rows, max_finished=0).splitlines()[1].endswith("1.2GB of 2GB, 3.4GB spilled, 1 paused")


def test_deaths_print_with_missing_fields():
    buf = io.StringIO()
    print_deaths([{"worker": "tcp://h:1"}, {"name": "w-3", "cause": "memory-batch", "blame": True,
                   "text": "over --mem", "executing": ["k-1"], "processing": ["k-1", "k-2"],
                   "evidence": {"sacct": "OUT_OF_MEMORY 0:125"}, "log_tail": ["a", "b", "c"],
                   "job_id": "77", "advice": "raise memory="}],
                 buf, detail=True, tail=2)
    text = buf.getvalue()
    assert "tcp://h:1  unknown  blame ?" in text
    assert "w-3  memory-batch  blamed on its task" in text and "executing: k-1" in text
    assert "also queued there (not charged): 1 task(s)" in text
    assert "job 77" in text and "what to do: raise memory=" in text
    assert "sacct: OUT_OF_MEMORY 0:125" in text
    assert "| b" in text and "| c" in text and "| a" not in text


def test_death_matching_by_worker_job_and_key():
    d = {"worker": "tcp://n1:4000", "name": "big-1", "job_id": "123", "executing": ["parse-1"],
         "processing": ["parse-1", "sum-2"]}
    match = cli_cluster._death_matches
    assert match(d, "tcp://n1:4000") and match(d, "big-1") and match(d, "123")
    assert match(d, "parse-1") and match(d, "sum-2")
    assert not match(d, "12") and not match(d, "1234") and not match(d, "other")
    assert not match(d, "1")                       # job 1, not the worker of index 1
    assert match({"name": "big-0", "job_id": "77.pbs-server"}, "77")


# -- progress() ------------------------------------------------------------------------------

def _slow(x):
    time.sleep(0.02)
    if x == 3:
        raise ValueError("three")
    return x


def test_progress_plain_lines_when_not_a_tty(client):
    futures = client.map(_slow, range(40))
    out = io.StringIO()
    start = time.monotonic()
    assert progress(futures, file=out) is futures
    assert time.monotonic() - start < 60
    assert all(f.done() for f in futures)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[-1].startswith("40/40 done, 1 erred, ") and lines[-1].endswith(" s")
    assert 2 <= len(lines) <= 12          # at most ~one per 10 %, plus the first and the last
    counts = [int(ln.split("/")[0]) for ln in lines]
    assert counts == sorted(counts)


def test_progress_redraws_one_line_on_a_real_tty(client):
    master, slave = os.openpty()
    tty = os.fdopen(slave, "w")
    try:
        assert tty.isatty()
        futures = client.map(_slow, range(100, 130))
        progress(futures, file=tty, interval=0.05)
        tty.flush()
        chunks = []
        while select.select([master], [], [], 0.5)[0]:
            data = os.read(master, 65536)
            if not data:
                break
            chunks.append(data)
    finally:
        tty.close()
        os.close(master)
    text = b"".join(chunks).decode()
    assert text.startswith("\r[") and "\r[####################] 30/30 done" in text
    assert text.count("\n") == 1 and text.rstrip().endswith(" s")   # one line, redrawn in place


def test_progress_of_nothing_returns_at_once():
    out = io.StringIO()
    assert progress([], file=out) == []
    assert out.getvalue() == "0/0 done, 0.0 s\n"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
