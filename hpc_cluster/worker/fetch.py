"""How a worker gets the inputs its tasks need from the workers that hold them (mixed into
Worker): which waiting tasks' inputs to fetch now, requests to each holder, a task made
ready when its inputs are all here, copies the scheduler asked for (client.replicate).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import random

from ..protocol import serialize
from ..protocol.messages import Op

GET_DATA = Op.GET_DATA.value            # a plain str: a literal's cost per fetch (protocol/messages.py)

logger = logging.getLogger("hpc_cluster.worker")

# Inputs held by peers are fetched, highest priority first, for the tasks a thread is free for,
# and ahead of a free thread (for the tasks the scheduler's prefetch slots sent) only while what
# is fetched ahead stays under this many bytes (dask's transfer message-bytes-limit, 50 MB). A
# fetched input takes memory from its arrival until its task ends: fetching for every task held
# made a rechunk's workers hold the remote pieces of three output blocks (70-80 MB each) while
# they could assemble one (benchmarks/collections.py, workload b); small inputs, whose round
# trip is the cost, are still fetched ahead (never fetching ahead cost tiny tasks 10-15%).
FETCH_AHEAD_BYTES = 50_000_000
# Inputs from one holder are asked for in requests of about this many bytes, one after the
# other: a holder serialises a whole reply before it writes it, and a slice of an array (a
# rechunk's pieces) is copied to be pickled, so one request for five 15 MB pieces held 75 MB of
# copies on the holder, and as much again of frames here, at once.
FETCH_REQUEST_BYTES = 20_000_000
# And of at most this many keys: a reply carries a frame per input, and one of more than
# Limits.max_frames (100,000) is refused (the client's gather had that bug).
FETCH_REQUEST_KEYS = 10_000


def request_batches(keys: list[str], sizes: dict, limit: int,
                    most_keys: int = FETCH_REQUEST_KEYS) -> list[list[str]]:
    """`keys` in consecutive groups of at most `limit` bytes by `sizes` (a key of unknown size
    counts 0; a key larger than `limit` goes alone) and at most `most_keys` keys."""
    batches, batch, total = [], [], 0
    for k in keys:
        n = sizes.get(k) or 0
        if batch and (total + n > limit or len(batch) >= most_keys):
            batches.append(batch)
            batch, total = [], 0
        batch.append(k)
        total += n
    if batch:
        batches.append(batch)
    return batches


class FetchMixin:
    def _committed(self) -> tuple[int, int]:
        """(tasks running (not seceded), ready to run, or with their inputs on the way; the bytes
        fetched for those of them not running: what waits for a thread)."""
        count, ahead = self._busy(), 0
        for ts in self.tasks.values():
            if ts.state in ("ready", "fetching"):
                count, ahead = count + 1, ahead + ts.fetched
        return count, ahead

    def _fetch_more(self) -> None:
        """Start fetching the inputs of waiting tasks, highest priority first: for a task a
        thread will be free for, or ahead of one within FETCH_AHEAD_BYTES."""
        while self.waiting:
            ts = self.tasks.get(self.waiting[0][1])
            if ts is None or ts.state != "waiting":
                heapq.heappop(self.waiting)
                continue
            ts.missing = {dep for dep in ts.missing if dep not in self.data}   # some came meanwhile
            need = sum(ts.sizes.get(dep, 0) for dep in ts.missing)
            count, ahead = self._committed()
            if count >= self.nthreads and ahead + need > FETCH_AHEAD_BYTES:
                return                           # when a thread frees (_run_ready calls again)
            heapq.heappop(self.waiting)
            if ts.missing:
                ts.state, ts.fetched = "fetching", need
                self._fetch_for(ts)
            else:
                self._make_ready(ts)

    def _fetch_for(self, ts) -> None:
        by_holder: dict[str, list[str]] = collections.defaultdict(list)
        for dep in ts.missing:
            if dep in self._fetching:
                continue
            holders = [h for h in ts.deps[dep] if h != self.address]
            if not holders:
                self._missing(ts, dep, ts.deps[dep])
                return
            by_holder[random.choice(holders)].append(dep)
        for holder, keys in by_holder.items():
            ask = self._asking.get(holder)
            if ask is None:
                # One request per holder for what this turn's tasks need from it: a tree's
                # level asked each input apart (a connection, and over TLS a record each way,
                # per input); sent at the end of the turn, split by request_batches as before.
                fut = self.loop.create_future()
                fut.holder = holder
                ask = self._asking[holder] = (fut, [], {})
                if len(self._asking) == 1:
                    self.loop.call_soon(self._ask_holders)
            fut, asked, sizes = ask
            for k in keys:
                self._fetching[k] = fut
                sizes[k] = ts.sizes.get(k, 0)
            asked.extend(keys)
        asyncio.create_task(self._await_inputs(ts))

    def _ask_holders(self) -> None:
        asking, self._asking = self._asking, {}
        for holder, (fut, keys, sizes) in asking.items():
            asyncio.create_task(self._fetch(holder, keys, fut, sizes))

    async def _fetch(self, holder: str, keys: list[str], fut: asyncio.Future, sizes: dict | None = None) -> None:
        try:
            missing = []
            for batch in request_batches(keys, sizes or {}, FETCH_REQUEST_BYTES):
                reply = await self.request(holder, {"op": GET_DATA, "keys": batch})
                for k, blob in reply["data"].items():
                    if k in self.borrowed or k in self.nbytes:    # not if every task wanting it went
                        self.data.put(k, serialize.loads_value(blob), spill=False)
                del reply["data"]                                  # its frames, before the next request
                self.memory.spill_soon()
                if len(self._unsendable) > 10_000:
                    self._unsendable.clear()
                self._unsendable.update((k, str(why)) for k, why in (reply.get("errors") or {}).items())
                missing += reply.get("missing") or []
            fut.set_result(missing)
        except Exception as exc:
            logger.warning("could not fetch %d keys from %s: %s", len(keys), holder, exc)
            fut.set_result(list(keys))
        finally:
            for k in keys:
                if self._fetching.get(k) is fut:
                    del self._fetching[k]

    async def _await_inputs(self, ts) -> None:
        while ts.missing:
            dep = next(iter(ts.missing))
            fut = self._fetching.get(dep)
            if fut is not None:
                await fut
            if self.tasks.get(ts.key) is not ts:
                return
            if dep in self.data:
                ts.missing.discard(dep)
            elif dep in self._unsendable and dep not in self._fetching:
                # Its holder cannot send it (see _payloads): fetching again fails alike.
                self._forget_task(ts)
                self._input_erred(ts, RuntimeError(f"input of {ts.key!r}: {self._unsendable[dep]}"))
                return
            elif dep not in self._fetching:
                self._missing(ts, dep, [getattr(fut, "holder", None) or h for h in ts.deps[dep]][:1])
                return
        if self.tasks.get(ts.key) is ts and ts.state == "fetching":
            self._make_ready(ts)
            self._run_ready()

    async def _fetch_replica(self, key: str, holders: list[str]) -> None:
        """Keep a copy the scheduler asked for (client.replicate)."""
        for holder in random.sample(holders, len(holders)):
            try:
                reply = await self.request(holder, {"op": GET_DATA, "keys": [key]})
            except Exception as exc:
                logger.warning("could not copy %r from %s: %s", key, holder, exc)
                continue
            if key in reply["data"]:
                self.nbytes[key] = self.data.put(key, serialize.loads_value(reply["data"][key]), spill=False)
                self.memory.spill_soon()
                self.scheduler.send({"op": Op.ADD_REPLICA, "key": key, "nbytes": self.nbytes[key]})
                return
        self.scheduler.send({"op": Op.REPLICA_FAILED, "key": key})

    def _missing(self, ts, dep: str, holders: list[str]) -> None:
        self._forget_task(ts)
        self.scheduler.send({"op": Op.MISSING_DATA, "key": ts.key, "dep": dep, "holders": holders})
