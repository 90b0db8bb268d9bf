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
- a death is judged with the tasks its worker was executing: the nanny's list (its exit report's
  `executing_keys`, read from the worker's pipe to its last instant; the report may come before or
  after distributed removes the worker), else, without a nanny, what distributed's last heartbeat
  of it said; the collector judges again with them named (`while running 'k'`, blame);
- a final verdict charges those tasks (blame.py's Ledger), and a task over its limits fails in
  distributed with our KilledWorker (errors.py) wherever it is by then (rerun, queued, waiting);
  distributed's own `allowed-failures` is set out of reach (dask_scheduler.py), so an innocent
  death never fails one, nor does a task merely queued on the dead worker;
- work no worker will run (our scheduler halted: jobs kept dying before their worker started)
  fails with the reason, as on our engine.

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
from .errors import killed_worker, stranded

logger = logging.getLogger("hpc_cluster.engines")

BEAT = 0.5
# Seconds before its job's deadline a draining worker stops waiting for its running tasks and
# is retired: distributed's retirement moves its results to peers in that time.
FINISH_MARGIN = 5.0
GOODBYE, CLOSED, HEARTBEAT_LOST = Op.GOODBYE.value, "closed", Cause.HEARTBEAT_LOST.value


def shown_key(key) -> str:
    """A key as death records show it ('hog-1GB', "('x', 0)"), as our engine's records do."""
    return key if isinstance(key, str) else str(key)


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
        self.theirs: dict = {}                      # address -> distributed's WorkerState
        # address -> {key: when it started} as its last heartbeat said, kept as it is removed:
        # what a worker that dies without its nanny's report was executing.
        self.last_executing: dict[str, dict] = {}
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
        self.theirs[worker] = dws
        self.ours.streams[worker] = EngineStream(self, worker)
        escalation.worker_joined(self, worker)     # tasks moved to its pool may run on it
        self.ours._tell("joined", info)
        self.ours._pace_heartbeats()
        self.ours._flush()
        logger.info("distributed worker %s (%s) joined", worker, dws.name)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str | None = None, **kwargs) -> None:
        if worker not in self.mirrored:
            self.theirs.pop(worker, None)
            return
        self.mirrored.discard(worker)
        self._keep_executing(worker)
        asked = self.retiring.pop(worker, None)
        if worker in self.ours.state.workers:
            # A retirement we asked for leaves as a goodbye (our intent says why); anything
            # else is a death to explain: silence past distributed's worker-ttl as heartbeat-lost,
            # its nanny told to end the process (which it reports on, as for our workers).
            silent = str(stimulus_id or "").startswith("check-worker-ttl")
            info = dict(self.ours.state.workers[worker].info)
            self.ours._remove_worker(worker, GOODBYE if asked else HEARTBEAT_LOST if silent else CLOSED)
            if silent:
                self.ours._end_unresponsive(info)

    def _keep_executing(self, address: str) -> None:
        """What distributed's last heartbeat of a leaving worker said it was executing (at most
        a beat old; a task that finished since is in memory): distributed may have moved its
        tasks on already, but keeps that in its WorkerState."""
        dws = self.theirs.pop(address, None)
        if dws is not None:
            now = self.clock()
            self.last_executing[address] = {ts.key: now - ran for ts, ran in dws.executing.items()
                                            if ts.state not in ("memory", "forgotten")}

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
            self._keep_executing(addr)             # before our collector judges the death
            asyncio.ensure_future(self.ds.remove_worker(addr, stimulus_id=f"hpc-cluster-silent-{time.time()}"))

    def retire(self, address: str, intent: str) -> None:
        if self.ds is None or address not in self.ds.workers or address in self.retiring:
            return
        self.retiring[address] = intent
        logger.info("retiring distributed worker %s (%s)", address, intent)

        async def leave():
            await self._let_running_finish(address, intent)
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

    async def _let_running_finish(self, address: str, intent: str) -> None:
        """Before a walltime or lifetime retirement, as our engine's drain does: the worker gets
        no new task (paused on distributed's side: it does not know), and what it is running
        finishes, up to FINISH_MARGIN before its job's deadline; then distributed retires it
        (results to peers). distributed's retirement alone closed it with its tasks still
        running: a task that fitted in the job was cut at every drain and never finished."""
        if not intent.startswith(("walltime", "lifetime")):
            return
        state = getattr(self.ours, "state", None)         # none: a bridge without our scheduler (tests)
        ws = state.workers.get(address) if state is not None else None
        deadline = ws.deadline if ws is not None else None
        if deadline is None:
            return
        dws = self.ds.workers.get(address)
        if dws is None:
            return
        self.ds.handle_worker_status_change("paused", address, stimulus_id=f"hpc-cluster-drain-{time.time()}")
        while (address in self.ds.workers and self.ds.workers[address].processing
               and self.clock() < deadline - FINISH_MARGIN):
            await asyncio.sleep(0.2)

    def on_verdict(self, record: dict) -> None:
        """A death's verdict was made or changed; a final one charges (or not) the tasks it was
        executing."""
        did = record["id"]
        if record.get("worker") is None or did in self.charged:
            return
        ev = self.ours.deaths.evidence.get(did)
        executing = self._executing(record, ev)
        shown = sorted(shown_key(k) for k in executing)
        if ev is not None and shown != ev.executing:
            # Our collector judges a death by the tasks our state saw executing, none of
            # distributed's ("while idle", never blamed): name them and judge again. The refined
            # verdict comes back here, final or not. (The nanny's list, when its report comes
            # after the heartbeat's, replaces that one.)
            record["executing"] = ev.executing = shown
            self.ours.deaths._refine(did)
            return
        if record.get("final_at") is None:
            return
        self.charged.add(did)
        self.last_executing.pop(record["worker"], None)
        if not (record.get("blame") or record.get("cause") == Cause.WALLTIME):
            return
        executing = escalation.verdict(self, record, executing)    # moved to a bigger pool: not charged
        for key, error in self.ledger.charge(record, executing):
            self._fail(key, error, record.get("worker"))

    def _executing(self, record: dict, ev) -> dict:
        """The distributed tasks the dead worker was executing (key -> seconds each had run, or
        None): the nanny's list, read from the worker's pipe up to its last instant; without a
        report (nanny=False, or a node gone with its nanny), the worker's last heartbeat's list
        (at most a beat old: a task started in that last beat is missed)."""
        report = (ev.nanny if ev is not None else None) or {}
        named = report.get("executing_keys")
        if named is None:
            started = self.last_executing.get(record["worker"]) or {}
        else:
            if isinstance(named, list):             # a nanny that kept no start times
                named = dict.fromkeys(named)
            started = {key_from_text(text): at for text, at in named.items()}
        ended = report.get("ended") or record["time"]
        return {key: (round(ended - at, 3) if isinstance(at, (int, float)) else None)
                for key, at in started.items()}

    def _fail(self, key, error: dict, last_worker: str | None) -> None:
        exc = killed_worker(key, error, last_worker)
        if self._err(key, exc):
            self.failed.append(key)
            logger.warning("task %r failed: %s", key, str(exc).splitlines()[0])

    def _err(self, key, exc: BaseException) -> bool:
        """Fail a task in distributed's scheduler with `exc`, wherever it is by now: rerun on
        another worker (processing: that worker is told to drop it), queued, without a worker,
        or waiting. Its dependents fail with it, as with distributed's own KilledWorker. False if
        it had finished, failed or been forgotten meanwhile."""
        ds = self.ds
        ts = ds.tasks.get(key) if ds is not None else None
        if ts is None or ts.state in ("memory", "erred", "forgotten"):
            return False
        sid = f"hpc-cluster-verdict-{time.time()}"
        recs = {}
        if ts.state != "released":
            recs = ds.transition(key, "released", sid)      # sends free-keys to a worker running it
            recs.pop(key, None)                              # it goes to erred, not back to waiting
        ts.exception, ts.exception_text, ts.exception_blame = pickle.dumps(exc), str(exc), ts
        recs.update(ds.transition(key, "erred", sid))
        ds.transitions(recs, sid)
        return True

    def _fail_if_stranded(self) -> None:
        """No worker, none on its way, and no job will be submitted (our scheduler halted: jobs
        kept ending before their worker started): distributed's waiting work would wait forever.
        Fail it, saying why, as our engine's fail_if_stranded does for its own."""
        ours, ds = self.ours, self.ds
        if not ours.halted or ds.workers or ours.expecting_workers():
            return
        reason = f"no worker is left to run it and none will be started: {ours.halted}"
        for key, ts in list(ds.tasks.items()):
            if ts.state in ("waiting", "queued", "no-worker") and self._err(key, stranded(key, reason)):
                logger.warning("task %r failed: %s", key, reason)

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
                    # Alive while distributed keeps it: its worker beats from its event loop, which a
                    # task holding the GIL blocks for seconds (xgboost under load: our 5 s TTL
                    # removed a training worker and its scattered data). distributed's worker-ttl
                    # judges silence; its removal comes here as heartbeat-lost (remove_worker).
                    st.heartbeat(addr, now)
                    mem = dws.memory
                    st.worker_memory(addr, {"rss": int(mem.process), "managed": int(mem.managed),
                                            "spilled": int(mem.spilled)}, now)
                self._fail_if_stranded()
                self.ours._flush()
            except Exception:
                logger.exception("mirroring distributed's workers failed")

