"""dask-jobqueue 0.9.0's own SLURM, PBS, SGE, LSF, HTCondor, core and job tests, run against our classes.

Their sdist is downloaded from the package registry at test time (nothing of theirs is in
this repository), its imports are switched to ours (djq_suite.py says exactly which) and
its tests run under our plugin (djq_plugin.py), which provides what their conftest.py
does. Every test must pass, skip for a stated reason (a batch system we have no adapter
for, their internal Job class), or be listed with its reason in
docs/migrating-from-dask-jobqueue.md: the table there is read here and its tests must fail.

Run alone: `.venv/bin/python -m pytest tests/peers/conformance -ra` (add `-k no-E`, `-k E-pbs`,
`-k E-slurm`, `-k E-sge`, `-k E-lsf` or `-k E-htcondor` for one run); each run's summary ends the output with a command line that
repeats it by hand.
"""

from __future__ import annotations

import pytest
from djq_placeholders import placeholder
from djq_runs import RUN_TIMEOUT, SUMMARIES, problems, run_summary
from djq_suite import IDS, rewrite_imports
from djq_table import DOC, HEADING, TABLE

from helpers.peers import TableError, covers, known_failures, row_for, unknown_rows

UPSTREAM = '''import sys
from dask_jobqueue import (
    PBSCluster,
    MoabCluster,
)
from dask_jobqueue.core import JobQueueCluster, Job
from dask.distributed import Scheduler, Client
from distributed.security import Security
from dask_jobqueue.tests import QUEUE_WAIT


def test_x():
    from distributed import Client as C
'''


def test_import_rewrite_switches_only_the_names_we_provide_and_keeps_line_numbers():
    out = rewrite_imports(UPSTREAM).splitlines()
    assert len(out) == len(UPSTREAM.splitlines())
    assert out[:9] == [
        "import sys",
        "from hpc_cluster import PBSCluster; from djq_placeholders import placeholder; "
        "MoabCluster = placeholder('dask_jobqueue.MoabCluster')",
        "", "", "",
        "from hpc_cluster.deploy.cluster import JobQueueCluster; from djq_placeholders import placeholder; "
        "Job = placeholder('dask_jobqueue.core.Job')",
        "from dask.distributed import Scheduler; from hpc_cluster import Client",
        "from distributed.security import Security",
        "from . import QUEUE_WAIT",
    ]
    assert out[-1] == "    from hpc_cluster import Client as C"


def test_import_rewrite_refuses_what_it_cannot_switch():
    with pytest.raises(ValueError, match="import dask_jobqueue"):
        rewrite_imports("import dask_jobqueue.config\n")
    with pytest.raises(ValueError, match=r"import \*"):
        rewrite_imports("from dask_jobqueue import *\n")


def test_placeholders_skip_the_test_that_uses_them():
    moab = placeholder("dask_jobqueue.MoabCluster")
    assert moab is placeholder("dask_jobqueue.moab.MoabCluster")      # one object per name
    with pytest.raises(pytest.skip.Exception, match="MoabCluster: hpc-cluster has no Moab adapter yet"):
        moab(cores=1, memory="1GB")
    with pytest.raises(pytest.skip.Exception, match="internal Job class"):
        placeholder("dask_jobqueue.slurm.SLURMJob").job_script
    job = placeholder("dask_jobqueue.core.Job")
    with pytest.raises(pytest.skip.Exception, match=r"internal Job class \(Job\)"):
        job._call(["condor_q", "-batch"])                # their Job's private API, used by test_htcondor.py
    with pytest.raises(AttributeError):
        job._pytestfixturefunction                       # what pytest probes while collecting: not a use

    class MyJob(job):
        pass
    with pytest.raises(pytest.skip.Exception, match=r"internal Job class \(Job\)"):
        MyJob(cores=1)
    assert not issubclass(int, job) and moab.__name__ == "MoabCluster"


def test_table_rows_are_read_strictly(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text(f"# Page\n\n{HEADING}\n\nText.\n\n| test | reason |\n|---|---|\n"
                   "| `test_job.py::test_basic` | job_cls |\n"
                   "| `test_pbs.py::test_header[PBSCluster]` | directives |\n\n## Next\n| `x` | y |\n")
    table = known_failures(TABLE, doc)
    assert {k: row.reason for k, row in table.items()} == {
        "test_job.py::test_basic": "job_cls", "test_pbs.py::test_header[PBSCluster]": "directives"}
    assert row_for(table, "test_job.py::test_basic[SLURMCluster]").reason == "job_cls"    # a bare row: every param
    assert row_for(table, "test_job.py::test_basic_more") is None
    assert row_for(table, "test_pbs.py::test_header[MoabCluster]") is None         # a row with a param: that one
    assert covers("test_job.py::test_basic", "test_job.py::test_basic[PBSCluster]")
    for bad in ("| test_job.py::test_basic | no backticks |", "| `test_job.py::test_basic` |  |",
                "| `test_basic` | no file |"):
        doc.write_text(f"{HEADING}\n\n| test | reason |\n|---|---|\n{bad}\n")
        with pytest.raises(TableError):
            known_failures(TABLE, doc)


def test_test_ids_are_as_in_the_table():
    assert IDS.from_junit("dask_jobqueue_tests.test_slurm", "test_header[x]") == "test_slurm.py::test_header[x]"
    assert IDS.from_nodeid("dask_jobqueue_tests/test_slurm.py::test_header[x]") == "test_slurm.py::test_header[x]"
    # A test in a class: junit-xml's classname ends with the class, the node id has it after the file.
    assert IDS.from_junit("dask_jobqueue_tests.test_job.TestK", "test_a") == "test_job.py::TestK::test_a"


@pytest.mark.timeout(RUN_TIMEOUT + 120)
@pytest.mark.parametrize("env", [None, pytest.param("slurm", marks=pytest.mark.slurm),
                                 pytest.param("sge", marks=pytest.mark.sge), "pbs", "lsf", "htcondor"],
                         ids=["no-E", "E-slurm", "E-sge", "E-pbs", "E-lsf", "E-htcondor"])
def test_their_tests_pass_on_our_classes(djq_runs, env):
    run = djq_runs.get(env)
    results = run.results()
    text = run_summary(run, results)
    SUMMARIES.append(text)                 # the whole of it ends the session's output
    bad = problems(run, results, djq_runs.table)
    if bad:
        figures = "\n".join(text.splitlines()[:2])
        pytest.fail(f"{figures}\n\n{len(bad)} problem(s) (a test not in the table of {DOC.name} must pass or "
                    "skip; a test in it must fail):\n\n" + "\n\n".join(bad), pytrace=False)


def test_table_names_only_their_tests(djq_runs):
    """A row naming a test that does not exist (renamed, mistyped) would hide nothing and
    check nothing: every id in the table must be one the suite collects."""
    collected = {r.test_id for r in djq_runs.get(None).results()}
    assert collected, "the run without -E reported no tests"
    unknown = unknown_rows(djq_runs.table, collected)
    assert not unknown, f"{DOC.name} lists tests the suite does not have: {unknown}"
