"""xarray's own tests of its dask and distributed support, from the installed xarray's sdist.

Nothing of xarray's is kept in this repository: the installed version's sdist is downloaded with
pip at test time into the cache tests/peers' other suites use (helpers.peers.sdist), its PKG-INFO
checked, and only these files are extracted:

* xarray/tests/test_dask.py and test_distributed.py (FILES), and the test modules they import for
  their helpers, found by following their `xarray.tests.*` imports (test_backends.py, test_dataset.py,
  ...: imported, never run);
* xarray's two conftest.py files (the repository's: its command-line options and markers;
  xarray/tests/conftest.py: its fixtures), and xarray/tests/__init__.py, unchanged but for imports;
* the `[tool.pytest.ini_options]` of its pyproject.toml, as the inner run's pytest.ini.

They go into a package `xarray_upstream` laid out as xarray's tree, so they are never taken for the
installed xarray. Two rewrites (switch_xarray_imports()): an import of xarray's test modules
imports the extracted copy; in test_distributed.py, the imports of distributed's names import
ours, through the distributed suite's `distributed_switched` (tests/peers/distributed_suite/
switched), and its fixtures (loop, client, cluster_fixture, ...) are the distributed suite's
plugin's, made of ours (xr_fixtures.py). Every other line is theirs.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from helpers.peers import TableIds, pytest_ini, sdist_files

try:
    import tomllib
except ImportError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

PACKAGE = "xarray_upstream"
IDS = TableIds(PACKAGE, prefix="xarray/")          # xarray_upstream/tests/x.py -> xarray/tests/x.py
VERSION = version("xarray")
SDIST = f"xarray-{VERSION}.tar.gz"
FILES = ("xarray/tests/test_dask.py", "xarray/tests/test_distributed.py")
SWITCHED = "xarray/tests/test_distributed.py"

_TESTS_IMPORT = re.compile(r"^(\s*)(from|import) xarray\.tests((?:\.\w+)*)\b", re.M)
# test_distributed.py's imports of distributed: its public names -> ours; its fixtures -> ours.
_DISTRIBUTED = (
    (re.compile(r"^from dask\.distributed import ", re.M), "from distributed_switched import "),
    (re.compile(r"^from distributed\.client import ", re.M), "from distributed_switched import "),
    (re.compile(r"^from distributed\.utils_test import ", re.M), "from xr_fixtures import "),
)


def imported_test_modules(source: str) -> set[str]:
    """The files of xarray's test package that `source` imports (`xarray/tests/x.py`)."""
    return {f"xarray/tests{m[3].replace('.', '/')}.py" if m[3] else "xarray/tests/__init__.py"
            for m in _TESTS_IMPORT.finditer(source)}


def switch_xarray_imports(source: str, name: str) -> str:
    """Imports of xarray's test modules -> the extracted copies; in test_distributed.py,
    distributed's names and fixtures -> ours."""
    source = _TESTS_IMPORT.sub(lambda m: f"{m[1]}{m[2]} {PACKAGE}.tests{m[3]}", source)
    if name == SWITCHED:
        for pattern, replacement in _DISTRIBUTED:
            source, n = pattern.subn(replacement, source)
            if n != 1:
                raise ValueError(f"{name}: expected one `{pattern.pattern}` import, found {n}: is the "
                                 "rewrite still right for this xarray?")
    return source


def extract_xarray_tests(dest: Path) -> Path:
    """The test package under `dest` (made; with the conftest.py and the pytest.ini)."""
    (dest / PACKAGE / "tests").mkdir(parents=True)
    (dest / PACKAGE / "__init__.py").write_text("")
    with sdist_files("xarray", VERSION, SDIST) as read:
        (dest / "conftest.py").write_text(read("conftest.py"))
        todo, done = [*FILES, "xarray/tests/conftest.py", "xarray/tests/__init__.py"], set()
        while todo:
            name = todo.pop()
            if name in done:
                continue
            done.add(name)
            source = read(name)
            todo += sorted(imported_test_modules(source) - done)
            (dest / PACKAGE / Path(name).relative_to("xarray")).write_text(switch_xarray_imports(source, name))
        (dest / "pytest.ini").write_text(xarray_ini(tomllib.loads(read("pyproject.toml"))))
    return dest


def xarray_ini(pyproject: dict) -> str:
    """xarray's [tool.pytest.ini_options] as a pytest.ini: markers, filterwarnings (warnings from
    xarray are errors, as in its CI) and --strict-markers kept; --mypy-pyproject-toml-file
    (pytest-mypy-plugins', not installed) and the testpaths dropped."""
    opts = dict(pyproject["tool"]["pytest"]["ini_options"])
    opts["addopts"] = [a for a in opts.get("addopts", []) if a == "--strict-markers"]
    for key in ("testpaths", "minversion", "python_files"):
        opts.pop(key, None)
    opts["junit_family"] = "xunit2"
    return pytest_ini(opts)
