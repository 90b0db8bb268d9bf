"""The table of dask's tests that fail on our client, read from docs/dask-collections.md.

The page is the single source of truth: test_dask_upstream.py requires exactly these
tests to fail on our client, and each row's second column, whether distributed's client
fails it too, to be what the run on distributed's client shows. A row that says "no" is a
failure that is ours alone: a bug to fix, and the suite fails until it is fixed, unless the
row says "no, deliberately" (we refuse what distributed does, on purpose, and say why). A row
that says "varies" is a test distributed's client passes or fails by chance (where its tasks
happen to land); it must say "deliberately" too, and its second column is not checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from djq_table import covers
from upstream import TableError, table_section

DOC = Path(__file__).resolve().parents[3] / "docs" / "dask-collections.md"
HEADING = "## dask's own tests, on our Client and on distributed's"
HEADER = "| test | fails with distributed's Client too? | reason |"

# A row: | `dask/x/tests/test_y.py::test_z[param]` | yes or no (and words) | reason |
_ROW = re.compile(r"^\|\s*`(?P<id>[^`]+)`\s*\|\s*(?P<shared>[^|]*?)\s*\|\s*(?P<reason>.*?)\s*\|\s*$")
_ID = re.compile(r"^dask/(\w+/)*tests/test_\w+\.py::test_\w+(\[.+\])?$")


@dataclass(frozen=True)
class Row:
    test_id: str
    shared: bool | None   # distributed's client fails it too (None: it varies)
    reason: str
    line: int
    deliberate: bool = False    # ours alone on purpose ("no, deliberately")


def known_failures(doc: Path = DOC) -> dict[str, Row]:
    """Row id -> its row. A row id is a test id, `dask/tests/test_delayed.py::test_x[1]`, or
    a test without its parameters, `dask/tests/test_delayed.py::test_x`, for all of them."""
    table: dict[str, Row] = {}
    for n, line in table_section(doc, HEADING, HEADER):
        m = _ROW.match(line)
        if m is None:
            raise TableError(f"{doc}:{n}: expected {HEADER}, the test id in backticks")
        test_id, shared, reason = m["id"], m["shared"].lower(), m["reason"]
        if not _ID.match(test_id):
            raise TableError(f"{doc}:{n}: {test_id!r} is not a test id like dask/tests/test_delayed.py::test_name[param]")
        if not shared.startswith(("yes", "no", "varies")):
            raise TableError(f"{doc}:{n}: {test_id}: the second column must start with yes, no or varies, "
                             f"not {m['shared']!r}")
        deliberate = not shared.startswith("yes") and "deliberately" in shared
        if shared.startswith("varies") and not deliberate:
            raise TableError(f"{doc}:{n}: {test_id}: a failure distributed's client has only sometimes is ours "
                             "alone the other times: a bug, unless the row says 'varies, deliberately'")
        if not reason:
            raise TableError(f"{doc}:{n}: {test_id} has no reason")
        if test_id in table:
            raise TableError(f"{doc}:{n}: {test_id} is listed twice")
        table[test_id] = Row(test_id, None if shared.startswith("varies") else shared.startswith("yes"), reason, n,
                             deliberate=deliberate)
    return table


def row_for(table: dict[str, Row], test_id: str) -> Row | None:
    """The row for `test_id` (its own first, else its function's), or None."""
    return table.get(test_id) or table.get(test_id.split("[", 1)[0])


def unknown_rows(table: dict[str, Row], collected: set[str]) -> list[str]:
    """Rows that name no collected test (renamed, mistyped): they would hide nothing and check nothing."""
    return sorted(row for row in table if not any(covers(row, t) for t in collected))
