"""xarray's own tests of its dask and distributed support on our Client (test_xarray_upstream.py)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

XARRAY_SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if XARRAY_SUMMARY:
        terminalreporter.section("xarray's tests on our client")
        for text in XARRAY_SUMMARY:
            terminalreporter.write_line(text)
