"""What a Client says about itself and its scheduler, as distributed's does (issue 31, point 10):
scheduler_info() (the scheduler's identity: since when it runs, its workers and their totals),
repr/str (`<Client: 'tcp://...' processes=2 threads=4, memory=4.00 GiB>`), `client.futures`
(the futures it holds), nbytes(), and start() (ours starts in its constructor).

Mixed into Client (client/client.py); uses its request plumbing (`_request`, `_lt`, `timeout`,
`_lock`, `_refs`, `_states`, `_warn_on_other_versions`).
"""

from __future__ import annotations

import ast
import collections
import threading
import time

from .futures import Future
from ..protocol.messages import Op
from ..units import format_memory

# repr() asks the scheduler at most this often (distributed refreshes its copy every 2 s), and
# waits this long for it at most: a repr must come back even from a cluster that does not answer.
INFO_FRESH = 2.0
REPR_TIMEOUT = 2.0


def _key_name(key: str) -> str:
    """dask's key_split of a key as the scheduler holds it (a dask tuple key arrives as its repr)."""
    from dask.utils import key_split
    if key.startswith("("):
        try:
            return key_split(ast.literal_eval(key))
        except (ValueError, SyntaxError):
            pass
    return key_split(key)


class IdentityMixin:
    _info_at = float("-inf")               # when _last_info (asynchronous.py's) was fetched: time.monotonic

    def scheduler_info(self, n_workers: int = -1, **kwargs) -> dict:
        """The scheduler's identity, as distributed's: type, address, services, started (its
        start, seconds since the epoch), n_workers, total_threads, total_memory, and workers
        (address -> its row: name, nthreads, memory_limit, status, metrics, ...); `n_workers`
        (> 0) lists that many of them, the totals count all."""
        info = self._scheduler_info(stacklevel=2)
        if isinstance(n_workers, int) and n_workers >= 0:
            info = dict(info, workers=dict(list(info["workers"].items())[:n_workers]))
        return info

    def _scheduler_info(self, stacklevel: int, timeout: float | None = None) -> dict:
        info = self._lt.run(self._request({"op": Op.IDENTITY}), timeout or self.timeout)
        workers = info.pop("workers")
        self._warn_on_other_versions(None, {w["address"]: w.get("versions") for w in workers}, stacklevel + 1)
        info.update(address=self.scheduler_address, workers={w["address"]: w for w in workers})
        self._last_info, self._info_at = info, time.monotonic()
        return info

    def _info_for_repr(self) -> dict:
        """The identity, fresh enough; never blocks the caller's event loop or the client's own."""
        if (time.monotonic() - self._info_at < INFO_FRESH or self.asynchronous
                or threading.current_thread() is self._lt.thread):
            return self._last_info
        try:
            return self._scheduler_info(stacklevel=3, timeout=REPR_TIMEOUT)
        except Exception:                 # no answer now: what it last said
            return self._last_info

    def __repr__(self) -> str:
        name = type(self).__name__
        if self.status not in ("running", "connecting", "reconnecting") or not self.scheduler_address:
            return f"<{name}: No scheduler connected>"
        info = self._info_for_repr() if self.status == "running" else self._last_info
        if not info:
            return f"<{name}: scheduler={self.scheduler_address!r}>"
        return (f"<{name}: {self.scheduler_address!r} processes={info['n_workers']} "
                f"threads={info['total_threads']}, memory={format_memory(info['total_memory'])}>")

    @property
    def futures(self) -> dict:
        """The futures this client holds, as distributed's `client.futures`: key -> its state
        (`.status`: pending, finished, error or cancelled). A snapshot: a key leaves it as its
        last Future is dropped or released."""
        with self._lock:
            return {k: st for k in self._refs if (st := self._states.get(k)) is not None}

    def nbytes(self, keys=None, summary: bool = True, **kwargs) -> dict:
        """The bytes taken by each result held on the cluster (of `keys`, futures or keys, if
        given), as the workers measured them (dask's sizeof); with `summary`, summed by kind of
        task ({"inc": 84}: dask's key_split of the keys)."""
        if keys is not None:
            keys = [k.key if isinstance(k, Future) else k for k in keys]
        sizes = self._lt.run(self._request({"op": Op.NBYTES, "keys": keys}), self.timeout)
        if not summary:
            return sizes
        out: collections.Counter = collections.Counter()
        for key, n in sizes.items():
            out[_key_name(key)] += n
        return dict(out)

    def start(self, **kwargs) -> None:
        """distributed's start(), for a client made not started: ours starts as it is made (an
        asynchronous one in the background, awaited by `await client`), so this does nothing,
        as distributed's does for a client already started."""
