"""Running another project's own tests, from its sdist, as inner pytest runs.

Shared by tests/peers/conformance (dask-jobqueue's tests on our cluster classes) and
tests/peers/dask_suite (dask's collection tests on our Client):

* the cache outside git the sdists are kept in, their download with pip, and reading the
  files of a checked sdist;
* an inner pytest run: a subprocess in its own process group and directory, with nothing of
  the caller's settings, timed, stopped whole if it overruns;
* its junit-xml, read into results, each under its id in the documentation's table;
* that table: the section of a documentation page that lists the tests we expect to fail.

The inner runs import it too (their plugins read the table): make_run puts tests/ on their
PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


class SuiteUnavailable(RuntimeError):
    """The sdist could not be fetched or is not the one we expect; the message says why."""


class TableError(ValueError):
    """The section is missing or a row cannot be read; the message names the line."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpc-cluster-tests"


def download_sdist(requirement: str, filename: str, path: Path, what: str) -> None:
    """`pip download` the sdist `filename` that `requirement` (a requirements-file line; with
    --hash=..., every hash is required) names, to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Into a private directory, then renamed: two runs at once never see half a file.
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".download-") as tmp:
        requirements = Path(tmp) / "requirement.txt"
        requirements.write_text(requirement + "\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               *(["--require-hashes"] if "--hash" in requirement else []), "-r", str(requirements),
               "-d", tmp, "--retries", "2", "--timeout", "30", "--progress-bar", "off"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SuiteUnavailable(f"`{' '.join(cmd)}` did not finish in 600 s: is the package registry "
                                   "reachable? These tests need it (CI has it).") from None
        got = Path(tmp) / filename
        if proc.returncode != 0 or not got.exists():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise SuiteUnavailable(
                f"could not download {what}'s sdist from the package registry (pip exit code "
                f"{proc.returncode}). These tests need the registry; CI has it. pip said:\n{tail}")
        os.replace(got, path)


def sdist(project: str, version: str, filename: str, sha256: str | None = None) -> Path:
    """`project` `version`'s sdist, `filename`: from the cache, or downloaded from the registry
    now. With `sha256` (the one the registry publishes), pip checks it on download and we
    check it again on every use of the cached copy."""
    path = cache_dir() / filename
    requirement = f"{project}=={version}" + (f" --hash=sha256:{sha256}" if sha256 else "")
    if not path.exists():
        download_sdist(requirement, filename, path, f"{project} {version}")
    if sha256:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != sha256:
            raise SuiteUnavailable(f"{path} has sha256 {digest}, not {project} {version}'s {sha256}; "
                                   "delete it and the next run downloads it again")
    return path


@contextmanager
def sdist_files(project: str, version: str, filename: str, sha256: str | None = None) -> Iterator[Callable[[str], str]]:
    """`read(name)`: the text of the file `name` (a path in the project's tree, `PKG-INFO`,
    `dask/conftest.py`) of the sdist (see sdist()), once its PKG-INFO says it is `project`
    `version`. Only the files read are taken out of the archive."""
    path = sdist(project, version, filename, sha256)
    top = filename.removesuffix(".tar.gz")
    with tarfile.open(path) as tar:
        def read(name: str) -> str:
            try:
                return tar.extractfile(f"{top}/{name}").read().decode()
            except KeyError:
                raise SuiteUnavailable(f"{project} {version}'s sdist has no {name}: is the list of its "
                                       "files we extract still right for this version?") from None

        info = HeaderParser().parsestr(read("PKG-INFO"))
        if info["Name"] != project or info["Version"] != version:
            raise SuiteUnavailable(f"{path}: its PKG-INFO says {info['Name']} {info['Version']}, "
                                   f"not {project} {version}")
        yield read


def isolated_environ(cwd: Path, pythonpath: list[str]) -> dict[str, str]:
    """os.environ without the caller's settings (ours, dask's, the PBS, LSF and HTCondor simulators', and
    pytest's own: PYTEST_ADDOPTS, PYTEST_CURRENT_TEST of the outer run), with HOME,
    XDG_CONFIG_HOME, HPC_CLUSTER_SYSTEM_CONFIG_DIR and dask's config directories made
    empty under `cwd`, and `pythonpath` first on PYTHONPATH."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("HPC_CLUSTER_", "DASK_", "PBS_SIM_", "LSF_SIM_", "CONDOR_SIM_", "PYTEST_"))}
    dirs = {"HOME": "home", "XDG_CONFIG_HOME": "xdg", "HPC_CLUSTER_SYSTEM_CONFIG_DIR": "etc",
            "DASK_CONFIG": "dask", "DASK_ROOT_CONFIG": "dask-etc"}
    for var, name in dirs.items():
        (cwd / name).mkdir()
        environ[var] = str(cwd / name)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*pythonpath, os.environ.get("PYTHONPATH")]))
    return environ


# -X no_debug_ranges: Python 3.11 parses source (ast.parse) to draw the ^^^ under a
# traceback line, and before 3.11.8 two parses at once (a traceback logged by another
# thread while pytest formats a failure) can end the whole run with "INTERNALERROR
# SystemError: AST constructor recursion depth mismatch" (CPython gh-106905, pytest
# issue 10874; seen here on 3.11.7). Without column ranges no traceback draws carets.
PYTEST = [sys.executable, "-X", "no_debug_ranges", "-m", "pytest"]


@dataclass(eq=False)
class PytestRun:
    """One inner pytest run: `start()` it, `wait()` for it (stopped after `run_timeout`).
    Runs compare (and hash) by identity."""

    cwd: Path
    command: list[str]
    environ: dict[str, str]
    run_timeout: float = 900
    proc: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float | None = None
    timed_out: bool = False
    leftovers: list[str] = field(default_factory=list)
    # Called (with no argument, from another thread) when the process has ended.
    on_end: Callable[[], None] | None = None
    _watcher: threading.Thread | None = None
    _cleaned: bool = False

    @property
    def junit(self) -> Path:
        return self.cwd / "junit.xml"

    @property
    def output(self) -> Path:
        return self.cwd / "output.txt"

    def start(self):
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
        if self.on_end is not None:
            self.on_end()

    def done(self) -> bool:
        """Its process has ended (it may not be cleaned up after yet)."""
        return self.proc is not None and self.proc.poll() is not None

    @property
    def finished(self) -> bool:
        """Ended, or stopped, and cleaned up after: its results are final."""
        return self._cleaned

    def wait(self) -> int:
        """Its exit code once it ends (stopped after run_timeout), cleaned up after."""
        if not self._cleaned:
            self._watcher.join(max(self.run_timeout - (time.monotonic() - self.started), 0))
            if self._watcher.is_alive():
                self.timed_out = True
                self.stop()
            self.clean_up()
        return self.proc.returncode

    def close(self) -> None:
        """Stopped if it still runs, cleaned up after (for teardown; once is enough)."""
        if not self._cleaned and self.proc is not None:
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
        """What the run may have left outside its process group; each is named in `leftovers`."""
        self._cleaned = True

    def by_hand(self) -> str:
        """A shell line that repeats this run."""
        changed = {k: v for k, v in self.environ.items() if os.environ.get(k) != v}
        words = [f"-u {k}" for k in sorted(set(os.environ) - set(self.environ))]
        words += [f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items())]
        return f"cd {self.cwd} && env {' '.join(words)} {shlex.join(self.command)}"

    def ended_badly(self, results: list[Result]) -> list[str]:
        """Why the run as a whole (not one of its tests) failed, given its `results`."""
        out = []
        code = self.proc.returncode
        if self.timed_out:
            out.append(f"the run did not finish within {self.run_timeout:g} s and was stopped")
        if not results:
            out.append(f"no junit results (pytest exit code {code}); its output ends:\n{tail(self.output, 40)}")
        elif code not in (0, 1):
            out.append(f"pytest exit code {code} (interrupted or internal error); its output ends:\n"
                       f"{tail(self.output, 40)}")
        return out


def make_run(run_class: type[PytestRun], suite: Path, cwd: Path, targets: list, plugin: str,
             pythonpath: list, options: list[str] = (), **fields) -> PytestRun:
    """A `run_class` run (not started) of pytest on `targets`, the extracted `suite`'s
    (its pytest.ini, its rootdir), with our `plugin` loaded, in the new directory `cwd`:
    `pythonpath` first, then tests/ (these helpers) and this checkout (its hpc_cluster, not
    another install). Each junit-xml is `cwd`/junit.xml; `fields` go to the run."""
    cwd.mkdir()
    environ = isolated_environ(cwd, [*map(str, pythonpath), str(TESTS), str(REPO)])
    command = [*PYTEST, *map(str, targets), "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
               "-p", plugin, "-p", "no:cacheprovider", "-q", "-rfE", "--tb=short",
               "--junit-xml", str(cwd / "junit.xml"), *options]
    return run_class(cwd=cwd, command=command, environ=environ, **fields)


def pytest_ini(options: dict) -> str:
    """A pytest.ini of `options` (a project's [tool.pytest.ini_options], as adjusted): lists one
    value a line, booleans as pytest reads them."""
    lines = ["[pytest]"]
    for key, value in options.items():
        if isinstance(value, list):
            lines.append(f"{key} =" + "".join(f"\n    {v}" for v in value))
        else:
            lines.append(f"{key} = {str(value).lower() if isinstance(value, bool) else value}")
    return "\n".join(lines) + "\n"


# -- results ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TableIds:
    """How a suite's tests are named in its documentation's table: a test of the extracted
    package `package` (`dask_upstream/array/tests/test_x.py::test_y[1]`) is `prefix` and its
    path in there (`dask/array/tests/test_x.py::test_y[1]`)."""

    package: str
    prefix: str = ""

    def from_nodeid(self, nodeid: str) -> str:
        """A pytest node id (in the inner run's plugin) -> the table's id."""
        return self.prefix + nodeid.removeprefix(f"{self.package}/")

    def from_junit(self, classname: str, name: str) -> str:
        """A junit-xml test case (`dask_upstream.array.tests.test_x`, `test_y[1]`) -> the table's id."""
        parts = classname.removeprefix(f"{self.package}.").split(".")
        # The module's dotted path, then its test classes (TestK): the module is the last test_* part.
        modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
        if not modules:
            return f"{classname}::{name}"
        end = modules[-1] + 1
        return "::".join([self.prefix + "/".join(parts[:end]) + ".py", *parts[end:], name])


@dataclass
class Result:
    test_id: str          # as in the documentation's table
    outcome: str          # passed, failed, error, skipped, xfailed
    message: str = ""
    text: str = ""
    seconds: float = 0.0

    @property
    def first_line(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""


def read_junit(path: Path, test_id: Callable[[str, str], str]) -> list[Result]:
    """The junit-xml's test cases; `test_id(classname, name)` gives each its table id."""
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        found = [child for child in case if child.tag in ("failure", "error", "skipped")]
        tags = {child.tag for child in found}
        # A failure outranks an error (in teardown, after it), which outranks a skip.
        outcome = ("failed" if "failure" in tags else "error" if "error" in tags
                   else "skipped" if "skipped" in tags else "passed")
        if outcome == "skipped" and found[0].get("type") == "pytest.xfail":
            outcome = "xfailed"
        shown = [c for c in found if c.tag != "skipped"] or found
        results.append(Result(test_id(case.get("classname", ""), case.get("name", "")), outcome,
                              " | ".join(c.get("message", "") for c in shown),
                              "\n".join((c.text or "").strip() for c in shown),
                              float(case.get("time") or 0)))
    return results


def finished_results(run: PytestRun, test_id: Callable[[str, str], str]) -> list[Result]:
    """Start `run`, wait for it (stopped after its run_timeout) and read its junit-xml."""
    run.start()
    run.wait()
    return read_junit(run.junit, test_id) if run.junit.exists() else []


def outcome_counts(results: list[Result]) -> str:
    """'6 failed, 234 passed, ...': how many tests ended each way."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))


def table_problems(run: PytestRun, results: list[Result], rows: dict[str, Row],
                   failed: tuple[str, ...] = ("failed", "error")) -> list[str]:
    """What is wrong with a run held to a table of expected failures: the run as a whole, a test
    that failed and is not in the table, one in the table that passes, a row naming no test."""
    bad = run.ended_badly(results)
    for r in results:
        row = row_for(rows, r.test_id)
        if r.outcome in failed and row is None:
            bad.append(f"{r.test_id} {r.outcome.upper()}: {r.first_line}\n{indent(last_lines(r.text, 10))}\n"
                       "    (fix it, or add it to the table with its reason)")
        elif r.outcome == "passed" and row is not None:
            bad.append(f"{r.test_id} PASSES now: remove it from the table (line {row.line})")
    bad += [f"the table lists {row}, which the suite does not have"
            for row in unknown_rows(rows, {r.test_id for r in results})]
    return bad


# -- the documentation's table ------------------------------------------------------------
def table_section(doc: Path, heading: str, header: str) -> list[tuple[int, str]]:
    """The rows (line number, line) of the table headed `header` (its column names, as
    `| test | reason |`) in the section `heading` of `doc`, its header and separator lines left
    out. Other tables in the section are not it."""
    lines = doc.read_text().splitlines()
    try:
        start = lines.index(heading) + 1
    except ValueError:
        raise TableError(f"{doc}: no section headed {heading!r}") from None
    tables: list[list[tuple[int, str]]] = []
    previous = None
    for n, line in enumerate(lines[start:], start + 1):
        if line.startswith("## "):
            break
        if line.startswith("|"):
            if previous != n - 1:          # a table starts
                tables.append([])
            tables[-1].append((n, line))
            previous = n
    columns = _columns(header)
    for table in tables:
        # The first line is the header, the second its separator; every line after is a row.
        if _columns(table[0][1]) == columns and len(table) >= 2 and set(table[1][1]) <= set("|-: "):
            return table[2:]
    raise TableError(f"{doc}: no {header} table under {heading!r}")


def _columns(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


@dataclass(frozen=True)
class FailureTable:
    """Where a documentation page lists the tests we expect to fail, and how its rows look."""

    doc: Path
    heading: str               # the section, as `## ...`
    header: str                # the table's column names: the test first, the reason last
    test_id: str               # a regular expression every row's test id matches
    example: str               # a test id as the page writes them (for the error messages)
    # What is wrong with a row's middle columns (those between the test and the reason), or None.
    check: Callable[[tuple[str, ...]], str | None] = lambda middle: None


@dataclass(frozen=True)
class Row:
    test_id: str               # a test id, or a test without its parameters: all of them
    middle: tuple[str, ...]    # the columns between the test and the reason
    reason: str
    line: int


def known_failures(table: FailureTable, doc: Path | None = None) -> dict[str, Row]:
    """Row id -> its row, from `table`'s page (or `doc`, a page laid out as it). Strict: a row
    that cannot be read, has no reason, or is listed twice is a TableError naming its line."""
    doc = doc or table.doc
    columns = len(_columns(table.header))
    rows: dict[str, Row] = {}
    for n, line in table_section(doc, table.heading, table.header):
        line = line.strip()
        # The reason, the last column, may itself hold a `|`.
        cells = [c.strip() for c in line[1:-1].split("|", columns - 1)] if line.endswith("|") else []
        if len(cells) != columns or not re.fullmatch(r"`[^`]+`", cells[0]):
            raise TableError(f"{doc}:{n}: expected {table.header}, the test id in backticks, as `{table.example}`")
        test_id, middle, reason = cells[0][1:-1], tuple(cells[1:-1]), cells[-1]
        if not re.fullmatch(table.test_id, test_id):
            raise TableError(f"{doc}:{n}: {test_id!r} is not a test id like {table.example}")
        problem = table.check(middle)
        if problem:
            raise TableError(f"{doc}:{n}: {test_id}: {problem}")
        if not reason:
            raise TableError(f"{doc}:{n}: {test_id} has no reason")
        if test_id in rows:
            raise TableError(f"{doc}:{n}: {test_id} is listed twice")
        rows[test_id] = Row(test_id, middle, reason, n)
    return rows


def covers(row: str, test_id: str) -> bool:
    """The row id `row` is `test_id`, or `test_id`'s function without parameters (all of them)."""
    return test_id == row or ("[" not in row and test_id.startswith(row + "["))


def row_for(rows: dict[str, Row], test_id: str) -> Row | None:
    """The row for `test_id` (its own first, else its function's), or None."""
    return rows.get(test_id) or rows.get(test_id.split("[", 1)[0])


def unknown_rows(rows: dict[str, Row], collected: set[str]) -> list[str]:
    """Rows that name no collected test (renamed, mistyped): they would hide nothing and check nothing."""
    return sorted(row for row in rows if not any(covers(row, t) for t in collected))


# -- text -----------------------------------------------------------------------------------
def last_lines(text: str, n: int) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def tail(path: Path, n: int) -> str:
    return indent(last_lines(path.read_text(errors="replace"), n)) if path.exists() else "    (no output)"


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
