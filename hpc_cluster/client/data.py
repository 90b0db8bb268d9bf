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
import random
import uuid

from .futures import Future
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

    def scatter(self, data, broadcast: bool = False, hash: bool = True):
        """Put local data on workers; returns futures in the same shape (list, dict or one)."""
        if isinstance(data, dict):
            items = list(data.items())
        elif isinstance(data, (list, tuple)):
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
        self._lt.run(self._scatter(blobs, broadcast), self.timeout)
        self.wait_keys([f.key for f in futures], self.timeout)
        if isinstance(data, dict):
            return dict(zip(data, futures))
        if isinstance(data, (list, tuple)):
            return type(data)(futures) if isinstance(data, list) else tuple(futures)
        return futures[0]

    async def _scatter(self, blobs: list, broadcast: bool) -> None:
        workers = [w["address"] for w in await self._request({"op": Op.WORKERS})]
        if not workers:
            raise RuntimeError("no workers to scatter to; wait for workers (cluster.scale) first")
        random.shuffle(workers)
        plan: dict[str, dict] = collections.defaultdict(dict)
        who_has: dict[str, list] = collections.defaultdict(list)
        for i, (k, blob) in enumerate(blobs):
            for w in (workers if broadcast else [workers[i % len(workers)]]):
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
