"""Fixtures for running dask's own collection tests on our client (test_dask_upstream.py).

The inner runs are started together, once for this directory, by dask_runs.Campaign; each
test then waits for the runs it checks. The per-file summary is printed at the end of the
session, so CI logs show the figures whether the tests pass or not.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from dask_clusters import private_tmp_mode  # noqa: E402
from dask_runs import SUMMARIES, Campaign, campaign_summary, session_directory  # noqa: E402
from dask_table import TABLE  # noqa: E402

from helpers.peers import SuiteUnavailable, TableError, known_failures  # noqa: E402

def pytest_terminal_summary(terminalreporter):
    if SUMMARIES:
        terminalreporter.section("dask's tests on our client")
        for text in SUMMARIES:
            terminalreporter.write_line(text)


class Setup:
    """The campaign and the table, or why there are none (every test that needs them fails with it)."""

    def __init__(self):
        self.campaign: Campaign | None = None
        self.table = {}
        self.private_tmp, self.private_tmp_why = private_tmp_mode()
        self.failed: str | None = None

    def get(self) -> Campaign:
        if self.failed:
            pytest.fail(self.failed, pytrace=False)
        return self.campaign


@pytest.fixture(scope="module")
def dask_suite():
    setup = Setup()
    base = None
    try:
        setup.table = known_failures(TABLE)
        base = session_directory()
        setup.campaign = Campaign(base=base, private_tmp=setup.private_tmp).start()
    except (SuiteUnavailable, TableError, OSError) as e:
        setup.failed = str(e)
    if setup.private_tmp_why:
        SUMMARIES.append(f"NOTE: {setup.private_tmp_why}")
    yield setup
    # Kept when a test here failed, for a look (dask_runs.session_directory removes it
    # hours later); removed otherwise.
    if setup.campaign is not None:
        setup.campaign.close()
        if setup.campaign.seconds is not None:
            SUMMARIES.append(campaign_summary(setup.campaign, kept=bool(FAILURES)))
    if base is not None and not FAILURES:
        shutil.rmtree(base, ignore_errors=True)


FAILURES: list[str] = []


def pytest_runtest_logreport(report):
    if report.failed and Path(report.fspath).resolve().parent == HERE:
        FAILURES.append(report.nodeid)
