"""Locks, semaphores, multi-locks, events, variables, queues, published datasets and
fire-and-forget, kept by the scheduler for clients and for tasks (issue 31, point 5). The I/O
side of the scheduler, beside the pure state machine: the server hands it every message whose op
is in COORDINATION_OPS, tells it when a client or a worker goes, and it answers through the
server's replies (client/coordination.py and client/datasets.py are the other end).

What it keeps is opaque to it. A value (a variable's, a queue item, a dataset) is the bytes the
client pickled and the keys of the futures inside them. Those keys are kept alive by a *holder*:
a pseudo-client of the state machine named for the object (`variable:'x'`), which wants them as
any client wants a key, so the state machine needs nothing new; whoever takes the value wants
them too from that moment, before the holder lets go. `fire_and_forget` is the holder
"fire-and-forget", which lets go of a key when its task finished or failed (it hears that
through a stream of its own among the server's streams).

Waiting requests (lock and semaphore acquires, event waits, a variable or queue get, a put into
a full queue) are parked and answered when granted or when their timeout passes (a timer on the
loop); nothing waits in a coroutine. A lease belongs to the client that took it and, taken in a
task, to that task's worker: it is released when that client disconnects or the worker is
removed, and that client's parked requests are dropped.

Kept across a scheduler restart, through the journal's "C" records (journal.py): variables,
datasets, queues and their items, which events are set, semaphores' sizes. Leases and parked
requests are not: their clients come back with new connections (docs/migrating-from-distributed.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from ..protocol.frames import ProtocolError
from ..protocol.messages import Op
from .checks import check_keys
from .held import (FIRE_AND_FORGET, TIMED_OUT, DoneSink, Failed, Holders, Parked, Queue, Semaphore, Value,
                   check_name, check_timeout, handing, holder)

logger = logging.getLogger("hpc_cluster.scheduler")

COORDINATION_OPS = frozenset({
    Op.SEMAPHORE_REGISTER, Op.SEMAPHORE_ACQUIRE, Op.SEMAPHORE_RELEASE, Op.SEMAPHORE_VALUE,
    Op.SEMAPHORE_CLOSE, Op.MULTI_LOCK_ACQUIRE, Op.MULTI_LOCK_RELEASE, Op.EVENT_WAIT, Op.EVENT_SET,
    Op.EVENT_CLEAR, Op.EVENT_IS_SET, Op.VARIABLE_SET, Op.VARIABLE_GET, Op.VARIABLE_DELETE,
    Op.QUEUE_CREATE, Op.QUEUE_PUT, Op.QUEUE_GET, Op.QUEUE_SIZE, Op.QUEUE_CLOSE, Op.FIRE_AND_FORGET,
    Op.DATASET_PUT, Op.DATASET_GET, Op.DATASET_LIST, Op.DATASET_DELETE, Op.COORDINATION_TAKEN})


class Coordination:
    def __init__(self, server, recovered=None):
        self.server = server
        self.holders = Holders(server)
        self.semaphores: dict = {}
        self.multi: dict = {}                      # lock name -> deque of request ids, the holder first
        self.requests: dict[str, tuple[Parked, set, int]] = {}   # id -> (who, names, locks needed)
        self.granted: set[str] = set()
        self.events: dict = {}                     # name -> [flag, waiters]
        self.variables: dict = {}
        self.var_waiters: dict = {}
        self.queues: dict = {}
        self.datasets: dict = {}
        self.parked: set[Parked] = set()
        self.dirty: set[tuple[str, object]] = set()      # (kind, name) to journal
        self.handlers = {
            Op.SEMAPHORE_REGISTER: self.semaphore_register, Op.SEMAPHORE_ACQUIRE: self.semaphore_acquire,
            Op.SEMAPHORE_RELEASE: self.semaphore_release, Op.SEMAPHORE_VALUE: self.semaphore_value,
            Op.SEMAPHORE_CLOSE: self.semaphore_close, Op.MULTI_LOCK_ACQUIRE: self.multi_acquire,
            Op.MULTI_LOCK_RELEASE: self.multi_release, Op.EVENT_WAIT: self.event_wait,
            Op.EVENT_SET: self.event_set, Op.EVENT_CLEAR: self.event_clear, Op.EVENT_IS_SET: self.event_is_set,
            Op.VARIABLE_SET: self.variable_set, Op.VARIABLE_GET: self.variable_get,
            Op.VARIABLE_DELETE: self.variable_delete, Op.QUEUE_CREATE: self.queue_create,
            Op.QUEUE_PUT: self.queue_put, Op.QUEUE_GET: self.queue_get, Op.QUEUE_SIZE: self.queue_size,
            Op.QUEUE_CLOSE: self.queue_close, Op.FIRE_AND_FORGET: self.fire_and_forget,
            Op.DATASET_PUT: self.dataset_put, Op.DATASET_GET: self.dataset_get,
            Op.DATASET_LIST: self.dataset_list, Op.DATASET_DELETE: self.dataset_delete,
            Op.COORDINATION_TAKEN: self.taken}
        server.streams[FIRE_AND_FORGET] = DoneSink(self.forget_done)
        if server.journal is not None:
            server.journal.extra = self.journal_records
        if recovered is not None:
            self._restore(recovered)

    # -- the server's side ---------------------------------------------------------------
    def handle(self, cid: str, msg: dict) -> None:
        try:
            result = self.handlers[msg["op"]](cid, msg)
        except Failed as exc:
            result = {"error": str(exc), "type": exc.kind}
        if result is not None:
            self.answer(cid, msg, result)

    def answer(self, cid: str, msg: dict, result) -> None:
        if msg.get("rid") is not None:             # deletes, closes, fire_and_forget: no one waits
            self.server._reply(cid, msg, result)

    def holds(self, cid: str) -> bool:
        """Is `cid` one of our holders (not a client that may reconnect)?"""
        return cid == FIRE_AND_FORGET or (cid in self.holders.counts and not cid.startswith(handing("")))

    def client_gone(self, cid: str) -> None:
        self._drop(lambda p: p.cid == cid)
        self.holders.client_gone(cid)

    def taken(self, cid, msg):
        self.holders.taken(cid, check_keys(msg["keys"], "keys"))
        return None

    def worker_gone(self, address: str) -> None:
        """Leases taken by tasks on a worker that is gone are released (its client may linger)."""
        self._drop(lambda p: p.worker == address)

    def _drop(self, gone) -> None:
        for p in [p for p in self.parked if gone(p)]:
            self._unpark(p)
            if p.on_timeout is not None:
                p.on_timeout(p)
        for name, sem in list(self.semaphores.items()):
            lost = [lease for lease, p in sem.leases.items() if gone(p)]
            for lease in lost:
                del sem.leases[lease]
                logger.info("lease %s of semaphore %r released: its holder is gone", lease, name)
            if lost:
                self._grant_leases(sem)
        for rid in [rid for rid, (p, _, _) in self.requests.items() if gone(p)]:
            self._multi_leave(rid)
        for name in [n for n, (flag, waiters) in self.events.items() if not flag and not waiters]:
            del self.events[name]

    # -- parking -------------------------------------------------------------------------
    def _park(self, cid: str, msg: dict, where, timeout: float | None, on_timeout=None) -> Parked:
        p = Parked(cid, msg, where, on_timeout)
        where.append(p)
        self.parked.add(p)
        if timeout is not None:
            p.timer = asyncio.get_running_loop().call_later(timeout, self._time_out, p)
        return p

    def _unpark(self, p: Parked) -> None:
        if p.timer is not None:
            p.timer.cancel()
        self.parked.discard(p)
        if p in p.where:
            p.where.remove(p)

    def _time_out(self, p: Parked) -> None:
        if p not in self.parked:
            return
        self._unpark(p)
        if p.on_timeout is not None:
            p.on_timeout(p)
        self.answer(p.cid, p.msg, TIMED_OUT)
        self.server._flush()

    def _grant(self, p: Parked, value) -> None:
        self._unpark(p)
        self.answer(p.cid, p.msg, {"ok": value})

    # -- semaphores and locks (a Lock is a semaphore of one lease) --------------------------
    def _semaphore(self, msg: dict) -> tuple[object, Semaphore]:
        name, n = check_name(msg["name"]), msg["max_leases"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise Failed("ValueError", f"max_leases={n!r}: give a whole number of leases >= 1")
        sem = self.semaphores.get(name)
        if sem is None:
            sem = self.semaphores[name] = Semaphore(n)
            self.dirty.add(("semaphore", name))
        elif sem.max_leases != n:
            raise Failed("ValueError", f"Inconsistent max leases: {n}, expected: {sem.max_leases} (semaphore "
                                       f"{name!r} exists with max_leases={sem.max_leases}; a Lock is one lease: "
                                       "use the same max_leases wherever the name is used)")
        return name, sem

    def semaphore_register(self, cid, msg):
        self._semaphore(msg)
        return {"ok": True}

    def semaphore_acquire(self, cid, msg):
        _, sem = self._semaphore(msg)
        lease, timeout = msg["lease"], check_timeout(msg.get("timeout"))
        if not isinstance(lease, str):
            raise ProtocolError("lease must be a string")
        if lease in sem.leases:                         # asked again (a retry): it has it
            return {"ok": True}
        if len(sem.leases) < sem.max_leases and not sem.waiters:
            sem.leases[lease] = Parked(cid, msg, None)
            return {"ok": True}
        if timeout == 0:
            return TIMED_OUT
        self._park(cid, msg, sem.waiters, timeout)
        return None

    def _grant_leases(self, sem: Semaphore) -> None:
        while sem.waiters and len(sem.leases) < sem.max_leases:
            p = sem.waiters[0]
            sem.leases[p.msg["lease"]] = p
            self._grant(p, True)

    def semaphore_release(self, cid, msg):
        sem = self.semaphores.get(check_name(msg["name"]))
        if sem is None or sem.leases.pop(msg["lease"], None) is None:
            # distributed warns too: the lease was released before (its holder went, or a close)
            return {"ok": False}
        self._grant_leases(sem)
        return {"ok": True}

    def semaphore_value(self, cid, msg):
        sem = self.semaphores.get(check_name(msg["name"]))
        return {"ok": 0 if sem is None else len(sem.leases)}

    def semaphore_close(self, cid, msg):
        name = check_name(msg["name"])
        sem = self.semaphores.pop(name, None)
        if sem is not None:
            self.dirty.add(("semaphore", name))
            if sem.leases:
                logger.warning("semaphore %r closed with %d leases held", name, len(sem.leases))
            for p in list(sem.waiters):
                self._unpark(p)
                self.answer(p.cid, p.msg, {"error": f"the semaphore {name!r} was closed while this waited for "
                                                    "a lease", "type": "RuntimeError"})
        return {"ok": None}

    # -- multi-locks: each lock name a queue of request ids, the holder first ------------------
    def multi_acquire(self, cid, msg):
        rid, names, timeout = msg["id"], [check_name(n) for n in msg["names"]], check_timeout(msg.get("timeout"))
        need = msg.get("num_locks") or len(names)
        if not isinstance(rid, str) or rid in self.requests:
            raise Failed("RuntimeError", "this MultiLock is acquired already (or waiting): release it first")
        if not isinstance(need, int) or not 0 < need <= len(set(names)):
            raise Failed("ValueError", f"num_locks={need!r}: give between 1 and the {len(set(names))} names")
        self.requests[rid] = (Parked(cid, msg, None), set(names), need)
        # The least contended locks first, as distributed does: more requests get theirs at once.
        for n in sorted(set(names), key=lambda n: len(self.multi.get(n, ()))):
            self.multi.setdefault(n, deque()).append(rid)
        if self._multi_try(rid):
            return {"ok": True}
        if timeout == 0:
            self._multi_leave(rid)
            return TIMED_OUT
        p = self._park(cid, msg, [], timeout, on_timeout=lambda p: self._multi_leave(rid))
        self.requests[rid] = (p, *self.requests[rid][1:])
        return None

    def _multi_try(self, rid: str) -> bool:
        """Grant request `rid` if it heads enough of its locks' queues; it then leaves the others."""
        who, names, need = self.requests[rid]
        held = {n for n in names if self.multi[n][0] == rid}
        if len(held) < need:
            return False
        self.granted.add(rid)
        for n in names - held:
            self.multi[n].remove(rid)            # not a head: no one else moves up
        self.requests[rid] = (who, held, need)
        return True

    def _multi_leave(self, rid: str) -> None:
        """Request `rid` gives up its locks (released, timed out, its holder gone): the next in each
        queue may now hold all it needs."""
        _, names, _ = self.requests.pop(rid)
        self.granted.discard(rid)
        heads = set()
        for n in names:
            q = self.multi[n]
            first = q[0] == rid
            q.remove(rid)
            if not q:
                del self.multi[n]
            elif first:
                heads.add(q[0])
        for other in heads:
            if other not in self.granted and self._multi_try(other):
                self._grant(self.requests[other][0], True)

    def multi_release(self, cid, msg):
        rid = msg["id"]
        if rid not in self.granted:
            raise Failed("ValueError", "Lock is not yet acquired")
        self._multi_leave(rid)
        return {"ok": True}

    # -- events ------------------------------------------------------------------------------
    def event_wait(self, cid, msg):
        name, timeout = check_name(msg["name"]), check_timeout(msg.get("timeout"))
        event = self.events.setdefault(name, [False, []])
        if event[0]:
            return {"ok": True}
        if timeout == 0:
            self._forget_event(name)
            return TIMED_OUT
        self._park(cid, msg, event[1], timeout, on_timeout=lambda p: self._forget_event(name))
        return None

    def _forget_event(self, name) -> None:
        event = self.events.get(name)
        if event is not None and not event[0] and not event[1]:
            del self.events[name]                  # cleared and nobody waits: the default, kept as nothing

    def event_set(self, cid, msg):
        name = check_name(msg["name"])
        event = self.events.setdefault(name, [False, []])
        event[0] = True
        self.dirty.add(("event", name))
        for p in list(event[1]):
            self._grant(p, True)
        return {"ok": None}

    def event_clear(self, cid, msg):
        name = check_name(msg["name"])
        if name in self.events:
            self.events[name][0] = False
            self.dirty.add(("event", name))
            self._forget_event(name)
        return {"ok": None}

    def event_is_set(self, cid, msg):
        event = self.events.get(check_name(msg["name"]))
        return {"ok": bool(event and event[0])}

    # -- variables -----------------------------------------------------------------------------
    def variable_set(self, cid, msg):
        name, value = check_name(msg["name"]), Value.from_wire(msg["value"])
        self.holders.check_known(value.keys)
        who = holder("variable", name)
        self.holders.hold(who, value.keys)                  # the new value's first, then the old's go
        old = self.variables.get(name)
        self.variables[name] = value
        if old is not None:
            self.holders.let_go(who, old.keys)
        self.dirty.add(("variable", name))
        for p in list(self.var_waiters.pop(name, ())):
            self.holders.give(p.cid, value.keys)
            self._grant(p, value.wire())
        return {"ok": None}

    def variable_get(self, cid, msg):
        name, timeout = check_name(msg["name"]), check_timeout(msg.get("timeout"))
        value = self.variables.get(name)
        if value is not None:
            self.holders.give(cid, value.keys)
            return {"ok": value.wire()}
        if timeout == 0:
            return TIMED_OUT
        waiters = self.var_waiters.setdefault(name, [])
        self._park(cid, msg, waiters, timeout, on_timeout=lambda p: self._forget_waiters(name))
        return None

    def _forget_waiters(self, name) -> None:
        if not self.var_waiters.get(name, True):
            del self.var_waiters[name]

    def variable_delete(self, cid, msg):
        name = check_name(msg["name"])
        old = self.variables.pop(name, None)
        if old is not None:
            self.holders.drop(holder("variable", name))
            self.dirty.add(("variable", name))
        return {"ok": None}

    # -- queues -------------------------------------------------------------------------------
    def _queue(self, msg: dict, create: bool = True) -> tuple[object, Queue | None]:
        name = check_name(msg["name"])
        q = self.queues.get(name)
        if q is None and create:
            maxsize = msg.get("maxsize") or 0
            if not isinstance(maxsize, int) or maxsize < 0:
                raise Failed("ValueError", f"maxsize={maxsize!r}: give a whole number >= 0 (0: no limit)")
            q = self.queues[name] = Queue(maxsize)
            self.dirty.add(("queue", name))
        return name, q

    def queue_create(self, cid, msg):
        name, q = self._queue(msg, create=False)
        if q is None:
            self._queue(msg)
        else:
            q.refs += 1
            self.dirty.add(("queue", name))
        return {"ok": None}

    def queue_put(self, cid, msg):
        name, q = self._queue(msg)
        value, timeout = Value.from_wire(msg["value"]), check_timeout(msg.get("timeout"))
        self.holders.check_known(value.keys)
        if not q.full() and not q.putters:
            self._enqueue(name, q, value)
            self._serve_queue(name, q)
            return {"ok": None}
        if timeout == 0:
            return TIMED_OUT
        self._park(cid, msg, q.putters, timeout)
        return None

    def _enqueue(self, name, q: Queue, value: Value) -> None:
        self.holders.hold(holder("queue", name), value.keys)
        q.items.append(value)
        self.dirty.add(("queue", name))

    def _serve_queue(self, name, q: Queue) -> None:
        """Move parked puts in while there is room and answer parked gets while there are items, in
        the order they came."""
        while True:
            if q.putters and not q.full():
                p = q.putters[0]
                value = Value.from_wire(p.msg["value"])
                if all(k in self.server.state.tasks for k in value.keys):
                    self._enqueue(name, q, value)
                    self._grant(p, None)
                else:
                    self._unpark(p)
                    self.answer(p.cid, p.msg, {"error": "a future in the value was released while the put waited",
                                               "type": "ValueError"})
                continue
            if q.getters:
                p = q.getters[0]
                batch = p.msg.get("batch") or 1
                if len(q.items) >= batch:
                    self._unpark(p)
                    self.answer(p.cid, p.msg, {"ok": self._take(name, q, p.cid, batch)})
                    continue
            return

    def _take(self, name, q: Queue, cid: str, n: int) -> list[dict]:
        taken = [q.items.popleft() for _ in range(n)]
        who = holder("queue", name)
        for value in taken:                         # the taker wants the keys before the queue lets go
            self.holders.give(cid, value.keys)
            self.holders.let_go(who, value.keys)
        self.dirty.add(("queue", name))
        return [v.wire() for v in taken]

    def queue_get(self, cid, msg):
        name, q = self._queue(msg)
        timeout, batch = check_timeout(msg.get("timeout")), msg.get("batch", False)
        if batch is True:                                   # what is there now, perhaps nothing
            items = self._take(name, q, cid, len(q.items))
            self._serve_queue(name, q)                      # room for the puts that wait
            return {"ok": items}
        if batch is False or batch is None:
            msg["batch"] = 1
        elif not isinstance(batch, int) or batch < 1:
            raise Failed("ValueError", f"batch={batch!r}: give True, False or a number of items >= 1")
        if not q.getters and len(q.items) >= msg["batch"]:
            items = self._take(name, q, cid, msg["batch"])
            self._serve_queue(name, q)
            return {"ok": items}
        if timeout == 0:
            return TIMED_OUT
        # A get that gives up may have held back smaller ones behind it: they are served then.
        self._park(cid, msg, q.getters, timeout, on_timeout=lambda p: self._serve_queue(name, q))
        return None

    def queue_size(self, cid, msg):
        _, q = self._queue(msg, create=False)
        return {"ok": 0 if q is None else len(q.items)}

    def queue_close(self, cid, msg):
        name, q = self._queue(msg, create=False)
        if q is None:
            return {"ok": None}
        q.refs -= 1
        self.dirty.add(("queue", name))
        if q.refs <= 0:
            del self.queues[name]
            self.holders.drop(holder("queue", name))
            for p in [*q.getters, *q.putters]:
                self._unpark(p)
                self.answer(p.cid, p.msg, {"error": f"the queue {name!r} was closed while this waited",
                                           "type": "RuntimeError"})
        return {"ok": None}

    # -- fire and forget -------------------------------------------------------------------------
    def fire_and_forget(self, cid, msg):
        keys = [k for k in check_keys(msg["keys"], "keys") if k in self.server.state.tasks]
        self.holders.hold(FIRE_AND_FORGET, keys)
        return {"ok": None}

    def forget_done(self, keys: list[str]) -> None:
        """Keys of fire_and_forget whose task finished or failed: the holder lets go of them."""
        self.holders.let_go(FIRE_AND_FORGET, keys, every=True)
        self.server._flush()

    # -- published datasets -----------------------------------------------------------------------
    def dataset_put(self, cid, msg):
        names = [check_name(n) for n in msg["names"]]
        values = [Value.from_wire(v) for v in msg["values"]]
        if len(names) != len(values):
            raise ProtocolError("as many dataset values as names")
        if not msg.get("override"):
            taken = [n for n in names if n in self.datasets]
            if taken:
                raise Failed("KeyError", f"Dataset {taken[0]} already exists (unpublish it first, or publish "
                                         "with override=True)")
        for value in values:
            self.holders.check_known(value.keys)
        for name, value in zip(names, values):
            who = holder("published", name)
            self.holders.hold(who, value.keys)
            old = self.datasets.get(name)
            self.datasets[name] = value
            if old is not None:
                self.holders.let_go(who, old.keys)
            self.dirty.add(("dataset", name))
        return {"ok": None}

    def dataset_get(self, cid, msg):
        out = []
        for name in (check_name(n) for n in msg["names"]):
            value = self.datasets.get(name)
            if value is not None:
                self.holders.give(cid, value.keys)
            out.append(None if value is None else value.wire())
        return {"ok": out}

    def dataset_list(self, cid, msg):
        return {"ok": sorted(self.datasets, key=str)}

    def dataset_delete(self, cid, msg):
        for name in (check_name(n) for n in msg["names"]):
            old = self.datasets.pop(name, None)
            if old is not None:
                self.holders.drop(holder("published", name))
                self.dirty.add(("dataset", name))
        return {"ok": None}

    # -- the journal: ["C", kind, name, payload], payload None once the object is gone ---------
    def journal_records(self, everything: bool = False) -> list[list]:
        """What changed since the last call (`everything`: all there is, for a new file)."""
        if everything:
            self.dirty = set()
            named = [*(("variable", n) for n in self.variables), *(("dataset", n) for n in self.datasets),
                     *(("queue", n) for n in self.queues), *(("semaphore", n) for n in self.semaphores),
                     *(("event", n) for n, (flag, _) in self.events.items() if flag)]
        else:
            named, self.dirty = self.dirty, set()
        return [["C", kind, name, self._payload(kind, name)] for kind, name in named]

    def _payload(self, kind: str, name):
        if kind in ("variable", "dataset"):
            value = (self.variables if kind == "variable" else self.datasets).get(name)
            return None if value is None else value.record()
        if kind == "queue":
            q = self.queues.get(name)
            return None if q is None else {"maxsize": q.maxsize, "refs": q.refs, "items": [v.record() for v in q.items]}
        if kind == "event":
            return True if self.events.get(name, (False,))[0] else None
        sem = self.semaphores.get(name)
        return None if sem is None else sem.max_leases

    def _restore(self, recovered) -> None:
        """Take back what a journal kept; keys its rebuilt state no longer has are not held (whoever
        takes such a value gets futures the scheduler reports lost)."""
        known = self.server.state.tasks
        for _, kind, name, payload in recovered.coordination.values():
            name = check_name(name)
            if kind == "semaphore":
                self.semaphores[name] = Semaphore(payload)
            elif kind == "event":
                self.events[name] = [True, []]
            elif kind == "queue":
                q = self.queues[name] = Queue(payload["maxsize"])
                q.refs = payload["refs"]
                for item in payload["items"]:
                    q.items.append(Value(item["data"], item["keys"]))
                    self.holders.hold(holder("queue", name), [k for k in item["keys"] if k in known])
            elif kind in ("variable", "dataset"):
                value = Value(payload["data"], payload["keys"])
                (self.variables if kind == "variable" else self.datasets)[name] = value
                who = holder("variable" if kind == "variable" else "published", name)
                self.holders.hold(who, [k for k in value.keys if k in known])
        # fire_and_forget's keys are in the rebuilt state's wanted lists: held again, the failed let go
        forgotten = [k for k, ts in known.items() if FIRE_AND_FORGET in ts.who_wants]
        if forgotten:
            self.holders.hold(FIRE_AND_FORGET, forgotten)
            self.holders.let_go(FIRE_AND_FORGET, [k for k in forgotten if known[k].state == "erred"], every=True)
        self.server.state.take_outbox()              # nobody is connected to be told anything yet
