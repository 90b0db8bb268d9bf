"""SLURM's side of polling less (issue 18, point 4): its version read from `squeue --version`,
`squeue --only-job-state` where it exists (Slurm 23.11.5+, per Slurm's NEWS), `sacct
--starttime` reaching back just past the earliest submission asked about. Scripted command outputs, no SLURM needed."""

from __future__ import annotations

import pytest

from hpc_cluster.adapters.base import JobStatus
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.adapters.slurm_text import parse_slurm_version, parse_squeue_states, sacct_starttime
from helpers.fakes import ScriptedRunner


@pytest.mark.parametrize("text, version", [("slurm-wlm 22.05.8\n", (22, 5, 8)), ("slurm 24.05.1\n", (24, 5, 1)),
                                           ("slurm 23.11.0-0rc1\n", (23, 11, 0)), ("slurm 25.05\n", (25, 5, 0)),
                                           ("squeue: command not found", None)])
def test_slurm_version_strings(text, version):
    assert parse_slurm_version(text) == version


def test_squeue_only_job_state_where_slurm_has_it_and_sacct_from_the_earliest_submission():
    runner = ScriptedRunner([(["squeue", "--version"], (0, "slurm 23.11.5\n", "")),
                             (["squeue", "--only-job-state"], (0, "7|RUNNING\n", "")),
                             (["sacct"], (0, "8|w|COMPLETED|0:0|1G|1|||00:10:00|node1|x|y\n", ""))])
    out = SLURMAdapter(runner).status(["7", "8"], within=3599.2)
    assert (out["7"].state, out["8"].state) == ("running", "completed")
    assert runner.commands[1][:2] == ["squeue", "--only-job-state"]
    sacct = runner.commands[2]
    # relative to the login node's clock (no skew), with 10 minutes' margin
    assert sacct[sacct.index("--starttime") + 1] == "now-4200" == sacct_starttime(3599.2)
    assert parse_squeue_states("9|PENDING\n") == {"9": JobStatus("9", "pending", "PENDING")}


def test_squeue_without_only_job_state_on_22_05_and_when_refused():
    for version in ("slurm-wlm 22.05.8", "slurm 23.11.4"):
        old = ScriptedRunner([(["squeue", "--version"], (0, version + "\n", "")),
                              (["squeue", "-h"], (0, "7|RUNNING|n1|None|0:05|10:00\n", ""))])
        assert SLURMAdapter(old).status(["7"])["7"].node == "n1"
        assert [c[1] for c in old.commands] == ["--version", "-h"]
    refused = ScriptedRunner([(["squeue", "--version"], (0, "slurm 24.05.0\n", "")),
                              (["squeue", "--only-job-state"], (1, "", "squeue: unrecognized option\n")),
                              (["squeue", "-h"], (0, "7|RUNNING|n1|None|0:05|10:00\n", ""))])
    adapter = SLURMAdapter(refused)
    adapter.status(["7"])
    adapter.status(["7"])
    assert [c[1] for c in refused.commands] == ["--version", "--only-job-state", "-h", "-h"]   # asked once
