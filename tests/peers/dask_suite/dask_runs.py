"""The inner pytest runs of dask's tests: one per test file, on our client, then on distributed's.

Each run is a pytest subprocess (tests/helpers/peers.py's PytestRun: its own
process group and directory, HOME and dask's config directories there, none of the
caller's settings) that loads our plugin, dask_plugin.py, with one cluster for the run.
The directories are not under /tmp, which each worker has its own of: workers import the
extracted test modules (distributed's client pickles a function defined in a test by
reference, as in dask's own CI) and start in the run's directory, as a batch job starts in
a directory on a shared filesystem.

The campaign: every file on our client, PARALLEL runs at a time; then, on distributed's
client, only the tests that failed on ours (one run, one cluster), to learn which of our
failures are shared. `TEST_DASK_SUITE_DISTRIBUTED_ON=all` in the environment runs every file on
distributed's client too, alongside ours, for the full comparison of pass counts
(about twice the time).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dask_clusters import own_network
from dask_fetch import FILES, IDS, PACKAGE, VERSION, extract_tree
from helpers.peers import PytestRun, Result, cache_dir, make_run, read_junit

HERE = Path(__file__).resolve().parent

# Two runs at a time on two cores: a run spends much of its time in round trips to its
# cluster, so two overlap well; more only share the cores.
PARALLEL = int(os.environ.get("TEST_DASK_SUITE_PARALLEL", "2"))
DISTRIBUTED_ON = os.environ.get("TEST_DASK_SUITE_DISTRIBUTED_ON", "failures")
if DISTRIBUTED_ON not in ("failures", "all"):
    raise ValueError(f"TEST_DASK_SUITE_DISTRIBUTED_ON={DISTRIBUTED_ON!r}: 'failures' (the default) or 'all'")
# dask's own per-test timeout is 300 s; none of these tests takes 100 s, and a hang
# must not cost the suite more than this.
TEST_TIMEOUT = 120
# Files run in parts, each part a run of its own: test_groupby.py alone took 555-683 s,
# longer than the other five together; in two parts each takes about half, beside the rest.
SHARDS = {"dask/dataframe/tests/test_groupby.py": 2}
# The longest run (a part of test_groupby.py) takes about 300 s beside another.
RUN_TIMEOUT = 600
# The campaign as a whole: runs still going then are stopped, runs not started are not.
# A passing campaign takes about 9 minutes on two cores (see docs/dask-collections.md);
# the issue allows this part of the suite 15. Every file on both clients takes about twice that.
DEADLINE = 840 if DISTRIBUTED_ON == "failures" else 1680
# dask's tests marked slow run too (dask's CI runs them): a few big shuffles and reductions,
# where our client's speed shows.
RUNSLOW = True
# Session directories older than this are from runs that were killed: removed.
STALE_AFTER = 6 * 3600


def short(path: str) -> str:
    """`dask/array/tests/test_reductions.py` -> `array/test_reductions.py` (for tables)."""
    parts = path.removeprefix("dask/").split("/")
    return "/".join([p for p in parts[:-1] if p != "tests"] + parts[-1:])


@dataclass(eq=False)
class DaskRun(PytestRun):
    client: str = "ours"
    files: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    run_timeout: float = RUN_TIMEOUT

    def results(self) -> list[Result]:
        return read_junit(self.junit, IDS.from_junit) if self.junit.exists() else []

    def report(self) -> dict:
        """What our plugin wrote: the cluster, the probe, tests that changed dask's scheduler."""
        path = self.cwd / "dask-run.json"
        return json.loads(path.read_text()) if path.exists() else {}


def client_run(suite: Path, base: Path, client: str, files: tuple[str, ...], private_tmp: str,
               only: tuple[str, ...] = (), shard: tuple[int, int] | None = None) -> DaskRun:
    """The run (not started) of `files` (or, with `only`, of those test ids in them, or of
    one `shard` of a file) on `client`'s client: ours, or distributed's."""
    name = short(files[0]).replace("/", "-").removesuffix(".py") if len(files) == 1 else "selected"
    if shard:
        name += f"-part{shard[0] + 1}of{shard[1]}"
    cwd = base / f"{client}-{name}"
    options = ["-o", f"timeout={TEST_TIMEOUT}",
               # pytest-asyncio (installed for our own tests) warns at start-up about its
               # settings, which dask's `filterwarnings = error` makes fatal; dask does not use it.
               "-p", "no:asyncio", "--dask-client", client, "--private-tmp", private_tmp,
               "--dask-run-dir", str(cwd), *(["--runslow"] if RUNSLOW else [])]
    if only:
        options += ["--dask-only", str(cwd / "only.txt")]
    if shard:
        options += ["--dask-shard", f"{shard[0]}/{shard[1]}"]
    # The extracted tests and our plugin first on its path.
    run = make_run(DaskRun, suite, cwd, [suite / PACKAGE / f.removeprefix("dask/") for f in files], "dask_plugin",
                   [suite, HERE], options, client=client, files=files, only=only)
    if only:
        (cwd / "only.txt").write_text("\n".join(only) + "\n")
    # The whole run in a network namespace of its own, where it can have one (dask_clusters.own_network).
    run.command = own_network(private_tmp, run.command)
    return run


def session_directory() -> Path:
    """A new directory for one session's suite and runs, in the cache (not /tmp, see above);
    those of sessions long gone are removed."""
    root = cache_dir() / "dask-suite"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        try:
            if time.time() - old.stat().st_mtime > STALE_AFTER:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:                 # another session removed it first
            pass
    path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path.mkdir()
    return path


FAILED = ("failed", "error")

# What the session prints at its end (conftest.py): the summary, the failures ours alone.
SUMMARIES: list[str] = []


@dataclass
class Campaign:
    """All the runs of one session, driven by a thread: ours (PARALLEL at a time), then
    distributed's on our failures (or, with distributed_on='all', on everything, alongside).
    `ours`: each file's runs (its parts, see SHARDS); `distributed`: each file's run."""

    base: Path
    private_tmp: str
    files: tuple[str, ...] = FILES
    parallel: int = PARALLEL
    distributed_on: str = DISTRIBUTED_ON
    ours: dict[str, list[DaskRun]] = field(default_factory=dict)
    distributed: dict[str, DaskRun] = field(default_factory=dict)
    error: BaseException | None = None
    seconds: float | None = None
    overran: bool = False
    _done: threading.Event = field(default_factory=threading.Event)
    _changed: threading.Event = field(default_factory=threading.Event)     # a run ended, or close()
    _stopping: bool = False

    def start(self) -> Campaign:
        self.suite = extract_tree(self.base / "suite")
        self.ours = {f: [client_run(self.suite, self.base, "ours", (f,), self.private_tmp,
                                  shard=(i, SHARDS[f]) if f in SHARDS else None)
                         for i in range(SHARDS.get(f, 1))] for f in self.files}
        if self.distributed_on == "all":
            self.distributed = {f: client_run(self.suite, self.base, "distributed", (f,), self.private_tmp)
                                for f in self.files}
        self.started = time.monotonic()
        threading.Thread(target=self._drive, daemon=True).start()
        return self

    def _drive(self) -> None:
        try:
            ours = self.our_runs()
            # With distributed_on='all', each file on both clients at about the same time.
            self._run([r for f in self.files for r in (*self.ours[f], self.distributed.get(f)) if r])
            if self.distributed_on != "all":
                failing = tuple(r.test_id for run in ours for r in run.results() if r.outcome in FAILED)
                if failing:
                    run = client_run(self.suite, self.base, "distributed", self.files, self.private_tmp, failing)
                    self.distributed = {f: run for f in self.files}
                    self._run([run])
        except BaseException as e:  # noqa: BLE001  (reported by every test that waits)
            self.error = e
        finally:
            self.seconds = time.monotonic() - self.started
            self._done.set()

    def _run(self, queue: list[DaskRun]) -> None:
        running: list[DaskRun] = []
        while (queue or running) and not self._stopping:
            now = time.monotonic()
            if now - self.started > DEADLINE:
                self.overran = True
                for run in running:
                    run.timed_out = True
                break
            for run in [r for r in running if r.done() or now - r.started > r.run_timeout]:
                run.wait()                       # at once if it ended, else it is stopped now
                running.remove(run)
            while queue and len(running) < self.parallel:
                run = queue.pop(0)
                run.on_end = self._changed.set
                running.append(run.start())
            if not running:
                break
            # Until a run ends (or close()), or the next time limit of a run or of the campaign.
            limits = [r.started + r.run_timeout for r in running] + [self.started + DEADLINE]
            self._changed.wait(max(0.0, min(limits) - time.monotonic()) + 0.1)
            self._changed.clear()
        for run in running:
            run.close()

    def our_runs(self) -> list[DaskRun]:
        return [run for runs in self.ours.values() for run in runs]

    def wait_for(self, run: DaskRun) -> None:
        """Until `run` has ended (or the campaign has)."""
        while not run.finished and not self._done.is_set():
            self._done.wait(0.5)

    def wait(self) -> None:
        """Until every run has ended; re-raises what stopped the campaign."""
        self._done.wait()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self._stopping = True
        self._changed.set()
        self._done.wait(60)
        for run in [*self.our_runs(), *self.distributed.values()]:
            run.close()


# -- reading the runs ---------------------------------------------------------------------
def counts(results: list[Result]) -> Counter:
    c = Counter(r.outcome for r in results)
    c["failed"] += c.pop("error", 0)
    return c


def campaign_summary(campaign: Campaign, kept: bool) -> str:
    """Per file: passed / failed / skipped / xfailed on ours and on distributed's, and times;
    with `kept` (the session's directory is kept), how to repeat each run by hand."""
    everything = campaign.distributed_on == "all"
    rows = [f"dask {VERSION}'s tests: {len(campaign.files)} files, {campaign.parallel} runs at a time, "
            f"{campaign.seconds or 0:.0f} s in all; workers' /tmp: "
            f"{'private' if campaign.private_tmp != 'off' else 'SHARED (see the NOTE above)'}; "
            f"distributed's client on {'every test' if everything else 'our failures'}",
            f"  {'file':26} {'ours: passed failed skipped xfailed':>36} {'time':>6}   distributed:"
            + (f" {'passed failed skipped xfailed':>30} {'time':>6}" if everything else " of our failures, passed failed")]
    for f in campaign.files:
        ours = campaign.ours.get(f, [])
        o = counts([r for run in ours for r in run.results()])
        # A file run in parts: the longest part's time (they run side by side).
        line = (f"  {short(f):26} {o['passed']:>13} {o['failed']:>6} {o['skipped']:>7} {o['xfailed']:>8}"
                f" {max((run.seconds or 0 for run in ours), default=0):>5.0f}s   ")
        theirs = campaign.distributed.get(f)
        if theirs is not None:
            d = counts([r for r in theirs.results() if r.test_id.startswith(f + "::")])
            line += (f" {d['passed']:>18} {d['failed']:>6} {d['skipped']:>7} {d['xfailed']:>8} {theirs.seconds or 0:>5.0f}s"
                     if everything else f" {d['passed']:>31} {d['failed']:>6}")
        rows.append(line)
    if campaign.distributed and not everything:
        run = next(iter(campaign.distributed.values()))
        rows.append(f"  distributed's client on our {len(run.only)} failures: one run, {run.seconds or 0:.0f} s")
    if kept:
        rows.append(f"  kept for a look: {campaign.base}; each run's directory has by-hand.sh, which repeats it")
        for run in [*campaign.our_runs(), *dict.fromkeys(campaign.distributed.values())]:
            (run.cwd / "by-hand.sh").write_text(run.by_hand() + "\n")
    return "\n".join(rows)
