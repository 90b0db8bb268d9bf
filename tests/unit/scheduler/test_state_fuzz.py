"""The pure state machine driven by random event sequences (issue 14, "Kept held").

Each example is a sequence of events a scheduler can meet: graphs submitted (some with
cycles or missing inputs), workers joining, leaving and dying with evidence (verdicts
refined later), tasks started, finished and erred, worker reports delivered late, out of
order and twice, clients releasing keys, cancelling, leaving. After every step the
invariants must hold (SchedulerState.validate()) and every state change must be one the
transition table allows (debug=True); at the end, once every verdict is final and a healthy worker
runs whatever it is sent, every wanted task must be finished or failed (nothing hangs).

Derandomized with a fixed budget: the same examples on every run, in well under a minute.
"""

import contextlib
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler.state.placement import workload
from hpc_cluster.scheduler.state import SchedulerState, TaskState, WorkerState
from helpers.tasks import task

F, A = Opaque(b"f"), Opaque(b"a")
ACTIVE = {"waiting", "queued", "processing"}
WORKERS = ["tcp://w1:1", "tcp://w2:1", "tcp://w3:1"]
CLIENTS = ["c1", "c2"]
CAUSES = [("crash", True), ("memory-nanny", True), ("connection-lost", False), ("walltime", False),
          ("retired", False)]


def check(s: SchedulerState) -> None:
    """Every invariant of the state machine's records (scheduler/state/validate.py)."""
    s.validate()


class FuzzRun:
    """One example: the state machine, the world around it, and the reports in flight."""

    duration = 0.1                     # what each task takes, as the workers report it

    def __init__(self, data):
        self.data = data
        # debug: every state change is checked against the transition table as it happens
        self.s = SchedulerState(allowed_failures=1, prefetch=1, debug=True)
        self.now = 0.0
        self.n = 0
        self.in_flight: list = []          # worker reports not delivered yet: (method, args)
        self.held: dict = {}               # (worker, input): keys sent ahead, held there until it finishes
        self.delivered: list = []          # for duplicates

    def draw(self, strategy):
        return self.data.draw(strategy)

    def pick(self, items):
        items = sorted(items)
        return self.draw(st.sampled_from(items)) if items else None

    # -- events --------------------------------------------------------------------
    def add_worker(self):
        addr = self.pick(WORKERS)
        self.s.add_worker(addr, nthreads=self.draw(st.integers(1, 2)), now=self.now)

    def kill_worker(self):
        addr = self.pick(self.s.workers)
        if addr is None:
            return
        cause, blame = self.draw(st.sampled_from(CAUSES))
        final = self.draw(st.booleans())
        self.s.remove_worker(addr, self.now, {"cause": cause, "blame": blame, "text": "fuzz",
                                              "final_at": self.now if final else None})

    def refine(self):
        open_ = [d["id"] for d in self.s.deaths if d.get("final_at") is None]
        if open_:
            cause, blame = self.draw(st.sampled_from(CAUSES))
            self.s.refine_death(self.pick(open_), cause, blame, "refined", final_at=self.now)

    def connect_client(self):
        self.s.add_client(self.pick(CLIENTS))

    def leave_client(self):
        cid = self.pick(self.s.clients)
        if cid is not None:
            self.s.remove_client(cid)

    def submit(self):
        cid = self.pick(self.s.clients)
        if cid is None:
            return
        known = sorted(self.s.tasks)
        specs = []
        for _ in range(self.draw(st.integers(1, 4))):
            if known and self.draw(st.integers(0, 4)) == 0:
                key = self.pick(known)                    # a key already known: shared or resubmitted
            else:
                self.n += 1
                key = f"t{self.n}"
            pool = known + [s["key"] for s in specs]
            deps = sorted(set(self.draw(st.lists(st.sampled_from(pool), max_size=3)))) if pool else []
            if self.draw(st.integers(0, 9)) == 0:
                deps.append(f"t{self.n + 1}")            # the next one: a cycle, or a missing input
            specs.append({"key": key, "func": F, "args": A, "deps": deps,
                          "priority": self.draw(st.integers(-2, 2)), "retries": self.draw(st.integers(0, 1)),
                          **self.needs()})
        keys = [s["key"] for s in specs]
        wanted = sorted(set(self.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys)))))
        self.s.update_graph(cid, specs, wanted)

    def needs(self) -> dict:
        return {}

    def start(self) -> None:
        """The world before the first event (inside stable_hashes: records hash by name)."""

    def check(self) -> None:
        """Invariants of this kind of run, beyond check()'s."""

    def release(self):
        cid = self.pick(self.s.clients)
        if cid is None:
            return
        held = [k for k, ts in self.s.tasks.items() if cid in ts.who_wants]
        if held:
            self.s.client_releases(cid, sorted(set(self.draw(st.lists(st.sampled_from(sorted(held)), max_size=3)))))

    def cancel(self):
        key = self.pick(self.s.tasks)
        if key is not None:
            self.s.cancel([key], "fuzz")

    def scatter(self):
        cid = self.pick(self.s.clients)
        if cid is not None and self.s.workers:
            self.n += 1
            self.s.scatter(cid, {f"d{self.n}": [self.pick(self.s.workers)]}, {f"d{self.n}": 8})

    def worker_reports(self):
        """A worker acts on what it was sent: the reports go in flight, delivered later. A
        task sent ahead is held until its input finishes on that worker, then run like one
        just sent (worker.py); free-keys drops it."""
        for addr, msgs in sorted(self.s.take_outbox().items()):
            for msg in msgs:
                if msg["op"] == "free-keys":
                    for where, held in self.held.items():
                        if where[0] == addr:
                            held[:] = [m for m in held if m["key"] not in msg["keys"]]
                if msg["op"] == "compute" and addr in self.s.workers:
                    if "after" in msg:
                        self.held.setdefault((addr, msg["after"]), []).append(msg)
                    else:
                        self.run_task(addr, msg)
            # The order of free-keys follows set iteration (memory addresses): sorted, so that
            # the same draws make the same run (hypothesis requires it).
            freed = sorted(k for msg in msgs if msg["op"] == "free-keys" for k in msg["keys"])
            self.in_flight.extend(("abandoned_done", (addr, k)) for k in freed)

    def run_task(self, addr, msg):
        k = msg["key"]
        self.in_flight.append(("task_started", (addr, k, self.now)))
        outcome = self.draw(st.sampled_from(["finished", "finished", "erred", "missing", "none"]))
        if outcome == "finished":
            self.in_flight.append(("task_finished", (addr, k, 10, self.duration)))
            for held in self.held.pop((addr, k), []):
                self.run_task(addr, held)
        elif outcome == "erred":
            self.in_flight.append(("task_erred", (addr, k, {"text": "boom"})))
        elif outcome == "missing" and msg["deps"]:
            dep = sorted(msg["deps"])[0]
            self.in_flight.append(("missing_data", (addr, k, dep, msg["deps"][dep])))

    def deliver(self):
        """One report, in any order (reordered), sometimes one delivered before (duplicate)."""
        if self.delivered and self.draw(st.integers(0, 5)) == 0:
            method, args = self.delivered[self.draw(st.integers(0, len(self.delivered) - 1))]
        elif self.in_flight:
            method, args = self.in_flight.pop(self.draw(st.integers(0, len(self.in_flight) - 1)))
            self.delivered.append((method, args))
        else:
            return
        getattr(self.s, method)(*args)

    def tick(self):
        self.now += self.draw(st.sampled_from([0.1, 1.0, 10.0]))
        self.s.set_time(self.now)

    EVENTS = ["add_worker", "add_worker", "kill_worker", "refine", "connect_client", "leave_client",
              "submit", "submit", "submit", "release", "cancel", "scatter", "worker_reports",
              "worker_reports", "deliver", "deliver", "deliver", "deliver", "tick"]

    # -- the end: everything settles ------------------------------------------------
    def add_healthy(self):
        self.s.add_worker("tcp://healthy:1", nthreads=4, now=self.now)

    def settle(self):
        """Every verdict final, a healthy worker that does what it is told, every report
        delivered: then no wanted task may be left unfinished."""
        s = self.s
        for d in s.deaths:
            if d.get("final_at") is None:
                s.refine_death(d["id"], d["cause"], d["blame"], d["text"], final_at=self.now)
        self.add_healthy()
        for _ in range(10 * (len(s.tasks) + 10)):
            check(s)
            for method, args in self.in_flight:
                getattr(s, method)(*args)
            self.in_flight = []
            for addr, msgs in s.take_outbox().items():
                for msg in msgs:
                    if msg["op"] == "free-keys":
                        for k in msg["keys"]:
                            s.abandoned_done(addr, k)
            running = [(ts.processing_on.address, ts.key) for ts in s.tasks.values() if ts.state == "processing"]
            for addr, key in sorted(running):
                s.task_started(addr, key, self.now)
                s.task_finished(addr, key, 10, 0.1)
            if not running and not s.outbox:
                break
        check(s)
        stuck = {k: ts.state for k, ts in s.tasks.items() if ts.state in ACTIVE}
        assert not stuck, f"tasks that will never finish: {stuck}"
        for ts in s.tasks.values():
            if ts.who_wants:
                assert ts.state in ("memory", "erred"), ts


@contextlib.contextmanager
def stable_hashes():
    """Records hash by their key (address), not their memory address, while fuzzing: the
    state machine iterates sets of them, and hypothesis must see the same run for the same
    draws (in a process, and in every CI run) to replay and shrink a failure."""
    saved = TaskState.__hash__, WorkerState.__hash__
    TaskState.__hash__ = lambda self: zlib.crc32(self.key.encode())
    WorkerState.__hash__ = lambda self: zlib.crc32(self.address.encode())
    try:
        yield
    finally:
        TaskState.__hash__, WorkerState.__hash__ = saved


def fuzz(examples: int):
    return settings(derandomize=True, max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def play(run: FuzzRun, most: int) -> None:
    """Up to `most` random events, the invariants checked after each, then the settling."""
    with stable_hashes():
        run.start()
        for _ in range(run.draw(st.integers(5, most))):
            getattr(run, run.draw(st.sampled_from(run.EVENTS)))()
            check(run.s)
            run.check()
        run.settle()


@fuzz(300)
@given(st.data())
def test_random_event_sequences_keep_the_state_machine_consistent(data):
    play(FuzzRun(data), 60)


class ShortRun(FuzzRun):
    """Tasks said to take a millisecond (most of them), which workers are sent beyond their base
    slots (prefetch.py), among ones of unknown and of long durations."""

    duration = 0.001

    def start(self):
        self.s.prefetch = 0            # no base prefetch slot: the deep ones are used sooner

    def needs(self) -> dict:
        return {"duration": self.draw(st.sampled_from([0.001, 0.001, 0.001, None, 0.1]))}


@fuzz(150)
@given(st.data())
def test_random_event_sequences_of_short_tasks_keep_the_state_machine_consistent(data):
    play(ShortRun(data), 60)


GiB = 2**30
POOLS = {"default": {"memory": 4 * GiB, "walltime": None, "nthreads": 2},
         "bigmem": {"memory": 64 * GiB, "walltime": None, "nthreads": 2},
         "long": {"memory": 4 * GiB, "walltime": None, "nthreads": 1, "escalation_only": True}}


class PoolsRun(FuzzRun):
    """The same world in a cluster with pools (issue 15): workers of each pool, tasks with
    memory= and pool= (some that no pool holds), memory deaths that move tasks."""

    def start(self):
        self.s.set_pools(POOLS)
        self.s.add_client("c1")                  # a start that gets tasks running sooner
        self.s.add_worker("tcp://w1:1", nthreads=2, now=0, memory_limit=POOLS["default"]["memory"],
                          info={"pool": "default"})

    def add_worker(self):
        addr, pool = self.pick(WORKERS), self.pick(POOLS)
        self.s.add_worker(addr, nthreads=self.draw(st.integers(1, 2)), now=self.now,
                          memory_limit=POOLS[pool]["memory"], info={"pool": pool})

    EVENTS = FuzzRun.EVENTS + ["memory_death", "memory_death", "refine"]

    def memory_death(self):
        """A running task kills its worker by memory (the verdict final or not): it moves."""
        running = sorted(k for k, ts in self.s.tasks.items() if ts.state == "processing")
        key = self.pick(running)
        if key is None:
            return
        addr = self.s.tasks[key].processing_on.address
        self.s.task_started(addr, key, self.now)
        final = self.draw(st.booleans())
        self.s.remove_worker(addr, self.now, {"cause": self.draw(st.sampled_from(["memory-batch", "memory-nanny"])),
                                              "blame": True, "text": "fuzz", "peak_memory": 3 * GiB,
                                              "final_at": self.now if final else None})

    def needs(self) -> dict:
        return {"memory": self.draw(st.sampled_from([0, 0, 0, 0, 2 * GiB, 8 * GiB, 100 * GiB])),
                "pool": self.draw(st.sampled_from([None] * 8 + ["long", "nowhere"]))}

    def add_healthy(self):
        for pool, spec in sorted(POOLS.items()):
            self.s.add_worker(f"tcp://healthy-{pool}:1", nthreads=4, now=self.now, memory_limit=spec["memory"],
                              info={"pool": pool})


    def check(self) -> None:
        demand = self.s.pool_demand()
        assert set(demand) == set(POOLS) and all(n >= 0 for n in demand.values()), demand
        assert sum(workload(self.s, pool=p) for p in POOLS) <= workload(self.s) + 1e-9


@fuzz(150)
@given(st.data())
def test_random_event_sequences_with_pools_keep_the_state_machine_consistent(data):
    play(PoolsRun(data), 80)


class RestrictedRun(FuzzRun):
    """The same world with tasks restricted to workers (issue 31, workers=): by address, name
    or host, strict or loose (allow_other_workers), among them workers that come and go."""

    def add_worker(self):
        addr = self.pick(WORKERS)
        self.s.add_worker(addr, nthreads=self.draw(st.integers(1, 2)), now=self.now,
                          name=f"n{addr[-3]}", info={"host": addr[6:8]})

    def needs(self) -> dict:
        names = self.draw(st.sampled_from([None, None, None, ["tcp://w1:1"], ["n2"], ["w3"], ["n1", "w2"]]))
        return {} if names is None else {"workers": names, "allow_other_workers": self.draw(st.booleans())}

    def add_healthy(self):
        super().add_healthy()
        for addr in WORKERS:                     # the workers strict tasks name, back for good
            if addr not in self.s.workers:
                self.s.add_worker(addr, nthreads=2, now=self.now, name=f"n{addr[-3]}", info={"host": addr[6:8]})


@fuzz(150)
@given(st.data())
def test_random_event_sequences_with_restricted_tasks_keep_the_state_machine_consistent(data):
    play(RestrictedRun(data), 60)


class ReattachRun(FuzzRun):
    """The same world with workers that come back holding results and running threads, known to
    the scheduler or not, clients wanting keys again, and placement held (issue 16,
    scheduler/state/reattach.py); the windows end with the ticks."""

    def start(self):
        self.s.claim_window = 5.0

    def reattach_worker(self):
        addr = self.pick(WORKERS)
        known = sorted(self.s.tasks)
        pool = known + [f"u{i}" for i in range(4)]            # some keys this scheduler never heard of
        held = {k: 8 for k in self.draw(st.lists(st.sampled_from(pool), max_size=4))}
        running = sorted(set(self.draw(st.lists(st.sampled_from(pool), max_size=2))) - set(held))
        self.s.add_reattached_worker(addr, self.draw(st.integers(1, 2)), self.now, held, running)
        for k in running:                                     # those threads finish some time later
            self.in_flight.append(("task_finished", (addr, k, 8, 0.1)))

    def want_keys(self):
        cid = self.pick(self.s.clients)
        if cid is not None:
            pool = sorted(self.s.tasks) + [f"u{i}" for i in range(4)]
            self.s.client_wants(cid, sorted(set(self.draw(st.lists(st.sampled_from(pool), max_size=3)))), self.now)

    def submit_unknown(self):
        """A client resubmits a key a worker may hold unclaimed."""
        cid = self.pick(self.s.clients)
        if cid is not None:
            key = f"u{self.draw(st.integers(0, 3))}"
            if key not in self.s.tasks:
                self.s.update_graph(cid, [{"key": key, "func": F, "args": A, "deps": []}], [key])

    def hold(self):
        self.s.hold_placement(self.now + self.draw(st.sampled_from([0.5, 5.0])))

    def tick(self):
        super().tick()
        self.s.tick(self.now)

    def settle(self):
        self.s.release_placement()
        self.now += 100                                       # every window ends: awaited keys fail
        self.s.tick(self.now)
        super().settle()

    EVENTS = FuzzRun.EVENTS + ["reattach_worker", "reattach_worker", "want_keys", "submit_unknown", "hold"]


@fuzz(200)
@given(st.data())
def test_random_event_sequences_with_reattaching_peers_keep_the_state_machine_consistent(data):
    play(ReattachRun(data), 60)


# -- what the fuzzing found, each kept as a plain regression test ----------------------

def test_a_result_from_another_worker_frees_the_copy_sent_elsewhere():
    """A task given up on while its thread ran, then sent to a second worker, is finished by
    the first thread: the second worker's copy was left 'processing' on it for ever."""
    s = SchedulerState(prefetch=0)
    s.add_worker("tcp://a:1", nthreads=1, now=0)
    s.add_client("c")
    s.update_graph("c", [task("x")], ["x"])
    s.task_started("tcp://a:1", "x", 1)
    s.client_releases("c", ["x"])                              # given up; a's thread still runs it
    s.add_worker("tcp://b:1", nthreads=1, now=2)
    s.update_graph("c", [task("x")], ["x"])                   # wanted again: goes to b (a is busy)
    assert s.tasks["x"].processing_on.address == "tcp://b:1"
    s.take_outbox()
    s.task_finished("tcp://a:1", "x", 8)                      # a's thread finishes first
    ts, b = s.tasks["x"], s.workers["tcp://b:1"]
    assert ts.state == "memory" and ts.processing_on is None and not b.processing
    assert {"op": "free-keys", "keys": ["x"]} in s.take_outbox()["tcp://b:1"]
    check(s)


def test_an_unwanted_task_with_a_missing_input_is_not_kept():
    s = SchedulerState(prefetch=0)
    s.add_client("c")
    s.update_graph("c", [task("a"), task("b", deps=["gone"])], ["a"])
    assert set(s.tasks) == {"a"}
    check(s)


def test_a_task_needed_only_by_an_unwanted_one_is_not_computed():
    s = SchedulerState(prefetch=0)
    s.add_worker("tcp://a:1", nthreads=1, now=0)
    s.add_client("c")
    s.update_graph("c", [task("a"), task("b"), task("c", deps=["b"])], ["a"])
    assert set(s.tasks) == {"a"}
    assert [m["key"] for m in s.take_outbox()["tcp://a:1"] if m["op"] == "compute"] == ["a"]
    check(s)


def test_a_task_with_a_failed_input_does_not_recompute_its_other_inputs():
    s = SchedulerState(prefetch=0)
    s.add_worker("tcp://a:1", nthreads=1, now=0)
    s.add_client("c")
    inputs = [task(f"x{i}") for i in range(20)]
    s.update_graph("c", inputs + [task("y", deps=[t["key"] for t in inputs])], ["y"])
    for t in inputs:
        s.task_finished("tcp://a:1", t["key"], 8)
    s.task_finished("tcp://a:1", "y", 8)                      # the x's: released, kept as y's lineage
    s.update_graph("c", [task("e")], ["e"])
    s.task_erred("tcp://a:1", "e", {"text": "boom"})
    s.take_outbox()
    # z needs a failed input (e) and released ones (the x's, through y's lineage)
    s.update_graph("c", [task("z", deps=["e"] + [t["key"] for t in inputs])], ["z"])
    assert s.tasks["z"].state == "erred" and s.tasks["z"].error["origin"] == "e"
    assert all(s.tasks[t["key"]].state == "released" for t in inputs)
    assert not [m for m in s.take_outbox().get("tcp://a:1", []) if m["op"] == "compute"]
    check(s)


def test_a_death_does_not_restart_tasks_that_its_own_cascade_already_released():
    """w dies holding scattered data d and running A (needs d) and B: d's loss fails A,
    so C (needs A and B) fails, so nobody needs B any more. B used to be started again
    anyway (for nobody), and A, already failed, was made to wait again."""
    s = SchedulerState(prefetch=0)
    s.add_worker("tcp://w:1", nthreads=2, now=0)
    s.add_client("c")
    s.scatter("c", {"d": ["tcp://w:1"]}, {"d": 8})
    s.update_graph("c", [task("x")], ["x"])
    s.task_erred("tcp://w:1", "x", {"text": "boom"})
    # C2 (failed: x failed) keeps B's record, and wants nothing from it.
    s.update_graph("c", [task("A", deps=["d"]), task("B"), task("C", deps=["A", "B"]),
                         task("C2", deps=["B", "x"])], ["C", "C2"])
    assert s.tasks["C2"].state == "erred"
    assert {ts.key for ts in s.workers["tcp://w:1"].processing} == {"A", "B"}
    s.add_worker("tcp://v:1", nthreads=2, now=1)
    s.take_outbox()
    s.remove_worker("tcp://w:1", 2, {"cause": "node-failure", "blame": False})
    check(s)
    assert s.tasks["C"].state == "erred" and s.tasks["C"].error["origin"] == "d"
    assert s.tasks["B"].state == "released" and s.tasks["A"].state == "erred"
    assert not s.workers["tcp://v:1"].processing
    assert "tcp://w:1" not in s.outbox                          # nothing queued for the dead worker


def test_a_task_released_by_a_death_it_outlived_is_not_started_again():
    """w dies running A (charged: over its limit, it fails) with B queued on it. A's failure
    fails C (needs A and B), so nobody needs B. B used to be started again anyway."""
    s = SchedulerState(prefetch=1, allowed_failures=0, queue_roots=False)
    s.add_worker("tcp://w:1", nthreads=1, now=0)
    s.add_client("c")
    s.update_graph("c", [task("x")], ["x"])
    s.task_erred("tcp://w:1", "x", {"text": "boom"})
    s.update_graph("c", [task("A"), task("B"), task("C", deps=["A", "B"]), task("C2", deps=["B", "x"])],
                   ["C", "C2"])                                # C2 (failed: x did) keeps B's record
    assert {ts.key for ts in s.workers["tcp://w:1"].processing} == {"A", "B"}
    s.task_started("tcp://w:1", "A", 1)
    s.add_worker("tcp://v:1", nthreads=2, now=1)
    s.take_outbox()
    s.remove_worker("tcp://w:1", 2, {"cause": "crash", "blame": True, "final_at": 2})
    check(s)
    assert s.tasks["A"].state == "erred" and s.tasks["C"].state == "erred"
    assert s.tasks["B"].state == "released" and not s.workers["tcp://v:1"].processing
    assert "tcp://w:1" not in s.outbox                          # nothing queued for the dead worker


def test_an_input_failed_in_the_same_submission_does_not_compute_the_others_for_nobody():
    """C needs B and A; A needs the failed x. Activating C pushed B and A; A failed, which
    failed C, and B was still made to compute, for nobody (found by fuzzing tasks of a millisecond). It
    happened when A came off the stack first: the order of C's inputs' set, so both orders."""
    for a, b in [("A", "B"), ("B", "A")]:
        with stable_hashes():
            s = SchedulerState(prefetch=1)
            s.add_worker("tcp://w:1", nthreads=1, now=0)
            s.add_client("c")
            s.update_graph("c", [task("x", deps=[a])], ["x"])           # a missing input: failed
            assert s.tasks["x"].state == "erred"
            s.update_graph("c", [task(a, deps=["x"]), task(b), task("C", deps=[b, a])], ["C"])
            check(s)
            assert s.tasks["C"].state == "erred" and s.tasks[b].state == "released"
            assert not s.take_outbox().get("tcp://w:1")


def test_a_task_sent_to_a_worker_waits_again_when_its_only_input_holder_dies():
    """t runs nowhere yet but was sent to v; its input's only copy dies with w. t goes back to
    waiting for the recomputed input (v is told to drop it) rather than stay processing on v,
    which would ask the dead holder in vain (found by fuzzing tasks of a millisecond)."""
    s = SchedulerState(prefetch=0, queue_roots=False)
    s.add_worker("tcp://w:1", nthreads=1, now=0)
    s.add_client("c")
    s.update_graph("c", [task("a")], ["a"])
    s.task_started("tcp://w:1", "a", 0)
    s.task_finished("tcp://w:1", "a", 8, 0.1)
    s.update_graph("c", [dict(task("x"), priority=5), task("t", deps=["a"])], ["x", "t"])
    s.add_worker("tcp://v:1", nthreads=1, now=0)
    assert s.tasks["t"].processing_on is s.workers["tcp://v:1"]
    s.take_outbox()
    s.remove_worker("tcp://w:1", 1, {"cause": "crash", "blame": True})
    check(s)
    assert s.tasks["t"].state == "waiting" and s.tasks["t"].waiting_on == {s.tasks["a"]}
    out = s.take_outbox()
    assert {"op": "free-keys", "keys": ["t"]} in out["tcp://v:1"]
    assert s.tasks["a"].state in ("queued", "processing")        # being recomputed (after x, dead with w)
