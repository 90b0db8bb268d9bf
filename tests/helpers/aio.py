"""Running a coroutine from a plain (synchronous) test: `run(coro)`, or `run(coro, timeout=20)`
where a hung peer must fail the test instead of hanging the suite."""

from __future__ import annotations

import asyncio


def run(coro, timeout: float | None = None):
    """asyncio.run(coro); with `timeout`, a coroutine still running after it raises TimeoutError."""
    return asyncio.run(asyncio.wait_for(coro, timeout) if timeout is not None else coro)
