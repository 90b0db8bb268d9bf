"""Waiting on conditions with a timeout (never sleeping for 'probably')."""

import time


def wait_until(condition, timeout: float = 20.0, what: str = "condition", interval: float = 0.02):
    """Poll `condition` until it is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
