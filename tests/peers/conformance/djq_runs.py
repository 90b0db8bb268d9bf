"""The inner pytest runs of dask-jobqueue's tests: start, wait, clean up, read their junit-xml.

Six runs, as dask-jobqueue's CI has one per batch system:

* no -E: the tests that need no batch system (job scripts, keywords, config, errors), over
  every cluster class we have;
* -E slurm: against our SLURMCluster on the real one-host SLURM (tests/batch/slurm/cluster.sh);
* -E sge: against our SGECluster on the real one-host Grid Engine (tests/batch/sge/cluster.sh);
* -E pbs, -E lsf, -E htcondor: against our PBSCluster, LSFCluster and HTCondorCluster on the
  command-level simulators (tests/helpers/pbs_sim, tests/helpers/lsf_sim, tests/helpers/htcondor_sim).

Each is a pytest subprocess in its own directory, with HOME, XDG_CONFIG_HOME,
HPC_CLUSTER_SYSTEM_CONFIG_DIR and dask's config directories there too, and no
HPC_CLUSTER_* or DASK_* setting of the caller's, so no developer's config leaks in. They
run at the same time (most of their time is waiting for jobs), each in its own process
group so a run that overruns is stopped whole.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from djq_suite import IDS, PACKAGE, extract_package
from djq_table import DOC
from helpers.peers import PytestRun, Result, Row, indent, last_lines, make_run, read_junit, row_for, tail
from helpers.wait import WaitTimeout, wait_until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PBS_SIM = REPO / "tests" / "helpers" / "pbs_sim"
# The simulators each -E run puts first on PATH: (directory, its state directory's variable,
# the variable of the delay between its kill signals). They share pbs_sim's layout of job
# directories and pid files, so pbssim's live_pids and cleanup serve all three.
SIMULATORS = {
    "pbs": (PBS_SIM, "PBS_SIM_HOME", "PBS_SIM_KILL_DELAY"),
    "lsf": (REPO / "tests" / "helpers" / "lsf_sim", "LSF_SIM_HOME", "LSF_SIM_KILL_DELAY"),
    "htcondor": (REPO / "tests" / "helpers" / "htcondor_sim", "CONDOR_SIM_HOME", "CONDOR_SIM_KILL_DELAY"),
}

# A hung test fails on its own (their tests wait QUEUE_WAIT = 60 s at most per step, and
# closing a cluster takes a few seconds more); a run as a whole is stopped after RUN_TIMEOUT.
# A passing run takes a few minutes: these bound what a broken one costs the suite.
TEST_TIMEOUT = 240
RUN_TIMEOUT = 900

INI = f"""[pytest]
asyncio_default_fixture_loop_scope = function
timeout = {TEST_TIMEOUT}
junit_family = xunit2
"""

# Each finished run's summary, printed at the end of the session by conftest.py.
SUMMARIES: list[str] = []

DESCRIPTIONS = {
    None: "no -E: the tests that need no batch system",
    "slurm": "-E slurm: our SLURMCluster on the real one-host SLURM",
    "sge": "-E sge: our SGECluster on the real one-host Grid Engine",
    "pbs": "-E pbs: our PBSCluster on the PBS simulator (tests/helpers/pbs_sim)",
    "lsf": "-E lsf: our LSFCluster on the LSF simulator (tests/helpers/lsf_sim)",
    "htcondor": "-E htcondor: our HTCondorCluster on the HTCondor simulator (tests/helpers/htcondor_sim)",
}


def prepare(base: Path) -> Path:
    """The rewritten test package and its pytest.ini under `base`/suite; returns that directory."""
    suite = base / "suite"
    extract_package(suite)
    (suite / "pytest.ini").write_text(INI)
    return suite


def _load_pbssim():
    spec = importlib.util.spec_from_file_location("pbssim", PBS_SIM / "pbssim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class DjqRun(PytestRun):
    """One -E run of dask-jobqueue's tests (env None: the run without -E)."""

    env: str | None = None
    run_timeout: float = RUN_TIMEOUT

    def clean_up(self) -> None:
        """Batch jobs the run left behind, cancelled; each is named in `leftovers`."""
        self._cleaned = True
        if self.env == "slurm":
            # Our daemons submit from the run's directory, so its jobs are those whose
            # working directory is in it: no other job is touched.
            out = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True)
            ids = [line.split(" ", 1)[0] for line in out.stdout.splitlines()
                   if " " in line and Path(line.split(" ", 1)[1]).is_relative_to(self.cwd)]
            if ids:
                subprocess.run(["scancel", *ids], capture_output=True)
                self.leftovers += [f"SLURM job {i}" for i in ids]
        elif self.env == "sge":
            self.leftovers += [f"SGE job {i}" for i in _cancel_sge_jobs_under(self.cwd)]
        elif self.env in SIMULATORS:
            _, home_var, _ = SIMULATORS[self.env]
            home, sim = self.environ[home_var], _load_pbssim()
            live = sim.live_pids(home)
            if live:
                sim.cleanup(home)
                self.leftovers += [f"{self.env} simulator process {p}" for p in live]
                with contextlib.suppress(WaitTimeout):
                    wait_until(lambda: not sim.live_pids(home), 15, "the simulator's processes to exit", interval=0.1)
                if sim.live_pids(home):
                    self.leftovers.append(f"(still alive after SIGKILL: {sim.live_pids(home)})")

    def results(self) -> list[Result]:
        return read_junit(self.junit, IDS.from_junit) if self.junit.exists() else []


def env_run(suite: Path, base: Path, env: str | None) -> DjqRun:
    """The run (not started) of the extracted `suite` with `-E env` (None: without -E)."""
    # Our plugin and placeholders first on its path.
    run = make_run(DjqRun, suite, base / f"run-{env or 'none'}", [suite / PACKAGE], "djq_plugin", [HERE],
                   ["-E", env] if env else [], env=env)
    if env in SIMULATORS:
        directory, home_var, delay_var = SIMULATORS[env]
        home = run.cwd / f"{env}_sim_home"
        home.mkdir()
        run.environ.update({home_var: str(home), delay_var: "1",
                            "PATH": f"{directory / 'bin'}{os.pathsep}{run.environ['PATH']}"})
    return run


def _cancel_sge_jobs_under(cwd: Path) -> list[str]:
    """qdel the Grid Engine jobs submitted from `cwd` (our daemons submit from the run's
    directory and `#$ -cwd` records it: `qstat -j`'s cwd line); returns their ids. Jobs of
    anyone else on the shared test gridengine are not touched."""
    out = subprocess.run(["qstat", "-xml"], capture_output=True, text=True, timeout=60)
    ids = re.findall(r"<JB_job_number>(\d+)</JB_job_number>", out.stdout)
    ours = []
    for job_id in dict.fromkeys(ids):
        detail = subprocess.run(["qstat", "-j", job_id], capture_output=True, text=True, timeout=60).stdout
        m = re.search(r"^cwd:\s*(\S+)", detail, re.M)
        if m and Path(m.group(1)).is_relative_to(cwd):
            ours.append(job_id)
    if ours:
        subprocess.run(["qdel", *ours], capture_output=True, timeout=60)
    return ours


# -- results ----------------------------------------------------------------------------
def problems(run: DjqRun, results: list[Result], table: dict[str, Row]) -> list[str]:
    """What makes this run a failure, each with the test's own words."""
    out = run.ended_badly(results)
    code = run.proc.returncode
    for r in results:
        if r.outcome not in ("failed", "error"):
            continue
        if row_for(table, r.test_id) and r.message.startswith("[XPASS(strict)]"):
            out.append(f"{r.test_id} now PASSES: take it out of the table in {DOC.relative_to(REPO)} "
                       "(a row without [parameters] covers all of them: narrow it to those still failing)")
        else:
            out.append(f"{r.test_id} {r.outcome.upper()}: {r.first_line}\n{indent(last_lines(r.text, 25))}")
    if code == 1 and results and not out:
        out.append(f"pytest exit code 1 with no failed test in the junit; its output ends:\n{tail(run.output, 40)}")
    return out


def run_summary(run: DjqRun, results: list[Result]) -> str:
    """The run's figures: passed, expected failures, failed, skipped (each reason), and how
    to repeat it by hand."""
    counts = Counter(r.outcome for r in results)
    # Ours are marked with the page's name (djq_plugin.py); the others are their xfail_env.
    ours = sum(1 for r in results if r.outcome == "xfailed" and r.message.startswith(DOC.name))
    skips = Counter()
    for r in results:
        if r.outcome == "skipped":
            reason = r.message.strip()
            if reason.startswith("test requires env in"):
                reason = "not this run's environment (their -E selection)"
            skips[reason] += 1
    lines = [f"{DESCRIPTIONS[run.env]}: {run.seconds:.1f} s, pytest exit code {run.proc.returncode}",
             f"  passed {counts['passed']}, expected failures {ours} (the table in {DOC.relative_to(REPO)})"
             + (f" + {counts['xfailed'] - ours} (their own xfail_env)" if counts["xfailed"] > ours else "")
             + f", failed {counts['failed']}, errors {counts['error']}, skipped {counts['skipped']}"]
    lines += [f"  skipped {n:4d}: {reason}" for reason, n in skips.most_common()]
    lines += [f"  left behind and cleaned up: {', '.join(run.leftovers)}"] if run.leftovers else []
    lines += [f"  junit: {run.junit}", f"  by hand (add --runxfail to see why the table's tests fail): {run.by_hand()}"]
    return "\n".join(lines)
