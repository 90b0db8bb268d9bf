"""The table of dask-jobqueue tests we do not pass, read from the documentation page.

The page is the single source of truth: the plugin marks exactly these tests as strict
expected failures in the inner runs, and test_dask_jobqueue.py checks them, so the page
and the tests cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

from upstream import TableError, table_section

DOC = Path(__file__).resolve().parents[3] / "docs" / "migrating-from-dask-jobqueue.md"
HEADING = "## dask-jobqueue's tests we do not pass"

# A row: | `test_file.py::test_name[param]` | reason |
_ROW = re.compile(r"^\|\s*`(?P<id>[^`]+)`\s*\|\s*(?P<reason>.*?)\s*\|\s*$")
_ID = re.compile(r"^test_\w+\.py::test_\w+(\[[^\]]+\])?$")


def known_failures(doc: Path = DOC) -> dict[str, str]:
    """Row id -> the reason we do not pass it. A row id is a test id, `test_pbs.py::test_header[PBSCluster]`,
    or a test without its parameters, `test_job.py::test_basic`, for all of them."""
    table: dict[str, str] = {}
    for n, line in table_section(doc, HEADING, "| test | reason |"):
        m = _ROW.match(line)
        if m is None:
            raise TableError(f"{doc}:{n}: expected | `test_file.py::test_name[param]` | reason |")
        test_id, reason = m["id"], m["reason"]
        if not _ID.match(test_id):
            raise TableError(f"{doc}:{n}: {test_id!r} is not a test id like test_slurm.py::test_header[param]")
        if not reason:
            raise TableError(f"{doc}:{n}: {test_id} has no reason")
        if test_id in table:
            raise TableError(f"{doc}:{n}: {test_id} is listed twice")
        table[test_id] = reason
    return table


def covers(row: str, test_id: str) -> bool:
    return test_id == row or ("[" not in row and test_id.startswith(row + "["))


def reason_for(table: dict[str, str], test_id: str) -> str | None:
    """The table's reason for `test_id` (its own row first, else its function's), or None."""
    if test_id in table:
        return table[test_id]
    return table.get(test_id.split("[", 1)[0])
