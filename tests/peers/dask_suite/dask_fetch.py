"""dask's own tests for the installed dask version, fetched from the package registry.

Nothing of dask's is kept in this repository: the installed version's sdist is downloaded
with pip at test time into the cache outside git that tests/peers/conformance uses too
(helpers.peers.sdist: ~/.cache/hpc-cluster-tests, or $XDG_CACHE_HOME; pip checks the registry's
published hash),
its PKG-INFO is checked against the installed version, and only these files are extracted:

* the test files in FILES, and the helper modules they import (HELPERS);
* dask's two conftest.py files (the repository's: --runslow, assertion rewriting of
  dask's assert_eq helpers; dask/conftest.py: the `shuffle_method` and `xfail` fixtures,
  the pyarrow-strings markers), unchanged;
* the `[tool.pytest.ini_options]` of its pyproject.toml, as the inner runs' pytest.ini
  (markers, `filterwarnings = error` and the rest, as dask's CI runs them; see ini()).

They go into a package named `dask_upstream` laid out as dask's tree
(`dask_upstream/array/tests/test_reductions.py`), so they can never be mistaken for the
installed dask (whose wheel may ship its own copies) while `dask.array.utils.assert_eq` and
the rest still come from the installed dask. The one rewrite: an import of another of
dask's test modules (`from dask.dataframe.tests.test_multi import list_eq`) imports the
extracted copy, `dask_upstream.dataframe.tests.test_multi`; every other line is theirs.
"""

from __future__ import annotations

import importlib.util
import re
from importlib.metadata import version
from pathlib import Path

from helpers.peers import SuiteUnavailable, TableIds, pytest_ini, sdist_files

try:
    import tomllib
except ImportError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

PACKAGE = "dask_upstream"
# `dask_upstream/array/tests/test_x.py::test_y[1]` is `dask/array/tests/test_x.py::test_y[1]` in the table.
IDS = TableIds(PACKAGE, prefix="dask/")
VERSION = version("dask")
SDIST = f"dask-{VERSION}.tar.gz"

# The test files run, as paths in dask's tree (and in docs/dask-collections.md's table),
# the longest first (about 520, 120, 90, 50, 35 and 10 s on our client), so that the
# others run beside the longest, two at a time, and all end together.
FILES = (
    "dask/dataframe/tests/test_groupby.py",      # groupbys, each with the 'disk' and 'tasks' shuffles; split_out
    "dask/array/tests/test_reductions.py",
    "dask/dataframe/tests/test_shuffle.py",      # shuffle, set_index, partitioning by hash
    "dask/bag/tests/test_bag.py",
    "dask/array/tests/test_array_core.py",
    "dask/tests/test_delayed.py",
)
# Test modules the files import for their helpers; extracted, never run.
HELPERS = ("dask/dataframe/tests/test_multi.py",)
CONFTESTS = ("conftest.py", "dask/conftest.py")

_TEST_IMPORT = re.compile(r"^(\s*)(from|import) dask((?:\.\w+)*\.tests\.\w+)\b", re.M)


def extract_tree(dest: Path) -> Path:
    """The test package under `dest` (which is made; it also gets the conftest.py and the
    pytest.ini), laid out as dask's tree; returns `dest`."""
    dest.mkdir(parents=True)
    wanted = set(FILES) | set(HELPERS)
    with sdist_files("dask", VERSION, SDIST) as read:
        (dest / "conftest.py").write_text(read("conftest.py"))
        for name in sorted(wanted) + ["dask/conftest.py"]:
            rel = Path(name).relative_to("dask")
            target = dest / PACKAGE / rel
            for inner in [Path(), *reversed(rel.parents[:-1])]:
                package = dest / PACKAGE / inner
                package.mkdir(exist_ok=True)
                init = package / "__init__.py"
                if not init.exists():
                    # A tests/ directory keeps dask's own __init__.py; dask_upstream/ and
                    # dask_upstream/array/ get empty ones (dask's are the library, which
                    # stays the installed one).
                    init.write_text(read(f"dask/{inner}/__init__.py") if inner.name == "tests" else "")
            target.write_text(rewrite(read(name), wanted))
        (dest / "pytest.ini").write_text(ini(tomllib.loads(read("pyproject.toml"))))
    return dest


def rewrite(source: str, extracted: set[str]) -> str:
    """Imports of dask's test modules that we extracted import our copies."""
    def switch(m: re.Match) -> str:
        path = "dask" + m[3].replace(".", "/") + ".py"
        if path not in extracted:
            raise SuiteUnavailable(f"a test imports dask{m[3]}, which is not extracted: add {path} to HELPERS")
        return f"{m[1]}{m[2]} {PACKAGE}{m[3]}"
    return _TEST_IMPORT.sub(switch, source)


# pytest.ini: dask's settings, except what is about their CI's tooling.
DROPPED_ADDOPTS = ("-v", "--color=yes", "--durations=10")


def ini(pyproject: dict, rerunfailures: bool | None = None) -> str:
    """dask's [tool.pytest.ini_options] as a pytest.ini. Kept: markers, filterwarnings
    (`error`: a warning in the test process fails the test, as in dask's CI), xfail_strict,
    log_cli_level, --strict-markers/--strict-config. Dropped: --cov-config (no pytest-cov
    here), -v, --color, --durations. timeout_method becomes `signal`, as their CI script
    makes it on Linux (`thread` would end the whole run at the first hung test); the
    harness gives its own `timeout` on the command line. Where pytest-rerunfailures (their
    CI's, for the `flaky` marker) is not installed (`rerunfailures`: None, look), `flaky` is
    declared as a plain marker, so its tests run once, without reruns."""
    opts = dict(pyproject["tool"]["pytest"]["ini_options"])
    if rerunfailures is None:
        rerunfailures = importlib.util.find_spec("pytest_rerunfailures") is not None
    if not rerunfailures:
        opts["markers"] = [*opts.get("markers", []),
                           "flaky: pytest-rerunfailures' marker (not installed here: the test runs once)"]
    opts["addopts"] = [a for a in opts.get("addopts", [])
                       if a not in DROPPED_ADDOPTS and not a.startswith("--cov")]
    opts["timeout_method"] = "signal"
    opts["junit_family"] = "xunit2"
    return pytest_ini(opts)
