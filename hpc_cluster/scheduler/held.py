"""What the scheduler's coordination (coordination.py) holds, apart from how it answers: values
(opaque bytes and the keys of the futures in them), the holders that keep those keys alive, the
requests that wait, semaphores and queues, and the checks of the names and timeouts clients send.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque

from ..protocol.frames import Opaque, ProtocolError
from ..protocol.messages import Op
from .checks import check_keys

FIRE_AND_FORGET = "fire-and-forget"            # the holder of fire_and_forget's keys
TIMED_OUT = {"timeout": True}                  # a parked request's answer when its time is up
KEY_IN_MEMORY, TASK_ERRED = Op.KEY_IN_MEMORY.value, Op.TASK_ERRED.value    # what a finished key is told with


class Failed(Exception):
    """A request we refuse; the client raises `kind` (a builtin exception's name) with the text."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind


def check_name(name):
    """A name as clients send it (a dask key: str, int, float, or a tuple of those, which msgpack
    brings as a list), hashable."""
    if isinstance(name, list):
        return tuple(check_name(n) for n in name)
    if isinstance(name, (str, int, float)) and not isinstance(name, bool):
        return name
    raise ProtocolError("a coordination name must be a string, a number or a tuple of those, not "
                        f"{type(name).__name__}")


def check_timeout(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    raise ProtocolError("timeout must be None or a number of seconds >= 0")


class Value:
    """Opaque bytes a client pickled and the keys of the futures in them."""

    __slots__ = ("data", "keys")

    def __init__(self, data: bytes, keys: list[str]):
        self.data, self.keys = data, keys

    @classmethod
    def from_wire(cls, value) -> "Value":
        if not isinstance(value, dict) or not isinstance(value.get("data"), Opaque):
            raise ProtocolError("a value must be {'data': opaque bytes, 'keys': [...]}")
        return cls(bytes(value["data"].data), list(dict.fromkeys(check_keys(value.get("keys", []), "keys"))))

    def wire(self) -> dict:
        return {"data": Opaque(self.data), "keys": self.keys}

    def record(self) -> dict:
        return {"data": self.data, "keys": self.keys}


class Parked:
    """A request waiting to be granted: answered (then unparked) or timed out."""

    __slots__ = ("cid", "msg", "worker", "where", "timer", "on_timeout")

    def __init__(self, cid: str, msg: dict, where, on_timeout=None):
        self.cid, self.msg, self.where, self.on_timeout = cid, msg, where, on_timeout
        worker = msg.get("worker")
        self.worker = worker if isinstance(worker, str) else None
        self.timer = None


class Semaphore:
    __slots__ = ("max_leases", "leases", "waiters")

    def __init__(self, max_leases: int):
        self.max_leases = max_leases
        self.leases: dict[str, Parked] = {}            # lease id -> who took it (cid, worker)
        self.waiters: deque[Parked] = deque()


class Queue:
    __slots__ = ("maxsize", "items", "getters", "putters", "refs")

    def __init__(self, maxsize: int):
        self.maxsize, self.refs = maxsize, 1
        self.items: deque[Value] = deque()
        self.getters: deque[Parked] = deque()
        self.putters: deque[Parked] = deque()

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self.items)


def holder(kind: str, name) -> str:
    """The pseudo-client that keeps a coordination object's keys alive."""
    return f"{kind}:{name!r}"


class Holders:
    """Keys kept alive for coordination objects: each holder is a client of the state machine,
    counting how many of its values hold each key."""

    def __init__(self, server):
        self.server = server
        self.counts: dict[str, Counter] = {}

    def check_known(self, keys: list[str]) -> None:
        missing = [k for k in keys if k not in self.server.state.tasks]
        if missing:
            raise Failed("ValueError", f"the future {missing[0]!r} is not known to the scheduler (released before "
                                       "it was shared?): keep a reference to it until it has been shared")

    def hold(self, who: str, keys: list[str]) -> None:
        st = self.server.state
        counts = self.counts.get(who)
        if counts is None:
            counts = self.counts[who] = Counter()
            st.add_client(who)
        new = [k for k in keys if not counts[k]]
        counts.update(keys)
        if new:
            st.client_wants(who, new, self.server.clock())

    def let_go(self, who: str, keys, every: bool = False) -> None:
        """One hold of each key fewer (`every`: all of them). The holder stays a client of the
        state until `drop`: leaving scans every task, too much for each queue item taken."""
        counts = self.counts.get(who)
        if counts is None:
            return
        gone = []
        for k in keys:
            if k in counts:
                counts[k] = 0 if every else counts[k] - 1
                if counts[k] <= 0:
                    del counts[k]
                    gone.append(k)
        if gone:
            self.server.state.client_releases(who, gone)

    def drop(self, who: str) -> None:
        """The object is gone: its holder lets go of every key and leaves the state's clients."""
        counts = self.counts.pop(who, None)
        if counts is not None:
            self.server.state.client_releases(who, list(counts))
            self.server.state.remove_client(who)

    def give(self, cid: str, keys: list[str]) -> None:
        """`cid` is sent a value holding `keys`: they are kept for it (handed over) until it says it
        holds futures to them (`taken`). Told their state before it made those futures, the client
        would drop the news (a key it does not know yet)."""
        if keys:
            self.hold(handing(cid), keys)

    def taken(self, cid: str, keys: list[str]) -> None:
        """`cid` holds futures to `keys` now: it wants them (and is told their state), the hand-over
        lets go."""
        keys = [k for k in keys if k in self.counts.get(handing(cid), ())]
        if keys:
            self.server.state.client_wants(cid, keys, self.server.clock())
            self.let_go(handing(cid), keys)

    def client_gone(self, cid: str) -> None:
        self.drop(handing(cid))


def handing(cid: str) -> str:
    """The holder of keys sent to client `cid` in values it has not yet said it took."""
    return f"handing:{cid}"


class DoneSink:
    """The "fire-and-forget" holder's stream among the server's: hears its keys finish or fail
    (the state machine tells every client wanting a key) and hands them to `done`."""

    def __init__(self, done):
        self.done = done

    def send(self, msg) -> None:
        self.extend([msg])

    def extend(self, msgs) -> None:
        keys = [m["key"] for m in msgs if isinstance(m, dict) and m.get("op") in (KEY_IN_MEMORY, TASK_ERRED)]
        if keys:         # later in this turn: the server's flush that told us is going through its outbox
            asyncio.get_running_loop().call_soon(self.done, keys)

    def flush(self) -> None:
        pass

    async def drain(self) -> None:
        pass
