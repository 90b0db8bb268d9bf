"""Waiting on conditions with a timeout (never sleeping for 'probably'): the one poll-until-a-
deadline of the tests, in the pytest process (wait_until), on an event loop (wait_until_async)
and inside a task a worker runs (wait_for_file).

Programs that run outside pytest's process and cannot import this package keep a loop of their
own, each with a comment saying so (the simulators' commands, dask's workers in tests/peers)."""

from __future__ import annotations

import asyncio
import os
import time


class WaitTimeout(AssertionError, TimeoutError):
    """A wait ran out of time. An AssertionError (a test failure, not an error in the test)
    and a TimeoutError, so that callers that catch either to add what they saw keep working."""


def _timed_out(timeout: float, what: str) -> WaitTimeout:
    return WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")


def wait_until(condition, timeout: float = 20.0, what: str = "condition", interval: float = 0.02):
    """Poll `condition` until it is truthy and return that value; fail naming `what` after
    `timeout` seconds. Poll batch commands (squeue, sacct, qstat) with a longer `interval`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what)
        time.sleep(interval)


async def wait_until_async(condition, timeout: float = 20.0, what: str = "condition", interval: float = 0.01):
    """wait_until on an event loop: sleeps with asyncio, so the loop's own tasks go on meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what)
        await asyncio.sleep(interval)


def wait_for_file(path: str, timeout: float = 30.0) -> str:
    """A task's gate: returns `path` once the test creates it, or at the deadline anyway (the
    test's own assertion then says what went wrong, not an error raised inside a worker).
    Workers cannot import tests/helpers: our client sends it by value, as it does a test
    module's functions (protocol/serialize.py, local_modules_by_value)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return path

