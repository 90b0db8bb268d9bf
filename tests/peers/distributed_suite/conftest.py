"""distributed's own synchronous tests on our Client (test_distributed_upstream.py)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "switched"))       # distributed_switched, as the inner runs have it

DIST_SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if DIST_SUMMARY:
        terminalreporter.section("distributed's tests on our client")
        for text in DIST_SUMMARY:
            terminalreporter.write_line(text)
