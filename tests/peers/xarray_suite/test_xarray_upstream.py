"""xarray's own tests of its dask support (xarray/tests/test_dask.py) and of distributed's
(test_distributed.py), from the installed xarray's sdist, on our Client (issue 31, point 8).

One inner pytest run of both files, with xarray's own pytest settings (warnings from xarray are
errors): test_dask.py's computes go to one LocalCluster of ours whose Client is dask's default
scheduler (xr_plugin.py); test_distributed.py's tests start clusters and clients of their own, its
imports of distributed switched to ours (xr_fetch.py, xr_fixtures.py; its async gen_cluster tests
are deselected, as in the distributed suite). Every test must pass, skip or xfail as xarray says,
or be listed with its reason in docs/dask-collections.md ("xarray's own tests, on our Client"); a
listed test must fail. The counts are printed at the end of the session.

Run alone: `.venv/bin/python -m pytest tests/peers/xarray_suite -ra`.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import XARRAY_SUMMARY
from xr_fetch import FILES, IDS, PACKAGE, VERSION, extract_xarray_tests, imported_test_modules, switch_xarray_imports

from helpers.peers import (REPO, FailureTable, PytestRun, SuiteUnavailable, TableError, finished_results,
                           known_failures, make_run, outcome_counts, row_for, table_problems)

HERE = Path(__file__).resolve().parent
DISTRIBUTED_SUITE = HERE.parent / "distributed_suite"      # its switched names and plugin, reused
RUN_TIMEOUT = 1800
TABLE = FailureTable(
    doc=REPO / "docs" / "dask-collections.md",
    heading="## xarray's own tests, on our Client",
    header="| test | reason |",
    test_id=r"xarray/tests/test_(dask|distributed)\.py::[\w:]+(\[.*\])?",
    example="xarray/tests/test_dask.py::TestVariable::test_pickle",
)


@pytest.fixture(scope="module")
def xarray_run():
    base = Path(tempfile.mkdtemp(prefix="hpc-cluster-xarray-suite-"))
    try:
        suite = extract_xarray_tests(base / "suite")
    except SuiteUnavailable as e:
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(str(e), pytrace=False)
    targets = [suite / PACKAGE / Path(f).relative_to("xarray") for f in FILES]
    run = make_run(PytestRun, suite, base / "run", targets, "dist_plugin",
                   [DISTRIBUTED_SUITE / "switched", DISTRIBUTED_SUITE, HERE, suite],
                   ["-p", "xr_plugin", "--timeout", "300"], run_timeout=RUN_TIMEOUT)
    results = finished_results(run, IDS.from_junit)
    XARRAY_SUMMARY.append(f"xarray {VERSION}'s test_dask.py and test_distributed.py on our client: "
                          f"{outcome_counts(results)}, in {run.seconds or 0:.0f} s\n"
                          f"  repeat by hand: {run.by_hand()}")
    yield run, results
    run.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_xarray_tests_on_our_client(xarray_run):
    """Exactly the tests in the table fail; the run itself went well."""
    run, results = xarray_run
    bad = table_problems(run, results, known_failures(TABLE))
    assert not bad, f"{len(bad)} problem(s):\n\n" + "\n\n".join(bad)


def test_both_files_ran_and_the_distributed_one_on_ours(xarray_run):
    """Not an empty pass: each file reported tests, and test_distributed.py's netCDF round trips ran."""
    _, results = xarray_run
    ran = collections.Counter(r.test_id.split("::")[0] for r in results if r.outcome != "skipped")
    assert ran["xarray/tests/test_dask.py"] > 100 and ran["xarray/tests/test_distributed.py"] >= 10, ran
    assert any(r.test_id.startswith("xarray/tests/test_distributed.py::test_dask_distributed_netcdf_roundtrip")
               and r.outcome == "passed" for r in results)


def test_rewrite_switches_distributed_and_the_test_package():
    source = ("from xarray.tests import (\n    assert_identical,\n)\n"
              "    from xarray.tests.test_backends import create_tmp_file\n"
              "from dask.distributed import Client, Lock\nfrom distributed.client import futures_of\n"
              "from distributed.utils_test import (\n    cluster,\n)\nimport xarray as xr\n")
    assert imported_test_modules(source) == {"xarray/tests/__init__.py", "xarray/tests/test_backends.py"}
    assert switch_xarray_imports(source, "xarray/tests/test_distributed.py").splitlines() == [
        f"from {PACKAGE}.tests import (", "    assert_identical,", ")",
        f"    from {PACKAGE}.tests.test_backends import create_tmp_file",
        "from distributed_switched import Client, Lock", "from distributed_switched import futures_of",
        "from xr_fixtures import (", "    cluster,", ")", "import xarray as xr"]
    unswitched = switch_xarray_imports(source.replace("from dask.distributed", "#"), "xarray/tests/test_dask.py")
    assert "distributed_switched" not in unswitched
    with pytest.raises(ValueError, match="expected one"):
        switch_xarray_imports("import xarray\n", "xarray/tests/test_distributed.py")


def test_table_is_read(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text(f"{TABLE.heading}\n\n| test | reason |\n|---|---|\n"
                   "| `xarray/tests/test_dask.py::TestVariable::test_pickle` | why |\n")
    rows = known_failures(TABLE, doc)
    assert row_for(rows, "xarray/tests/test_dask.py::TestVariable::test_pickle").reason == "why"
    doc.write_text(f"{TABLE.heading}\n\n| test | reason |\n|---|---|\n| `test_pickle` | why |\n")
    with pytest.raises(TableError):
        known_failures(TABLE, doc)
