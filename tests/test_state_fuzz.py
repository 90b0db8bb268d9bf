"""The pure state machine driven by random event sequences (issue 14, "Kept held").

Each example is a sequence of events a scheduler can meet: graphs submitted (some with
cycles or missing inputs), workers joining, leaving and dying with evidence (verdicts
refined later), tasks started, finished and erred, worker reports delivered late, out of
order and twice, clients releasing keys, cancelling, leaving. After every step the
invariants below must hold; at the end, once every verdict is final and a healthy worker
runs whatever it is sent, every wanted task must be finished or failed (nothing hangs).

Derandomized with a fixed budget: the same examples on every run, in well under a minute.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler.state import SchedulerState

F, A = Opaque(b"f"), Opaque(b"a")
STATES = {"waiting", "queued", "processing", "memory", "erred", "released"}
ACTIVE = {"waiting", "queued", "processing"}
WORKERS = ["tcp://w1:1", "tcp://w2:1", "tcp://w3:1"]
CLIENTS = ["c1", "c2"]
CAUSES = [("crash", True), ("memory-nanny", True), ("connection-lost", False), ("walltime", False),
          ("retired", False)]


def check(s: SchedulerState) -> None:
    """Every invariant of the state machine's records."""
    for key, ts in s.tasks.items():
        assert ts.key == key and ts.state in STATES, ts
        for dep in ts.dependencies:
            assert s.tasks.get(dep.key) is dep, f"{ts} depends on forgotten {dep}"
            assert ts in dep.dependents
        for dts in ts.dependents:
            assert s.tasks.get(dts.key) is dts and ts in dts.dependencies, f"{ts}: stale dependent {dts}"
        assert ts.waiters <= ts.dependents and all(w.state in ACTIVE for w in ts.waiters), (ts, ts.waiters)
        assert ts.who_wants <= s.clients, f"{ts} wanted by gone clients {ts.who_wants - s.clients}"
        for ws in ts.who_has:
            assert s.workers.get(ws.address) is ws, f"{ts} held by dead {ws}"
            assert ts in ws.has_what
        assert bool(ts.who_has) == (ts.state == "memory"), (ts, ts.who_has)
        if ts.state == "processing":
            ws = ts.processing_on
            assert ws is not None and s.workers.get(ws.address) is ws, f"{ts} on a dead worker"
            assert ts in ws.processing and ts.executing == (ts in ws.executing)
        else:
            assert ts.processing_on is None and not ts.executing, ts
        if ts.state == "waiting":
            assert ts.waiting_on and ts.waiting_on <= ts.dependencies, (ts, ts.waiting_on)
            assert all(d.state not in ("memory", "erred") for d in ts.waiting_on), (ts, ts.waiting_on)
        else:
            assert not ts.waiting_on or ts.state in ("released", "erred") and not ts.waiting_on, ts
        if ts.state in ("queued", "processing"):
            assert all(d.state == "memory" for d in ts.dependencies), (ts, ts.dependencies)
        if ts.state in ACTIVE:
            assert ts.who_wants or ts.waiters, f"{ts} computed for nobody"
        if ts.state in ("released", "erred"):
            assert ts.who_wants or ts.dependents, f"{ts} kept for nothing"
        for attempt in ts.attempts:                   # charged only where it was executing
            assert ts.key in attempt["death"]["executing"], (ts, attempt["death"])
    for addr, ws in s.workers.items():
        assert ws.address == addr
        assert ws.executing <= ws.processing
        for ts in ws.processing:
            assert s.tasks.get(ts.key) is ts and ts.processing_on is ws, (ws, ts)
        for ts in ws.has_what:
            assert s.tasks.get(ts.key) is ts and ws in ts.who_has, (ws, ts)
    for ws in s._free:
        assert s.workers.get(ws.address) is ws, f"dead {ws} offered tasks"


class Run:
    """One example: the state machine, the world around it, and the reports in flight."""

    def __init__(self, data):
        self.data = data
        self.s = SchedulerState(allowed_failures=1, prefetch=1)
        self.now = 0.0
        self.n = 0
        self.in_flight: list = []          # worker reports not delivered yet: (method, args)
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
                          "priority": self.draw(st.integers(-2, 2)), "retries": self.draw(st.integers(0, 1))})
        keys = [s["key"] for s in specs]
        wanted = sorted(set(self.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys)))))
        self.s.update_graph(cid, specs, wanted)

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
        """A worker acts on what it was sent: the reports go in flight, delivered later."""
        for addr, msgs in self.s.take_outbox().items():
            for msg in msgs:
                if msg["op"] == "compute" and addr in self.s.workers:
                    k = msg["key"]
                    self.in_flight.append(("task_started", (addr, k, self.now)))
                    outcome = self.draw(st.sampled_from(["finished", "finished", "erred", "missing", "none"]))
                    if outcome == "finished":
                        self.in_flight.append(("task_finished", (addr, k, 10, 0.1)))
                    elif outcome == "erred":
                        self.in_flight.append(("task_erred", (addr, k, {"text": "boom"})))
                    elif outcome == "missing" and msg["deps"]:
                        dep = sorted(msg["deps"])[0]
                        self.in_flight.append(("missing_data", (addr, k, dep, msg["deps"][dep])))
                elif msg["op"] == "free-keys":
                    for k in msg["keys"]:
                        self.in_flight.append(("abandoned_done", (addr, k)))

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
    def settle(self):
        """Every verdict final, a healthy worker that does what it is told, every report
        delivered: then no wanted task may be left unfinished."""
        s = self.s
        for d in s.deaths:
            if d.get("final_at") is None:
                s.refine_death(d["id"], d["cause"], d["blame"], d["text"], final_at=self.now)
        s.add_worker("tcp://healthy:1", nthreads=4, now=self.now)
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


@settings(derandomize=True, max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_event_sequences_keep_the_state_machine_consistent(data):
    run = Run(data)
    for _ in range(data.draw(st.integers(5, 60))):
        getattr(run, data.draw(st.sampled_from(Run.EVENTS)))()
        check(run.s)
    run.settle()


# -- what the fuzzing found, each kept as a plain regression test ----------------------

def _task(key, deps=()):
    return {"key": key, "func": F, "args": A, "deps": list(deps)}


def test_a_result_from_another_worker_frees_the_copy_sent_elsewhere():
    """A task given up on while its thread ran, then sent to a second worker, is finished by
    the first thread: the second worker's copy was left 'processing' on it for ever."""
    s = SchedulerState(prefetch=0)
    s.add_worker("tcp://a:1", nthreads=1, now=0)
    s.add_client("c")
    s.update_graph("c", [_task("x")], ["x"])
    s.task_started("tcp://a:1", "x", 1)
    s.client_releases("c", ["x"])                              # given up; a's thread still runs it
    s.add_worker("tcp://b:1", nthreads=1, now=2)
    s.update_graph("c", [_task("x")], ["x"])                   # wanted again: goes to b (a is busy)
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
    s.update_graph("c", [_task("a"), _task("b", deps=["gone"])], ["a"])
    assert set(s.tasks) == {"a"}
    check(s)


def test_a_task_needed_only_by_an_unwanted_one_is_not_computed():
    s = SchedulerState(prefetch=0)
    s.add_worker("tcp://a:1", nthreads=1, now=0)
    s.add_client("c")
    s.update_graph("c", [_task("a"), _task("b"), _task("c", deps=["b"])], ["a"])
    assert set(s.tasks) == {"a"}
    assert [m["key"] for m in s.take_outbox()["tcp://a:1"] if m["op"] == "compute"] == ["a"]
    check(s)
