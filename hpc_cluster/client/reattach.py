"""A Client that loses its scheduler reattaches in the background (issue 16, point 4).

Before, a lost connection cancelled every pending future at once. Now the client keeps its
futures pending and reconnects for `reconnect` seconds (default 10 minutes) to the same
address, or to a new one its cluster file names (a scheduler restarted elsewhere). Once in,
it tells the new scheduler what it holds: the keys of its futures (`want-keys`: results kept
by reattached workers are taken, not recomputed) and the task specs of the ones not finished,
which a scheduler that does not know them (no journal, or a submission of the last instant
before the crash) runs again; one that knows them shares them. A `gather` or `result` waiting
meanwhile completes after the restart, within its own timeout.

The specs are the already-pickled payloads as they were sent (`SpecKeeper`), nothing is
pickled again. A spec is kept while its future is unfinished, or while a kept spec needs it
as an input; it goes with the result (or the error, or the release), so memory holds only
the unfinished part of the work.

Reattaching goes through a seam the Client offers (`Reattachable`: its public status, reconnect,
cluster, scheduler_address and limits, and a few methods to open, adopt and resume a
connection); it touches nothing private of the Client (tests/unit/client/test_reattach_seam.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from ..protocol.frames import Limits, ProtocolError
from ..protocol.messages import Op
from ..protocol.clusterfile import read_cluster_file
from ..retry import Backoff
from .submission import CHUNK_TASKS, split_submission

logger = logging.getLogger("hpc_cluster.client")

DEFAULT_RECONNECT = 600.0          # seconds: as long as a worker waits (worker/reattach.py)


class Reattachable(Protocol):
    """All this module uses of a Client (client.py implements it): the seam for reattaching."""

    status: str                        # "reconnecting" while this module works
    reconnect: float                   # seconds the window lasts
    cluster: object | None             # the cluster object it was made from: closed, no scheduler returns
    scheduler_address: str
    limits: Limits                     # what the (adopted) scheduler reads with
    cluster_file: str | None           # names a restarted scheduler's address

    async def open_connection(self, address: str): ...                   # -> Comm
    def adopt_connection(self, address: str, comm, welcome: dict) -> None: ...
    def holdings(self) -> tuple[dict[str, int], set[str], list[dict], list]: ...   # refs, failed, specs, queue
    def requeue(self, items: list) -> None: ...           # at the head of the queue
    def send_now(self, msgs: list[dict]) -> None: ...     # one wire message each, ahead of the queue
    def run_again(self) -> None: ...                      # running: the requests and the queue go
    def give_up(self, text: str) -> None: ...             # the pending futures are cancelled


class SpecKeeper:
    """The task specs of unfinished work, for a scheduler that lost them. Not thread-safe: the
    client calls it under its lock."""

    def __init__(self):
        self.specs: dict[str, dict] = {}           # key -> spec, in submission order (topological)
        self.pins: dict[str, int] = {}             # key -> reasons to keep it (unfinished future, kept dependents)
        self.wanted: set[str] = set()              # keys whose future is unfinished

    def add(self, specs: list[dict], wanted) -> None:
        for spec in specs:
            key = spec["key"]
            if key in self.specs:
                continue
            self.specs[key] = spec
            self.pins.setdefault(key, 0)
            for dep in spec.get("deps") or ():
                if dep in self.specs:
                    self.pins[dep] += 1
        for key in wanted:
            if key in self.specs and key not in self.wanted:
                self.wanted.add(key)
                self.pins[key] += 1
        pins = self.pins
        for spec in specs:                 # an unwanted one nothing kept needs (cannot happen, but)
            if not pins.get(spec["key"]):
                self._maybe_drop(spec["key"])

    def done(self, key: str) -> None:
        """Its future finished, failed or was released: its spec may go (and inputs only it kept)."""
        if key in self.wanted:
            self.wanted.discard(key)
            self.pins[key] -= 1
            self._maybe_drop(key)

    def _maybe_drop(self, key: str) -> None:
        stack = [key]
        while stack:
            k = stack.pop()
            if k not in self.specs or self.pins.get(k, 0) > 0:
                continue
            spec = self.specs.pop(k)
            del self.pins[k]
            for dep in spec.get("deps") or ():
                if dep in self.specs:
                    self.pins[dep] -= 1
                    stack.append(dep)

    def pending(self) -> list[dict]:
        return list(self.specs.values())

    def __len__(self) -> int:
        return len(self.specs)


def _cluster_gone(cluster) -> bool:
    """The cluster object this client was made from was closed: its scheduler will not return."""
    return cluster is not None and str(getattr(cluster, "status", "")).rsplit(".", 1)[-1] in ("closing", "closed")


async def reattach_or_give_up(client: Reattachable) -> None:
    """After the window, the futures still pending are cancelled, saying why."""
    try:
        if await reattach(client):
            return
    except Exception:  # a bug here must not leave futures waiting for ever
        logger.exception("reconnecting to the scheduler failed")
    if client.status == "reconnecting":
        client.give_up(f"the connection to the scheduler was lost and it did not come back within "
                       f"{client.reconnect:g} s (Client(reconnect=))")


async def reattach(client: Reattachable) -> bool:
    """Reconnect `client` (its loop thread) and resume its work; False if the window ended."""
    lost = time.monotonic()
    end = lost + client.reconnect
    backoff = Backoff(0.1, 2.0, jitter=0.5)     # jittered: every client lost it at the same moment
    while client.status == "reconnecting" and time.monotonic() < end and not _cluster_gone(client.cluster):
        address = client.scheduler_address
        if client.cluster_file:
            try:
                # `up` resuming a cluster writes the file with no address until its scheduler
                # listens: not yet, so the old address (refused) and another round.
                address = read_cluster_file(client.cluster_file)["address"] or address
            except (OSError, ValueError, KeyError):
                pass
        try:
            comm = await asyncio.wait_for(client.open_connection(address),
                                          max(0.1, min(10.0, end - time.monotonic())))
            try:
                first = (await asyncio.wait_for(comm.read(), 10.0))[0]
            except BaseException:
                comm.close()
                raise
        except (OSError, ConnectionError, ProtocolError) as exc:     # TimeoutError is an OSError
            logger.info("scheduler %s not reachable yet (%s); %.0f s of the reconnect window left",
                        address, exc, end - time.monotonic())
            await asyncio.sleep(min(backoff.next(), max(0.0, end - time.monotonic())))
            continue
        if client.status != "reconnecting":
            comm.close()
            return False
        if address != client.scheduler_address:
            logger.warning("the cluster file names a new scheduler address, %s (was %s)", address,
                           client.scheduler_address)
        client.adopt_connection(address, comm, first)
        held, specs = resume(client)
        client.run_again()
        logger.warning("reattached to the scheduler at %s after %.1f s: %d futures held, %d tasks resubmitted",
                       address, time.monotonic() - lost, held, specs)
        return True
    return False


def resume(client: Reattachable) -> tuple[int, int]:
    """Tell a new scheduler connection what this client holds, before anything queued goes:
    first the keys without a spec kept (finished futures, scattered data), then the specs of
    unfinished work (their inputs among those keys exist by then)."""
    refs, failed, specs, queue = client.holdings()
    have_spec = {s["key"] for s in specs}
    # A failed future keeps its error: the new scheduler would only call it lost.
    keys = [k for k in refs if k not in have_spec and k not in failed]
    wanted = [s["key"] for s in specs if refs.get(s["key"], 0) > 0]
    # Submissions queued during the outage are among the specs: they would go twice.
    queued = [m for m in queue if not (isinstance(m, dict) and m.get("op") == Op.UPDATE_GRAPH)]
    msgs = [{"op": Op.WANT_KEYS, "keys": keys[i:i + CHUNK_TASKS]} for i in range(0, len(keys), CHUNK_TASKS)]
    parts, carried = split_submission(specs, wanted, client.limits) if specs else ([], [])
    client.requeue(list(carried) + queued)          # carried inputs are released after the last part
    client.send_now(msgs + parts)                   # one wire message each, within the limits
    return len(keys) + len(wanted), len(specs)
