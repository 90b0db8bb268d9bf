"""Client methods that move results between this process and the workers: fetching them for
gather (`_fetch`), and scatter. Mixed into Client; they use its request plumbing (`_request`,
`_lt`, `_pool`, `_states`, `_set`, `_stream`, `_flush_out`).

Each worker is asked in requests of at most KEYS_PER_REQUEST keys, one after the other: a
message carries a frame per result, and one of more frames than its receiver accepts
(Limits.max_frames, 100,000) is refused. A gather of 200,000 results from 2 workers was
refused that way, the connection dropped, and the keys asked for again for ever.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import random
import time
import uuid
from collections.abc import Iterator

from .exceptions import TimeoutError
from .futures import Future
from .timeouts import parse_timeout
from ..retry import Backoff
from ..protocol import serialize
from ..protocol.frames import Limits
from ..protocol.messages import ErrorKind, Op

KEYS_PER_REQUEST = 10_000


class WorkerDataMixin:
    async def _fetch(self, keys: list[str]) -> tuple[dict, list]:
        who_has = await self._request({"op": Op.WHO_HAS, "keys": keys})
        by_worker: dict[str, list[str]] = collections.defaultdict(list)
        missing = []
        for key in keys:
            holders = who_has.get(key) or []
            if holders:
                by_worker[random.choice(holders)].append(key)
            else:
                missing.append(key)
        per_request = self._keys_per_request(self._pool.limits)

        async def from_worker(w: str, ks: list[str]) -> list:
            replies = []
            for i in range(0, len(ks), per_request):
                batch = ks[i:i + per_request]
                try:
                    replies.append((batch, await self._worker_request(w, {"op": Op.GET_DATA, "keys": batch})))
                except Exception as exc:  # this batch is asked for again (the holder may be gone)
                    replies.append((batch, exc))
            return replies

        per_worker = await asyncio.gather(*(from_worker(w, ks) for w, ks in by_worker.items()))
        values = {}
        for ks, reply in (item for replies in per_worker for item in replies):
            if isinstance(reply, BaseException):
                missing.extend(ks)
                continue
            for k, blob in reply["data"].items():
                values[k] = serialize.loads_value(blob)
            missing.extend(reply.get("missing") or [])
            # A result that cannot travel (does not pickle, too large for its worker to send):
            # a task error, said once, instead of asking again for ever.
            for k, why in (reply.get("errors") or {}).items():
                st = self._states.get(k)
                if st is not None:
                    self._set(k, st, "error", {"kind": ErrorKind.UNSENDABLE, "text": str(why)})
                    missing.append(k)
        return values, missing

    @staticmethod
    def _keys_per_request(limits: Limits | None) -> int:
        return max(1, min(KEYS_PER_REQUEST, ((limits or Limits()).max_frames - 1) // 2))

    async def _worker_request(self, address: str, msg: dict) -> dict:
        return await self._pool.request(address, msg)

    def scatter(self, data, workers=None, broadcast: bool | int = False, direct: bool | None = None,
                hash: bool = True, timeout: float | None = None):
        """Put local data on workers; returns futures shaped as `data`, as distributed's: a list,
        tuple, set or namedtuple gives one future per element, a dict one per key (named by the
        keys), anything else (a dict subclass too) one future. `workers` (an address, a worker's
        name, a (host, port) pair, or a list of them) puts it only there; `broadcast=True` on
        every one of them (a number: on that many). `direct` is accepted and changes nothing:
        the data always goes straight to the workers (our scheduler never handles user data).
        `timeout` (default: the client's) bounds the wait for a worker to put it on."""
        if isinstance(data, (queue.Queue, Iterator)):
            raise TypeError("scatter() takes a list, tuple, set, dict or one object, not an iterator or a queue: "
                            "make a list of it first (list(data)), or submit the work that produces it")
        timeout = self.timeout if timeout is None else parse_timeout(timeout, "scatter")
        if type(data) is range:
            data = list(data)
        shape = type(data)
        namedtuple = isinstance(data, tuple) and hasattr(data, "_fields")
        if shape is dict:
            items = list(data.items())
        elif shape in (list, tuple, set, frozenset) or namedtuple:
            items = [(None, v) for v in data]
        else:
            items = [(None, data)]
        blobs = []
        for k, v in items:
            with serialize.local_modules_by_value():
                blob = serialize.dumps_value(v)
            if k is None:
                token = serialize.tokenize(b"scatter", blob) if hash else uuid.uuid4().hex
                k = f"{type(v).__name__}-{token}"
            blobs.append((str(k), blob))
        futures = [Future(k, self) for k, _ in blobs]
        for f, (_, v) in zip(futures, items):
            f._state.type = type(v)                 # known here (Future.type)
        self._lt.run(self._scatter(blobs, workers, broadcast, timeout), timeout + self.timeout)
        self.wait_keys([f.key for f in futures], self.timeout)
        if shape is dict:
            return dict(zip(data, futures))
        if namedtuple:
            return shape(*futures)
        if shape in (list, tuple, set, frozenset):
            return shape(futures)
        return futures[0]

    async def _scatter(self, blobs: list, workers, broadcast: bool | int, timeout: float) -> None:
        targets = await self._scatter_targets(workers, timeout)
        random.shuffle(targets)
        copies = len(targets) if broadcast is True else max(1, min(int(broadcast or 1), len(targets)))
        plan: dict[str, dict] = collections.defaultdict(dict)
        who_has: dict[str, list] = collections.defaultdict(list)
        for i, (k, blob) in enumerate(blobs):
            for j in range(i, i + copies):
                w = targets[j % len(targets)]
                plan[w][k] = blob
                who_has[k].append(w)
        nbytes = {}

        async def put(w: str, data: dict) -> None:
            # Workers read with the default max_frames (a scatter of 200,000 items to one was
            # refused whole).
            items, n = list(data.items()), self._keys_per_request(None)
            for i in range(0, len(items), n):
                reply = await self._worker_request(w, {"op": Op.PUT_DATA, "data": dict(items[i:i + n])})
                nbytes.update(reply.get("nbytes") or {})

        await asyncio.gather(*(put(w, d) for w, d in plan.items()))
        self._flush_out()
        self._stream.send({"op": Op.SCATTER, "who_has": dict(who_has), "nbytes": nbytes})

    async def _scatter_targets(self, workers, timeout: float) -> list[str]:
        """The running workers to scatter to (those named by `workers`, if given), waiting up to
        `timeout` for one, as distributed's scatter does. A name no worker has is refused at once."""
        names = None if workers is None else [_worker_name(w) for w in
                                               (workers if isinstance(workers, (list, set, frozenset)) else [workers])]
        deadline, backoff = time.monotonic() + timeout, Backoff(0.05, 0.5)
        while True:
            table = await self._request({"op": Op.WORKERS})
            running = [w for w in table if w.get("status", "running") == "running"]
            if names is None:
                targets = [w["address"] for w in running]
            else:
                unknown = [n for n in names if not any(_is_worker(w, n) for w in table)]
                if unknown and table:
                    raise ValueError(f"scatter(workers=...): no worker is {', '.join(map(repr, unknown))}; the "
                                     f"cluster's workers: {', '.join(w['address'] + ' (' + str(w['name']) + ')' for w in table)}")
                targets = [w["address"] for w in running if any(_is_worker(w, n) for n in names)]
            if targets:
                return targets
            if time.monotonic() + backoff.peek() > deadline:
                raise TimeoutError(f"scatter(): no running worker{' of ' + repr(names) if names else ''} to put "
                                   f"the data on within {timeout:g} s; wait for workers first "
                                   "(client.wait_for_workers) or give a longer timeout=")
            await asyncio.sleep(backoff.next())


def _worker_name(w) -> str:
    """A worker as scatter(workers=) may name it: an address, a name, or (host, port)."""
    if isinstance(w, tuple) and len(w) == 2:
        return f"{w[0]}:{w[1]}"
    return str(w)


def _is_worker(row: dict, name: str) -> bool:
    address = row["address"]
    return name == address or address.endswith("://" + name) or name == str(row.get("name"))
