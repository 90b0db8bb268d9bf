"""Fixtures for running dask-jobqueue's own tests against our classes (test_dask_jobqueue.py).

The inner runs are started together, once for this directory, by `djq_runs`; each test
then waits for its own. Their summaries are printed at the end of the session, so CI logs
show the figures whether the tests pass or not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "batch" / "slurm"))

from djq_runs import DESCRIPTIONS, SUMMARIES, DjqRun, env_run, prepare  # noqa: E402
from djq_suite import VERSION  # noqa: E402
from djq_table import TABLE  # noqa: E402
from slurm_jobs import CLUSTER_SH, cluster_is_up  # noqa: E402

from helpers.peers import Row, SuiteUnavailable, TableError, known_failures  # noqa: E402
from helpers.sge import CLUSTER_SH as SGE_CLUSTER_SH, gridengine_is_up  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    if SUMMARIES:
        terminalreporter.section(f"dask-jobqueue {VERSION}'s tests on our classes")
        for text in SUMMARIES:
            terminalreporter.write_line(text)


def unavailable(system: str, cluster_sh: Path, is_up, command: str) -> str | None:
    """None when `system`'s test cluster is up (`is_up()`); else why its run is skipped.

    As tests/batch/slurm's `slurm_cluster` and tests/batch/sge's `gridengine` fixtures: started with its
    cluster.sh when we are root (a failed start is an error, not a skip), skipped loudly otherwise.
    """
    if is_up():
        return None
    if os.geteuid() != 0:
        reason = (f"{system} TESTS SKIPPED: the test cluster is not up and we are not root to start "
                  f"it. Run `sudo {cluster_sh} up` first.")
        if shutil.which(command) is None:
            reason += f" (no {command} on PATH either)"
        return reason
    proc = subprocess.run(["bash", str(cluster_sh), "up"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{cluster_sh} up failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return None


# The runs that need a real batch system, and how to know it is there.
REAL_SYSTEMS = {"slurm": lambda: unavailable("SLURM", CLUSTER_SH, cluster_is_up, "sbatch"),
                "sge": lambda: unavailable("SGE", SGE_CLUSTER_SH, gridengine_is_up, "qsub")}
# The runs on our command-level simulators: nothing to bring up.
SIMULATED = ("pbs", "lsf", "htcondor")


class Runs:
    """The inner runs by -E value (None: no -E), or why one did not start."""

    def __init__(self):
        self.table: dict[str, Row] = {}
        self.runs: dict[str | None, DjqRun] = {}
        self.skipped: dict[str | None, str] = {}
        self.failed: dict[str | None, str] = {}

    def get(self, env: str | None) -> DjqRun:
        """The run for `env`, finished; skips or fails the calling test when there is none."""
        if env in self.failed or env in self.skipped:
            failed = env in self.failed
            why = self.failed[env] if failed else self.skipped[env]
            line = f"{DESCRIPTIONS[env]}: {'NOT RUN' if failed else 'SKIPPED'}: {why}"
            if line not in SUMMARIES:            # two tests may ask for the same run
                SUMMARIES.append(line)
            if failed:
                pytest.fail(why, pytrace=False)
            pytest.skip(why)
        run = self.runs[env]
        run.wait()
        return run


@pytest.fixture(scope="module")
def djq_runs(request, tmp_path_factory):
    # Only the runs this session's selected tests check (the one without -E always: the
    # table's test ids are checked against its collection).
    wanted = {None}
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.path == request.path and callspec and "env" in callspec.params:
            wanted.add(callspec.params["env"])
    runs = Runs()
    base = tmp_path_factory.mktemp("dask-jobqueue")
    try:
        runs.table = known_failures(TABLE)
        suite = prepare(base)
    except (SuiteUnavailable, TableError, OSError) as e:
        runs.failed = {env: str(e) for env in (None, *REAL_SYSTEMS, *SIMULATED)}
        yield runs
        return
    for env in (None, *SIMULATED):
        if env in wanted:
            runs.runs[env] = env_run(suite, base, env).start()
    for env, unavailable in REAL_SYSTEMS.items():
        if env not in wanted:
            continue
        try:
            reason = unavailable()
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            runs.failed[env] = str(e)
        else:
            if reason:
                runs.skipped[env] = reason
            else:
                runs.runs[env] = env_run(suite, base, env).start()
    yield runs
    for run in runs.runs.values():
        run.close()                       # in case a test was interrupted before its run ended
