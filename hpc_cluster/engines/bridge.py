"""The scheduler plugin between distributed's Scheduler and ours, in the cluster daemon.

Our Scheduler stays the daemon's control plane: the job manager, the CLI's requests, the
nannies' exit reports, the evidence collector and the death records. It runs no task: each
distributed worker is mirrored in its state as a worker with no tasks (its job, nanny, pool,
walltime and lifetime from the worker's startup information), so that:

- `status`, `why`, the dashboard and the job manager see the workers as they see ours; a
  registration marks its job running, a removal wakes the poller;
- a death is judged by our collector (nanny report, accounting, log tail) and recorded as ours;
- walltime and --lifetime drains, scale-down and shutdown reach distributed as a retirement
  (its own: results moved to peers first), through the stream our state writes to the worker
  (EngineStream: its CLOSE becomes `retire_workers`);
- a final verdict charges the tasks the nanny saw executing (blame.py's Ledger), and a task over
  its limits fails in distributed with our KilledWorker (errors.py); distributed's own
  `allowed-failures` is set out of reach (dask_scheduler.py), so an innocent death never fails one.

Heartbeats and memory come from distributed's worker records, once every BEAT seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol import pickle

from ..protocol.messages import Cause, Op
from ..scheduler.checks import check_number, worker_deadline
from . import escalation
from .blame import Ledger
from .errors import killed_worker

logger = logging.getLogger("hpc_cluster.engines")

BEAT = 0.5
GOODBYE, CLOSED = Op.GOODBYE.value, "closed"


def key_from_text(text: str):
    """A key the worker named on the nanny's pipe (dask_worker.key_text), as distributed keys it."""
    def tuples(x):
        return tuple(tuples(i) for i in x) if isinstance(x, list) else x
    try:
        return tuples(json.loads(text))
    except ValueError:
        return text


class EngineStream:
    """What our state sends a mirrored worker: a CLOSE (retire, drain, scale-down, shutdown)
    becomes distributed's retirement; the rest (heartbeat pace, hand-backs of tasks it never
    had) mean nothing to a distributed worker."""

    def __init__(self, bridge: "Bridge", address: str):
        self.bridge, self.address = bridge, address

    def send(self, msg: dict) -> None:
        if msg.get("op") == Op.CLOSE:
            self.bridge.retire(self.address, str(msg.get("reason") or Cause.RETIRED.value))

    def extend(self, msgs) -> None:
        for msg in msgs:
            self.send(msg)

    def flush(self) -> None:
        return None


class Bridge(SchedulerPlugin):
    name = "hpc-cluster"

    def __init__(self, ours, ledger: Ledger, clock=time.time):
        self.ours, self.ledger, self.clock = ours, ledger, clock
        self.ds = None
        self.mirrored: set[str] = set()
        self.retiring: dict[str, str] = {}          # address -> why we asked it to leave
        self.charged: set[int] = set()              # death ids already counted
        self.failed: list = []                      # keys failed by a verdict (for tests and logs)
        self._beat: asyncio.Task | None = None

    # -- distributed's side ------------------------------------------------------------------
    async def start(self, scheduler) -> None:
        self.ds = scheduler
        self._beat = asyncio.create_task(self._beats())

    async def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()

    def add_worker(self, scheduler, worker: str) -> None:
        dws = scheduler.workers.get(worker)
        if dws is None:
            return
        facts = dict((dws.extra or {}).get("hpc_cluster") or {})
        info = {**facts, "pid": dws.pid, "host": dws.host, "address": worker, "engine": "distributed"}
        for name in ("job_walltime", "job_start", "lifetime", "lifetime_end"):
            info[name] = check_number(info.get(name))
        st = self.ours.state
        st.add_worker(worker, dws.nthreads, self.clock(), memory_limit=dws.memory_limit or 0,
                      name=str(dws.name), resources=dict(dws.resources or {}), info=info,
                      deadline=worker_deadline(info))
        self.mirrored.add(worker)
        self.ours.streams[worker] = EngineStream(self, worker)
        escalation.worker_joined(self, worker)     # tasks moved to its pool may run on it
        self.ours._tell("joined", info)
        self.ours._pace_heartbeats()
        self.ours._flush()
        logger.info("distributed worker %s (%s) joined", worker, dws.name)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str | None = None, **kwargs) -> None:
        if worker not in self.mirrored:
            return
        self.mirrored.discard(worker)
        asked = self.retiring.pop(worker, None)
        if worker in self.ours.state.workers:
            # A retirement we asked for leaves as a goodbye (our intent says why); anything
            # else is a death to explain.
            self.ours._remove_worker(worker, GOODBYE if asked else CLOSED)

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish in ("memory", "forgotten") and self.ledger.attempts:
            self.ledger.forget(key)

    # -- our side ------------------------------------------------------------------------------
    def worker_event(self, kind: str, info: dict) -> None:
        """Our scheduler removed a mirrored worker itself (silent past the heartbeat TTL):
        distributed lets it go too, so its tasks run elsewhere."""
        addr = info.get("address")
        if kind == "removed" and addr in self.mirrored and self.ds is not None and addr in self.ds.workers:
            self.mirrored.discard(addr)
            asyncio.ensure_future(self.ds.remove_worker(addr, stimulus_id=f"hpc-cluster-silent-{time.time()}"))

    def retire(self, address: str, intent: str) -> None:
        if self.ds is None or address not in self.ds.workers or address in self.retiring:
            return
        self.retiring[address] = intent
        logger.info("retiring distributed worker %s (%s)", address, intent)

        async def leave():
            try:
                await self.ds.retire_workers(workers=[address], close_workers=True, remove=True,
                                             stimulus_id=f"hpc-cluster-{intent}-{time.time()}")
            except Exception:
                logger.exception("retiring %s failed", address)
            if address in self.ds.workers:
                # distributed kept it (no peer could take its results): it is closed now; what
                # only it held is recomputed from lineage.
                logger.warning("distributed kept %s (no peer could take its results); closing it", address)
                await self.ds.remove_worker(address, stimulus_id=f"hpc-cluster-{intent}-{time.time()}",
                                            expected=True)
        asyncio.ensure_future(leave())

    def on_verdict(self, record: dict) -> None:
        """A death's verdict changed; a final one charges (or not) the tasks it was executing."""
        if record.get("final_at") is None or record.get("worker") is None or record["id"] in self.charged:
            return
        ev = self.ours.deaths.evidence.get(record["id"])
        report = (ev.nanny if ev is not None else None) or {}
        # The nanny's list; without one (nanny=False, a node gone with its nanny) no task is
        # known to have been executing, and none is charged.
        named = report.get("executing_keys")
        self.charged.add(record["id"])
        executing = {}
        for text, started in (named or {}).items():
            executing[key_from_text(text)] = (record["time"] - started) if isinstance(started, (int, float)) else None
        if executing:
            record["executing"] = sorted(str(k) for k in executing)
        if not (record.get("blame") or record.get("cause") == Cause.WALLTIME):
            return
        executing = escalation.verdict(self, record, executing)    # moved to a bigger pool: not charged
        for key, error in self.ledger.charge(record, executing):
            self._fail(key, error, record.get("worker"))

    def _fail(self, key, error: dict, last_worker: str | None) -> None:
        ds = self.ds
        ts = ds.tasks.get(key) if ds is not None else None
        if ts is None or ts.state in ("memory", "erred", "forgotten"):
            return
        exc = killed_worker(key, error, last_worker)
        blob = pickle.dumps(exc)
        sid = f"hpc-cluster-verdict-{time.time()}"
        if ts.state in ("waiting", "released"):
            if ts.state == "waiting":
                ds.transitions({key: "released"}, sid)
            ts.exception, ts.exception_text, ts.exception_blame = blob, str(exc), ts
            ds.transitions({key: "erred"}, sid)
        else:
            more = {"worker": ts.processing_on.address} if ts.state == "processing" and ts.processing_on else {}
            recs = ds.transition(key, "erred", sid, exception=blob, exception_text=str(exc), cause=key, **more)
            ds.transitions(recs, sid)
        self.failed.append(key)
        logger.warning("task %r failed: %s", key, str(exc).splitlines()[0])

    async def _beats(self) -> None:
        """Heartbeats and memory of the mirrored workers, from distributed's records."""
        while True:
            await asyncio.sleep(BEAT)
            try:
                st, now = self.ours.state, self.clock()
                for addr in list(self.mirrored):
                    dws = self.ds.workers.get(addr)
                    if dws is None or addr not in st.workers:
                        continue
                    st.heartbeat(addr, max(dws.last_seen, st.workers[addr].last_seen))
                    mem = dws.memory
                    st.worker_memory(addr, {"rss": int(mem.process), "managed": int(mem.managed),
                                            "spilled": int(mem.spilled)}, now)
                self.ours._flush()
            except Exception:
                logger.exception("mirroring distributed's workers failed")

