"""The table of dask-jobqueue tests we do not pass, read from the documentation page.

The page is the single source of truth: the plugin marks exactly these tests as strict
expected failures in the inner runs, and test_dask_jobqueue.py checks them, so the page
and the tests cannot drift apart. helpers.peers reads it (known_failures(TABLE)): a row is a
test id, `test_pbs.py::test_header[PBSCluster]`, or a test without its parameters,
`test_job.py::test_basic`, for all of them, and the reason we do not pass it.
"""

from __future__ import annotations

from pathlib import Path

from helpers.peers import FailureTable

DOC = Path(__file__).resolve().parents[3] / "docs" / "migrating-from-dask-jobqueue.md"
HEADING = "## dask-jobqueue's tests we do not pass"

TABLE = FailureTable(DOC, HEADING, "| test | reason |", test_id=r"test_\w+\.py::test_\w+(\[[^\]]+\])?",
                     example="test_slurm.py::test_header[param]")
