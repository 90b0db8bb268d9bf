"""Which inputs a worker fetches from its peers, and when: driven directly, no processes.

The scheduler sends a worker up to nthreads + prefetch tasks. Inputs held elsewhere are
fetched for the tasks a thread is free for, and ahead of that only while the bytes fetched
ahead stay under fetch.FETCH_AHEAD_BYTES: a fetched input takes memory until its task ends.
"""

from __future__ import annotations

import pytest

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.worker import fetch as fetch_module
from hpc_cluster.worker.fetch import FETCH_AHEAD_BYTES, FETCH_REQUEST_BYTES, request_batches
from helpers.bare_worker import PEER, bare_worker, compute, finish

LARGE = FETCH_AHEAD_BYTES // 2 + 1          # two of them ahead are over the limit
SMALL = 1_000


@pytest.fixture
def worker(monkeypatch):
    """A 1-thread worker whose fetches and task starts are recorded, not done."""
    w = bare_worker(monkeypatch)
    w.fetched_for = []
    monkeypatch.setattr(w, "_fetch_for", lambda ts: w.fetched_for.append(ts.key))
    monkeypatch.setattr(w.executor, "submit", lambda *a: None)
    yield w
    w.executor.shutdown(wait=False)


def arrive(w, key):
    """The inputs of `key` arrived: it is ready and starts if a thread is free."""
    ts = w.tasks[key]
    for dep in ts.missing:
        w.data.put(dep, b"x")
    ts.missing.clear()
    w._make_ready(ts)
    w._run_ready()


def test_large_inputs_are_fetched_for_the_task_a_thread_is_free_for_not_ahead(worker):
    # Three merges of a rechunk, each with pieces on the other worker (70-80 MB): fetching
    # for all three held the pieces of three output blocks while the thread assembled one.
    for i in range(3):
        compute(worker, f"m{i}", [f"p{i}a", f"p{i}b"], priority=i, size=LARGE)
    assert worker.fetched_for == ["m0"]
    arrive(worker, "m0")
    assert worker.executing == {"m0"}
    assert worker.fetched_for == ["m0"]                # m1's inputs are over the limit: not ahead
    finish(worker, "m0")
    assert worker.fetched_for == ["m0", "m1"]          # the thread is free for m1


def test_inputs_are_fetched_ahead_up_to_the_limit(worker):
    for i in range(4):
        compute(worker, f"t{i}", [f"x{i}"], priority=i, size=LARGE)
    assert worker.fetched_for == ["t0"]
    arrive(worker, "t0")
    assert worker.fetched_for == ["t0", "t1"]          # t0 runs: t1's inputs come meanwhile
    arrive(worker, "t1")                               # ready, waiting for the thread
    assert worker.fetched_for == ["t0", "t1"]          # t2's would take what waits over the limit
    finish(worker, "t0")
    assert worker.executing == {"t1"}
    assert worker.fetched_for == ["t0", "t1", "t2"]


def test_small_inputs_are_fetched_ahead_for_every_task_held(worker):
    # Tiny tasks: the round trip is the cost, the memory nothing.
    for i in range(3):
        compute(worker, f"t{i}", [f"x{i}"], priority=i, size=SMALL)
    assert worker.fetched_for == ["t0", "t1", "t2"]


def test_fetches_start_in_priority_order_and_skip_inputs_already_here(worker):
    compute(worker, "busy", [], priority=0, size=0)    # no inputs: runs at once
    assert worker.executing == {"busy"}
    compute(worker, "late", ["a"], priority=5, size=FETCH_AHEAD_BYTES, batch=True)
    compute(worker, "early", ["b"], priority=1, size=FETCH_AHEAD_BYTES, batch=True)
    compute(worker, "here", ["c"], priority=2, size=FETCH_AHEAD_BYTES)
    assert worker.fetched_for == ["early"]
    worker.data.put("c", b"x")                          # came meanwhile (for another task)
    arrive(worker, "early")
    finish(worker, "busy")
    assert worker.executing == {"early"}
    assert "here" not in worker.fetched_for and worker.tasks["here"].state == "ready"
    finish(worker, "early")
    assert worker.executing == {"here"}
    assert worker.fetched_for == ["early", "late"]


def test_a_paused_worker_hands_back_the_tasks_whose_inputs_it_has_not_fetched(worker, monkeypatch):
    for i in range(3):
        compute(worker, f"m{i}", [f"p{i}"], priority=i, size=LARGE)
    monkeypatch.setattr(worker.memory, "pause_changed", lambda rss: True)
    worker.memory.paused = True
    worker._maybe_pause(0)
    handed = [m for m in worker.scheduler.sent if m["op"] == "handed-back"]
    assert handed and set(handed[-1]["keys"]) == {"m1", "m2"}
    assert set(worker.tasks) == {"m0"}                  # its inputs are on the way; handed back when they arrive


def test_without_sizes_every_task_held_fetches_as_before(worker):
    # A scheduler that sends no sizes (an older one): nothing is held back.
    for i in range(3):
        worker._add_task({"op": "compute", "key": f"t{i}", "func": Opaque(b""), "args": Opaque(b""),
                          "deps": {f"x{i}": ["tcp://127.0.0.1:3"]}, "priority": [i]})
    worker._run_ready()
    assert worker.fetched_for == ["t0", "t1", "t2"]
    assert fetch_module.FETCH_AHEAD_BYTES > 0


def test_request_batches_keep_each_request_under_the_limit():
    sizes = {"a": 15, "b": 15, "c": 15, "d": 40, "e": 1}
    assert request_batches(list("abcde"), sizes, 30) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert request_batches(["x", "y"], {}, 30) == [["x", "y"]]          # sizes unknown: one request
    assert request_batches([], sizes, 30) == []
    # A reply carries a frame per key: a bounded count too, even of keys of no size.
    assert request_batches(list("abcde"), {}, 30, most_keys=2) == [["a", "b"], ["c", "d"], ["e"]]
    assert len(request_batches([f"k{i}" for i in range(25_000)], {}, 30)) == 3


def test_large_inputs_from_one_holder_are_asked_for_one_request_at_a_time(monkeypatch):
    # Five 15 MB pieces from one holder (a rechunk's): not one reply of 75 MB, whose copies the
    # holder and we would each hold at once, but requests of at most FETCH_REQUEST_BYTES, the
    # next sent only when the last reply was taken in.
    import asyncio

    w = bare_worker(monkeypatch)
    piece = 15_000_000
    keys = [f"p{i}" for i in range(5)]
    asked, open_requests = [], []

    async def request(address, msg):
        open_requests.append(msg["keys"])
        assert len(open_requests) == 1, open_requests      # never two at a time to one holder
        asked.append(list(msg["keys"]))
        await asyncio.sleep(0)
        open_requests.pop()
        from hpc_cluster.protocol import serialize
        return {"data": {k: Opaque(serialize.dumps(k)) for k in msg["keys"]}}

    async def run():
        w.loop = asyncio.get_running_loop()
        monkeypatch.setattr(w, "request", request)
        for k in keys:
            w.borrowed[k] += 1
        fut = w.loop.create_future()
        await w._fetch("tcp://127.0.0.1:3", keys, fut, {k: piece for k in keys})
        return fut.result()

    try:
        missing = asyncio.run(run())
    finally:
        w.executor.shutdown(wait=False)
    assert missing == []
    assert all(sum(piece for _ in batch) <= max(FETCH_REQUEST_BYTES, piece) for batch in asked), asked
    assert len(asked) >= 3 and [k for b in asked for k in b] == keys, asked
    assert all(k in w.data for k in keys)


def test_the_inputs_a_turn_needs_from_one_holder_are_asked_in_one_request(monkeypatch):
    # A tree's level: each task's input was asked for apart, a request (a pooled connection,
    # and over TLS a record each way) per task; now one per holder for the whole turn.
    import asyncio

    from hpc_cluster.protocol import serialize

    async def run():
        w = bare_worker(monkeypatch)
        w.loop = asyncio.get_running_loop()
        monkeypatch.setattr(w.executor, "submit", lambda *a: None)
        asked = []

        async def request(holder, msg):
            asked.append((holder, sorted(msg["keys"])))
            return {"op": "data", "missing": [], "errors": {},
                    "data": {k: serialize.dumps_value(k.upper()) for k in msg["keys"]}}

        w.request = request
        for i in range(3):
            compute(w, f"t{i}", [f"x{i}"], priority=i, size=SMALL, batch=True)
        w._run_ready()
        assert asked == []                              # asked at the end of the turn
        for _ in range(100):
            if all(w.tasks[f"t{i}"].state != "fetching" for i in range(3)):
                break
            await asyncio.sleep(0)
        w.executor.shutdown(wait=False)
        return asked, {f"x{i}": w.data.get(f"x{i}") for i in range(3)}

    asked, inputs = asyncio.run(run())
    assert asked == [(PEER, ["x0", "x1", "x2"])]
    assert inputs == {"x0": "X0", "x1": "X1", "x2": "X2"}
