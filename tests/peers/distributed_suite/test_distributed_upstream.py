"""distributed's own synchronous tests (imports switched to ours) on an hpc_cluster LocalCluster.

Issue 31, point 10: the tests of distributed that use its public API through its `client` /
`c` / `loop` / `s, a, b` fixtures run against our Client (dist_plugin.py gives those fixtures,
made of ours); its async gen_cluster/gen_test tests, which drive distributed's Scheduler and
Worker objects in-process, are out of scope and deselected. Where the tests come from, and why
from Debian's package: dist_fetch.py.

Every test must pass or skip, or be listed with its reason in the table of
docs/migrating-from-distributed.md ("distributed's own tests, run against ours"), and a listed
test must fail: a fix shows as "PASSES now". The counts are printed at the end of the session.

Run alone: `.venv/bin/python -m pytest tests/peers/distributed_suite -ra`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import DIST_SUMMARY
from dist_fetch import FILES, PACKAGE, VERSION, extract, switch_imports

from helpers.peers import (REPO, FailureTable, PytestRun, SuiteUnavailable, TableError, TableIds, finished_results,
                           known_failures, make_run, outcome_counts, row_for, table_problems)

HERE = Path(__file__).resolve().parent
RUN_TIMEOUT = 1500
TABLE = FailureTable(
    doc=REPO / "docs" / "migrating-from-distributed.md",
    heading="## distributed's own tests, run against ours",
    header="| test | reason |",
    test_id=r"distributed/tests/test_\w+\.py::\w+(\[.*\])?",
    example="distributed/tests/test_client.py::test_upload_file_sync",
)
IDS = TableIds(package=PACKAGE, prefix="distributed/")


@pytest.fixture(scope="module")
def upstream_run():
    base = Path(tempfile.mkdtemp(prefix="hpc-cluster-distributed-suite-"))
    try:
        suite = extract(base / "suite")
    except SuiteUnavailable as e:
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(str(e), pytrace=False)
    run = make_run(PytestRun, suite, base / "run", [suite / PACKAGE / "tests" / f for f in FILES], "dist_plugin",
                   [HERE / "switched", HERE, suite], ["--timeout", "120"], run_timeout=RUN_TIMEOUT)
    results = finished_results(run, IDS.from_junit)
    DIST_SUMMARY.append(f"distributed {VERSION}'s synchronous tests ({len(FILES)} files) on our client: "
                        f"{outcome_counts(results)}, in {run.seconds or 0:.0f} s\n  repeat by hand: {run.by_hand()}")
    yield run, results
    run.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(RUN_TIMEOUT + 120)
def test_distributed_tests_on_our_client(upstream_run):
    """Exactly the tests in the table fail; the run itself went well."""
    run, results = upstream_run
    bad = table_problems(run, results, known_failures(TABLE))
    assert not bad, f"{len(bad)} problem(s):\n\n" + "\n\n".join(bad)


def test_async_tests_are_left_out_and_sync_ones_kept():
    """The selection: a gen_cluster test (wrapped coroutine) is out, a sync one is in."""
    import functools

    from dist_plugin import _is_async

    async def body():
        pass

    @functools.wraps(body)
    def wrapped():
        pass

    item = type("Item", (), {})
    for func, expected in ((body, True), (wrapped, True), (lambda: None, False)):
        item.obj = func
        assert _is_async(item) is expected


def test_rewrite_switches_public_imports_only():
    source = ("from distributed import Client, Lock\ndef f():\n    from distributed.client import wait\n"
              "from dask.distributed import Variable\n"
              "from distributed.utils_test import inc, cluster\nfrom distributed.core import Status\n")
    out = switch_imports(source)
    lines = [line.strip() for line in out.splitlines()]
    for switched in ("from distributed_switched import Client as Client", "from distributed_switched import Lock as Lock",
                     "from distributed_switched import wait", "from distributed_switched import Variable as Variable",
                     "from distributed_switched.utils_test import cluster as cluster",
                     "from distributed.core import Status as Status"):
        assert switched in lines, out
    # A name the installed version lacks is a stand-in, not an ImportError of the whole file.
    namespace = {}
    exec(compile(switch_imports("from dask.optimization import NoLongerThere\n"), "x", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="dask.optimization.NoLongerThere"):
        namespace["NoLongerThere"]()


def test_a_name_we_lack_is_a_placeholder_that_says_so():
    import distributed_switched

    import hpc_cluster
    assert distributed_switched.Client is hpc_cluster.Client
    with pytest.raises(NotImplementedError, match="hpc_cluster has no NoSuchThing"):
        distributed_switched.NoSuchThing()


def test_table_is_read(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text(f"{TABLE.heading}\n\n| test | reason |\n|---|---|\n"
                   "| `distributed/tests/test_client.py::test_x` | why |\n")
    rows = known_failures(TABLE, doc)
    assert row_for(rows, "distributed/tests/test_client.py::test_x[1]").reason == "why"
    doc.write_text(f"{TABLE.heading}\n\n| test | reason |\n|---|---|\n| `test_x` | why |\n")
    with pytest.raises(TableError):
        known_failures(TABLE, doc)
