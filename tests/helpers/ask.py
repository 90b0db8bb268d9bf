"""Asking a running cluster what it holds, as the tests look at it (through the client's own
connection; not public API)."""

from __future__ import annotations


def task_counts(client, timeout: float | None = None) -> dict[str, int]:
    """The scheduler's tasks by state ({"queued": 3, ...}; a state with none is left out)."""
    return client._lt.run(client._request({"op": "counts"}), timeout)


def worker_pids(client) -> dict[str, int]:
    """Each connected worker's process id, by its address."""
    return {a: w["pid"] for a, w in client.scheduler_info()["workers"].items()}


def knows_key(client, key: str) -> bool:
    """Does the scheduler still have a task for `key` (not released and forgotten)?"""
    return client._lt.run(client._request({"op": "why", "key": key}), client.timeout) is not None


def holders(client, keys) -> dict[str, list[str]]:
    """The workers the scheduler says hold each key's result, by key."""
    return client._lt.run(client._request({"op": "who-has", "keys": list(keys)}), client.timeout)
