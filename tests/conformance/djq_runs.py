"""The inner pytest runs of dask-jobqueue's tests: start, wait, clean up, read their junit-xml.

Three runs, as dask-jobqueue's CI has one per batch system:

* no -E: the tests that need no batch system (job scripts, keywords, config, errors);
* -E slurm: against our SLURMCluster on the real one-host SLURM (tests/slurm/cluster.sh);
* -E pbs: against our PBSCluster on the command-level PBS simulator (tests/pbs_sim).

Each is a pytest subprocess in its own directory, with HOME, XDG_CONFIG_HOME,
HPC_CLUSTER_SYSTEM_CONFIG_DIR and dask's config directories there too, and no
HPC_CLUSTER_* or DASK_* setting of the caller's, so no developer's config leaks in. They
run at the same time (most of their time is waiting for jobs), each in its own process
group so a run that overruns is stopped whole.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from djq_suite import PACKAGE, extract
from djq_table import DOC, reason_for

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PBS_SIM = REPO / "tests" / "pbs_sim"

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
    "pbs": "-E pbs: our PBSCluster on the PBS simulator (tests/pbs_sim)",
}


def prepare(base: Path) -> Path:
    """The rewritten test package and its pytest.ini under `base`/suite; returns that directory."""
    suite = base / "suite"
    extract(suite)
    (suite / "pytest.ini").write_text(INI)
    return suite


def _load_pbssim():
    spec = importlib.util.spec_from_file_location("pbssim", PBS_SIM / "pbssim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Result:
    test_id: str          # as in the table: test_slurm.py::test_header
    outcome: str          # passed, failed, error, skipped, xfailed
    message: str = ""
    text: str = ""


@dataclass
class Run:
    env: str | None
    cwd: Path
    command: list[str]
    environ: dict[str, str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float | None = None
    timed_out: bool = False
    leftovers: list[str] = field(default_factory=list)
    _watcher: threading.Thread | None = None
    _cleaned: bool = False

    @property
    def junit(self) -> Path:
        return self.cwd / "junit.xml"

    @property
    def output(self) -> Path:
        return self.cwd / "output.txt"

    def start(self) -> Run:
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(self.command, cwd=self.cwd, env=self.environ, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.started = time.monotonic()
        # The runs are waited for one after another: a thread notes when this one really
        # ended, so its time is its own and not the time until someone looked.
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        self.proc.wait()
        self.seconds = time.monotonic() - self.started

    def wait(self) -> int:
        """Its exit code once it ends (stopped after RUN_TIMEOUT), its jobs cleaned up."""
        if not self._cleaned:
            self._watcher.join(max(RUN_TIMEOUT - (time.monotonic() - self.started), 0))
            if self._watcher.is_alive():
                self.timed_out = True
                self.stop()
            self.clean_up()
        return self.proc.returncode

    def close(self) -> None:
        """Stopped if it still runs, cleaned up after (for teardown; once is enough)."""
        if not self._cleaned:
            self.stop()
            self.clean_up()

    def stop(self) -> None:
        """The run's process group: SIGTERM, then SIGKILL if it is still there after 20 s."""
        if self.proc is None or not self._watcher.is_alive():
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        self._watcher.join(20)
        if self._watcher.is_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self._watcher.join()

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
        elif self.env == "pbs":
            home = Path(self.environ["PBS_SIM_HOME"])
            live = _load_pbssim().live_pids(str(home))
            if live:
                _load_pbssim().cleanup(str(home))
                self.leftovers += [f"PBS simulator process {p}" for p in live]
                deadline = time.monotonic() + 15
                while _load_pbssim().live_pids(str(home)) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if _load_pbssim().live_pids(str(home)):
                    self.leftovers.append(f"(still alive after SIGKILL: {_load_pbssim().live_pids(str(home))})")

    def results(self) -> list[Result]:
        return read_junit(self.junit) if self.junit.exists() else []

    def by_hand(self) -> str:
        """A shell line that repeats this run (add --runxfail to see why table tests fail)."""
        changed = {k: v for k, v in self.environ.items() if os.environ.get(k) != v}
        words = [f"-u {k}" for k in sorted(set(os.environ) - set(self.environ))]
        words += [f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items())]
        return f"cd {self.cwd} && env {' '.join(words)} {shlex.join(self.command)}"


def make_run(suite: Path, base: Path, env: str | None) -> Run:
    cwd = base / f"run-{env or 'none'}"
    cwd.mkdir()
    # Nothing of the caller's settings: ours, dask's, the simulator's, and pytest's own
    # (PYTEST_ADDOPTS, and PYTEST_CURRENT_TEST of the outer run).
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("HPC_CLUSTER_", "DASK_", "PBS_SIM_", "PYTEST_"))}
    dirs = {"HOME": "home", "XDG_CONFIG_HOME": "xdg", "HPC_CLUSTER_SYSTEM_CONFIG_DIR": "etc",
            "DASK_CONFIG": "dask", "DASK_ROOT_CONFIG": "dask-etc"}
    for var, name in dirs.items():
        (cwd / name).mkdir()
        environ[var] = str(cwd / name)
    # Our plugin and placeholders, then this checkout's hpc_cluster (not another install).
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(REPO), os.environ.get("PYTHONPATH")]))
    if env == "pbs":
        (cwd / "pbs_sim_home").mkdir()
        environ["PBS_SIM_HOME"] = str(cwd / "pbs_sim_home")
        environ["PBS_SIM_KILL_DELAY"] = "1"
        environ["PATH"] = f"{PBS_SIM / 'bin'}{os.pathsep}{environ['PATH']}"
    # -X no_debug_ranges: Python 3.11 parses source (ast.parse) to draw the ^^^ under a
    # traceback line, and before 3.11.8 two parses at once (a traceback logged by another
    # thread while pytest formats a failure) can end the whole run with "INTERNALERROR
    # SystemError: AST constructor recursion depth mismatch" (CPython gh-106905, pytest
    # issue 10874; seen here on 3.11.7). Without column ranges no traceback draws carets.
    command = [sys.executable, "-X", "no_debug_ranges", "-m", "pytest", str(suite / PACKAGE),
               "-c", str(suite / "pytest.ini"),
               "--rootdir", str(suite), "-p", "djq_plugin", "-p", "no:cacheprovider", "-q", "-rfE",
               "--tb=short", "--junit-xml", str(cwd / "junit.xml")]
    if env:
        command += ["-E", env]
    return Run(env=env, cwd=cwd, command=command, environ=environ)


# -- results ----------------------------------------------------------------------------
def read_junit(path: Path) -> list[Result]:
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        module = classname.rsplit(".", 1)[-1]
        test_id = f"{module}.py::{name}" if module.startswith("test_") else f"{classname}::{name}"
        found = [child for child in case if child.tag in ("failure", "error", "skipped")]
        tags = {child.tag for child in found}
        # A failure outranks an error (in teardown, after it), which outranks a skip.
        outcome = ("failed" if "failure" in tags else "error" if "error" in tags
                   else "skipped" if "skipped" in tags else "passed")
        if outcome == "skipped" and found[0].get("type") == "pytest.xfail":
            outcome = "xfailed"
        shown = [c for c in found if c.tag != "skipped"] or found
        results.append(Result(test_id, outcome, " | ".join(c.get("message", "") for c in shown),
                              "\n".join((c.text or "").strip() for c in shown)))
    return results


def problems(run: Run, results: list[Result], table: dict[str, str]) -> list[str]:
    """What makes this run a failure, each with the test's own words."""
    out = []
    code = run.proc.returncode
    if run.timed_out:
        out.append(f"the run did not finish within {RUN_TIMEOUT} s and was stopped")
    if not results:
        out.append(f"no junit results (pytest exit code {code}); its output ends:\n{_tail(run.output, 40)}")
    elif code not in (0, 1):
        out.append(f"pytest exit code {code} (interrupted or internal error); its output ends:\n"
                   f"{_tail(run.output, 40)}")
    for r in results:
        if r.outcome not in ("failed", "error"):
            continue
        if reason_for(table, r.test_id) and r.message.startswith("[XPASS(strict)]"):
            out.append(f"{r.test_id} now PASSES: take it out of the table in {DOC.relative_to(REPO)} "
                       "(a row without [parameters] covers all of them: narrow it to those still failing)")
        else:
            first = r.message.strip().splitlines()[0] if r.message.strip() else ""
            out.append(f"{r.test_id} {r.outcome.upper()}: {first}\n{_indent(_last_lines(r.text, 25))}")
    if code == 1 and results and not out:
        out.append(f"pytest exit code 1 with no failed test in the junit; its output ends:\n{_tail(run.output, 40)}")
    return out


def summary(run: Run, results: list[Result]) -> str:
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


def _last_lines(text: str, n: int) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _tail(path: Path, n: int) -> str:
    return _indent(_last_lines(path.read_text(errors="replace"), n)) if path.exists() else "    (no output)"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())

