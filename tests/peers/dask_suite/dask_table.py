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

from pathlib import Path

from helpers.peers import FailureTable, Row

DOC = Path(__file__).resolve().parents[3] / "docs" / "dask-collections.md"
HEADING = "## dask's own tests, on our Client and on distributed's"


def distributed_fails_too(row: Row) -> bool | None:
    """The second column: distributed's client fails it too (None: it varies)."""
    said = row.middle[0].lower()
    return None if said.startswith("varies") else said.startswith("yes")


def deliberate(row: Row) -> bool:
    """Ours alone on purpose ("no, deliberately", "varies, deliberately")."""
    said = row.middle[0].lower()
    return not said.startswith("yes") and "deliberately" in said


def _second_column_problem(middle: tuple[str, ...]) -> str | None:
    said = middle[0].lower()
    if not said.startswith(("yes", "no", "varies")):
        return f"the second column must start with yes, no or varies, not {middle[0]!r}"
    if said.startswith("varies") and "deliberately" not in said:
        return ("a failure distributed's client has only sometimes is ours alone the other times: "
                "a bug, unless the row says 'varies, deliberately'")
    return None


# A row: | `dask/x/tests/test_y.py::test_z[param]` | yes or no (and words) | reason |; its test id
# is a test id, or a test without its parameters, for all of them.
TABLE = FailureTable(DOC, HEADING, "| test | fails with distributed's Client too? | reason |",
                     test_id=r"dask/(\w+/)*tests/test_\w+\.py::test_\w+(\[.+\])?",
                     example="dask/tests/test_delayed.py::test_name[param]", check=_second_column_problem)
