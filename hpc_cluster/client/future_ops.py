"""Client methods around futures that distributed's Client has and the core (client.py) does
not need: retry, get_executor, wait_for_workers, `client.scheduler`, and adopt_keys (a future
moved to this client: Future.bind_client). Mixed into Client; they use its request plumbing
(`_request`, `_send`, `_lt`, `timeout`, `halted`, `_scheduler_info`).
"""

from __future__ import annotations

import time

from ..protocol.messages import Op
from ..retry import Backoff
from .exceptions import HPCClusterError, TimeoutError
from .futures import flatten_futures
from .timeouts import parse_timeout


class SchedulerRef:
    """`client.scheduler`: distributed's is an rpc to the scheduler; scripts read its
    `.address`, which is what this holds (the current one: a reattached client's follows)."""

    def __init__(self, client):
        self._client = client

    @property
    def address(self) -> str:
        return self._client.scheduler_address

    def __repr__(self) -> str:
        return f"<scheduler {self.address}>"


class FutureOpsMixin:
    @property
    def scheduler(self) -> SchedulerRef:
        return SchedulerRef(self)

    def retry(self, futures) -> None:
        """Run the failed futures among `futures` again (their tasks and the failed inputs they
        need: scheduler/state/retrying.py). Returns once the scheduler took it: the futures are
        pending again by then."""
        flat: list = []
        flatten_futures(futures, flat)
        keys = list(dict.fromkeys(f.key for f in flat))
        if keys:
            self._lt.run(self._request({"op": Op.RETRY, "keys": keys}), self.timeout)

    def adopt_keys(self, keys: list[str]) -> None:
        """Futures to `keys` made by another client are this one's now (Future.bind_client):
        the scheduler counts this client as wanting them and tells it their state. Returns
        once it has: a question asked after the want is answered after it."""
        self._send({"op": Op.WANT_KEYS, "keys": list(keys)})
        self._lt.run(self._request({"op": Op.WHO_HAS, "keys": list(keys)}), self.timeout)

    def get_executor(self, **kwargs):
        """A concurrent.futures Executor whose submit and map run on this cluster; `kwargs`
        (pure, retries, resources, workers, ...: submit's keywords) go with every task."""
        from .executor import ClientExecutor
        return ClientExecutor(self, **kwargs)

    def wait_for_workers(self, n_workers: int = 1, timeout=None, *, n: int | None = None) -> None:
        """Block until `n_workers` workers are connected (`n=` is the same, our older name;
        0 returns at once). TimeoutError after `timeout` (seconds, or a string: "1 minute"); an
        error at once if the cluster stopped starting workers (and says why)."""
        if n is not None:
            n_workers = n
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 0:
            raise ValueError(f"wait_for_workers(n_workers={n_workers!r}): give a whole number of workers, 0 or more")
        timeout = parse_timeout(timeout, "wait_for_workers")
        if n_workers == 0:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = Backoff(0.05, 1.0, factor=1.5)
        while len(self._scheduler_info(stacklevel=2)["workers"]) < n_workers:
            if self.halted:
                raise HPCClusterError(f"waiting for {n_workers} workers, but the cluster stopped starting them: "
                                      f"{self.halted}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {n_workers} workers after {timeout} s")
            time.sleep(backoff.next())
