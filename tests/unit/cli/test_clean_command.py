"""`hpc-cluster clean` as a user runs it, a process of its own (issue 34, point 4): the files of
ended clusters go, a live daemon's (a real process recorded in its cluster file as the daemon
records itself), a starting and a resumable cluster's stay, each with why; --json as
docs/cli-json.md documents it; log_retention read from the config."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_cluster.protocol.clusterfile import clusters_dir
from helpers.cli import run_cli
from helpers.leftover_files import aged, daemon_pid, ended_pid, left_by  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("isolated_home")       # clusters_dir() and the config under tmp
DOC = Path(__file__).resolve().parents[3] / "docs" / "cli-json.md"


def run_clean(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "clean", *args], capture_output=True,
                          text=True, timeout=120)


def names() -> list[str]:
    return sorted(p.name for p in clusters_dir().iterdir())


def test_clean_all_removes_ended_clusters_and_says_why_the_others_stay(daemon_pid):
    gone_pid = ended_pid()
    aged(left_by("alive", "cluster", "log", "plan", "tls", pid=daemon_pid), days=30)
    aged(left_by("crashed", "cluster", "log", "plan", "tls", pid=gone_pid), days=30)
    aged(left_by("resumable", "cluster", "journal", "log", pid=gone_pid), days=30)
    left_by("starting", "cluster", "plan")                   # no pid yet: its daemon is starting
    left_by("SLURMCluster-1a2b3c", "log")                    # a class cluster closed a moment ago
    (clusters_dir() / "notes.txt").write_text("the user's own")
    done = run_clean("--all")
    assert done.returncode == 0, done.stderr
    assert names() == [".alive.plan.json", ".starting.plan.json", "alive.json", "alive.log", "alive.tls",
                       "notes.txt", "resumable.journal", "resumable.json", "resumable.log", "starting.json"]
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:] if line.strip()}
    assert "running" in rows["alive"] and "kept: its daemon is running" in rows["alive"]
    assert "kept: its daemon is starting" in rows["starting"]
    assert "stopped" in rows["resumable"] and "hpc-cluster up --name resumable" in rows["resumable"]
    assert rows["crashed"].split()[1:3] == ["ended", "4"] and rows["crashed"].endswith("removed")
    assert rows["SLURMCluster-1a2b3c"].endswith("removed")
    assert "removed 5 file(s)" in done.stdout and "of 2 ended cluster(s) (--all)" in done.stdout
    # Once its daemon is gone, the live one's files are an ended cluster's like any other.
    os.kill(daemon_pid, 9)
    assert run_clean("--older-than", "1d").returncode == 0
    assert names() == [".starting.plan.json", "notes.txt", "starting.json"]


# In this process from here on (helpers/cli.py): the same main() and argv, faster.

def test_json_is_the_documented_schema_and_a_dry_run_removes_nothing(daemon_pid, capsys):
    aged(left_by("gone", "log", "plan"), days=30)
    aged(left_by("alive", "cluster", "log", pid=daemon_pid), days=30)
    before = names()
    code, out, err = run_cli(capsys, "clean", "--dry-run", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert names() == before
    section = DOC.read_text().split("## `hpc-cluster clean --json`")[1].split("\n## ")[0]
    top, each = (set(re.findall(r"^\| `(\w+)` \|", t.split("\n\n")[0], re.M)) for t in section.split("| key |")[1:3])
    assert set(report) == top and all(set(c) == each for c in report["clusters"])
    by = {c["name"]: c for c in report["clusters"]}
    assert report["dry_run"] and report["files"] == 2 and report["older_than"] == 7 * 86400
    assert by["gone"]["remove"] and by["gone"]["removed"] == [] and by["gone"]["files"] == [".gone.plan.json", "gone.log"]
    assert by["alive"]["state"] == "running" and by["alive"]["kept"] == "running" and "running" in by["alive"]["why"]


def test_the_retention_is_the_configs_and_never_keeps_all(capsys, monkeypatch):
    aged(left_by("three-days", "log"), days=3)
    aged(left_by("one-day", "log"), days=1)
    settings = clusters_dir().parent / "config.yaml"
    settings.write_text("settings:\n  log_retention: 2d\n")
    code, out, err = run_cli(capsys, "clean", "--json")
    by = {c["name"]: c for c in json.loads(out)["clusters"]}
    assert by["three-days"]["removed"] == ["three-days.log"] and by["one-day"]["kept"] == "young"
    assert f"log_retention 2d from file:{settings}" in by["one-day"]["why"]
    monkeypatch.setenv("HPC_CLUSTER_LOG_RETENTION", "never")
    code, out, err = run_cli(capsys, "clean")
    assert code == 0 and names() == ["one-day.log"]
    assert "kept: log_retention never from env:HPC_CLUSTER_LOG_RETENTION" in out


def test_bad_arguments_are_usage_errors_that_say_what_to_write(capsys, monkeypatch):
    code, _, err = run_cli(capsys, "clean", "--older-than", "soon")
    assert code == 2 and "--older-than='soon' is not a duration" in err and "or 0" in err
    code, _, err = run_cli(capsys, "clean", "--all", "--older-than", "1d")
    assert code == 2 and "give one" in err
    monkeypatch.setenv("HPC_CLUSTER_LOG_RETENTION", "a week")
    code, _, err = run_cli(capsys, "clean")
    assert code == 2 and "or never" in err
