"""Coordination as dask.distributed's (issue 31, point 5): Lock, Semaphore, MultiLock, Event,
Variable, Queue, fire_and_forget and published datasets, on real clusters, used from the user's
process and from inside tasks; a lease released when its holder's client disconnects or its
worker is gone; variables, datasets, queues and events kept across a scheduler restart."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from hpc_cluster import (Client, Event, Lock, LocalCluster, MultiLock, Queue, Semaphore, TimeoutError, Variable,
                         fire_and_forget, get_client)
from hpc_cluster.scheduler.journal import load
from helpers.ask import knows_key, worker_pids
from helpers.funcs import inc, slow_inc
from helpers.procs import ClusterProcesses
from helpers.wait import wait_for_file, wait_until


def in_turn(path, lock, i):
    """Append an enter and an exit line under the lock: with it held, no two tasks interleave."""
    with lock:
        with open(path, "a") as f:
            f.write(f"enter {i}\n")
        time.sleep(0.02)
        with open(path, "a") as f:
            f.write(f"exit {i}\n")
    return i


def most_at_once(path) -> int:
    inside = most = 0
    for line in open(path).read().split():
        if line in ("enter", "exit"):
            inside += 1 if line == "enter" else -1
            most = max(most, inside)
    return most


def test_a_lock_lets_one_task_in_at_a_time(client, tmp_path):
    path = str(tmp_path / "log")
    lock = Lock("in-turn")
    assert sorted(client.gather(client.map(in_turn, [path] * 12, [lock] * 12, range(12)))) == list(range(12))
    assert most_at_once(path) == 1
    assert not lock.locked()


def test_a_semaphore_lets_at_most_its_leases_in(client, tmp_path):
    path = str(tmp_path / "log")
    sem = Semaphore(max_leases=2, name="two-at-once")
    client.gather(client.map(in_turn, [path] * 12, [sem] * 12, range(12)))
    assert most_at_once(path) == 2
    assert sem.get_value() == 0


def test_lock_acquire_timeouts_and_non_blocking_as_distributed(client):
    lock = Lock("timeouts")
    assert lock.acquire() and lock.locked()
    other = Lock("timeouts")
    t0 = time.monotonic()
    assert other.acquire(timeout="200ms") is False
    assert time.monotonic() - t0 >= 0.19
    assert other.acquire(blocking=False) is False
    with pytest.raises(ValueError, match="non-blocking"):
        other.acquire(blocking=False, timeout=1)
    with pytest.raises(RuntimeError, match="Released too often"):
        other.release()
    lock.release()
    assert other.acquire(blocking=False) is True
    other.release()


def test_a_semaphore_of_another_size_under_the_same_name_is_refused(client):
    Semaphore(max_leases=2, name="sized").acquire()
    with pytest.raises(ValueError, match="Inconsistent max leases"):
        Semaphore(max_leases=3, name="sized").acquire()
    with pytest.raises(ValueError, match="max_leases"):
        Semaphore(max_leases=0)
    with pytest.raises(ValueError, match="timeout"):
        Lock("x").acquire(timeout="soon")


def test_a_waiting_acquire_is_granted_when_the_holder_releases(client):
    held = Lock("handover")
    assert held.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(Lock("handover").acquire(timeout=20)))
    waiter.start()
    held.release()
    waiter.join(20)
    assert got == [True]


def test_a_lock_held_by_a_client_that_disconnects_is_released(cluster, client):
    with Client(cluster, set_as_default=False) as other:
        with other.as_current():
            assert Lock("left-behind").acquire()
        assert Lock("left-behind").locked()
        got = []
        waiter = threading.Thread(target=lambda: got.append(Lock("left-behind").acquire(timeout=20)))
        waiter.start()
    waiter.join(20)                    # the other client closed without releasing: the waiter gets it
    assert got == [True]


def hold_then_sleep(sem, marker):
    """Take a lease on the first run only (a rerun after the worker died takes none), then wait."""
    if os.path.exists(marker):
        return "rerun"
    sem.acquire()
    open(marker, "w").close()
    time.sleep(60)
    return "done"


def test_a_lease_of_a_task_whose_worker_died_is_released(tmp_path):
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        sem = Semaphore(max_leases=1, name="dies-with-its-worker")
        marker = str(tmp_path / "held")
        fut = client.submit(hold_then_sleep, sem, marker)
        wait_until(lambda: os.path.exists(marker), what="the task's lease")
        assert sem.get_value() == 1
        (pid,) = worker_pids(client).values()
        os.kill(pid, signal.SIGKILL)
        assert sem.acquire(timeout=20)
        assert fut.result(30) == "rerun"
        sem.release()


def test_a_lease_is_released_when_its_worker_is_removed_though_its_process_lingers(tmp_path):
    # No nanny (it would end the silent worker, and the process's connections with it): the
    # worker is stopped, found silent and removed, while its client's connection stays open.
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", nanny=False, heartbeat_ttl=2,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        sem = Semaphore(max_leases=1, name="silent-worker")
        marker = str(tmp_path / "held")
        held = client.submit(hold_then_sleep, sem, marker)      # kept: a future let go would release the task
        wait_until(lambda: os.path.exists(marker), what="the task's lease")
        (pid,) = worker_pids(client).values()
        os.kill(pid, signal.SIGSTOP)
        try:
            assert sem.acquire(timeout=30)
            assert psutil.Process(pid).status() == psutil.STATUS_STOPPED
        finally:
            os.kill(pid, signal.SIGKILL)
        sem.release()
        assert held.status == "pending"                          # its worker gone, no other to run it


def test_a_multilock_takes_all_its_locks_or_waits(client):
    both = MultiLock(["ml-a", "ml-b"])
    assert both.acquire() and both.locked()
    assert MultiLock(["ml-b", "ml-c"]).acquire(timeout=0.1) is False
    any_one = MultiLock(["ml-b", "ml-c"])
    assert any_one.acquire(num_locks=1, timeout=5)           # ml-c is free: it takes that one
    both.release()
    assert not both.locked()
    with pytest.raises(ValueError, match="not yet acquired"):
        both.release()
    again = MultiLock(["ml-a", "ml-b"])
    assert again.acquire(timeout=5)
    assert MultiLock(["ml-c"]).acquire(blocking=False) is False
    any_one.release()
    assert MultiLock(["ml-c"]).acquire(timeout=5)
    again.release()


def wait_for_event(event, timeout):
    return event.wait(timeout)


def test_an_event_set_by_the_user_lets_waiting_tasks_go(client):
    event = Event("go")
    waiting = client.map(wait_for_event, [event] * 3, [30] * 3, pure=False)
    assert event.wait(0.2) is False and not any(f.done() for f in waiting)
    event.set()
    assert client.gather(waiting) == [True] * 3
    assert event.is_set() and event.wait(0)
    event.clear()
    assert not event.is_set() and event.wait(0.1) is False
    assert client.submit(wait_for_event, event, 0.1, pure=False).result(10) is False


def set_variable(variable, x):
    client = get_client()
    variable.set(client.submit(inc, x, pure=False))
    return "set"


def test_a_variable_shares_values_and_futures_between_clients_and_tasks(cluster, client):
    v = Variable("shared")
    with pytest.raises(TimeoutError):
        v.get(timeout=0.1)
    v.set({"a": [1, 2]})
    assert v.get() == {"a": [1, 2]}
    assert client.submit(lambda var: var.get()["a"][1], v).result(10) == 2
    assert client.submit(set_variable, v, 41).result(10) == "set"    # a task's future, kept by the variable
    with Client(cluster, set_as_default=False) as other:
        got = Variable("shared", client=other).get(timeout=5)
        assert got.result(10) == 42 and got.client is other
    v.delete()
    with pytest.raises(TimeoutError):
        v.get(timeout=0.1)


def test_a_variable_keeps_its_future_computed_after_the_setter_lets_go(client):
    v = Variable("kept")
    f = client.submit(slow_inc, 1, pure=False)
    key = f.key
    v.set(f)
    del f
    got = v.get()
    assert got.key == key and got.result(10) == 2
    del got
    v.delete()
    wait_until(lambda: not knows_key(client, key), what="the key released once the variable is deleted")


def produce(queue, n):
    for i in range(n):
        queue.put(i)
    return n


def test_a_queue_passes_values_from_a_task_in_order(client):
    q = Queue("numbers")
    assert client.submit(produce, q, 5).result(10) == 5
    assert q.qsize() == 5
    assert [q.get() for _ in range(2)] == [0, 1]
    assert q.get(batch=2) == [2, 3]
    assert q.get(batch=True) == [4]
    assert q.get(batch=True) == []
    with pytest.raises(TimeoutError):
        q.get(timeout=0.1)
    with pytest.raises(NotImplementedError):
        q.get(batch=2, timeout=1)
    q.close()


def test_a_bounded_queue_makes_a_put_wait_for_room(client):
    q = Queue("bounded", maxsize=1)
    q.put("first")
    with pytest.raises(TimeoutError, match="full"):
        q.put("second", timeout=0.1)
    putter = threading.Thread(target=q.put, args=("third",), kwargs={"timeout": 20})
    putter.start()
    assert q.get(timeout=5) == "first"
    putter.join(20)
    assert q.get(timeout=5) == "third"


def test_futures_through_a_queue_stay_computed_until_taken(cluster, client):
    q = Queue("futures")
    fs = client.map(inc, range(3))
    keys = [f.key for f in fs]
    for f in fs:
        q.put(f)
    del fs, f
    with Client(cluster, set_as_default=False) as other:
        taken = Queue("futures", client=other).get(batch=3)
        assert [f.key for f in taken] == keys
        assert other.gather(taken) == [1, 2, 3]


def write_after_gate(gate, out):
    wait_for_file(gate)
    open(out, "w").close()
    return out


def test_fire_and_forget_runs_a_task_nobody_holds_and_then_lets_it_go(client, tmp_path):
    gate, out = str(tmp_path / "gate"), str(tmp_path / "out")
    f = client.submit(write_after_gate, gate, out)
    key = f.key
    fire_and_forget(f)
    del f
    open(gate, "w").close()
    wait_until(lambda: os.path.exists(out), what="the forgotten task's side effect")
    wait_until(lambda: not knows_key(client, key), what="its result let go once it ran")


def test_published_datasets_as_distributed(cluster, client):
    import dask.array as da
    x = client.persist(da.arange(10, chunks=5) + 1)
    client.publish_dataset(x, name="xs")
    client.publish_dataset(y=client.submit(inc, 1), z=[1, 2])
    with pytest.raises(KeyError, match="already exists"):
        client.publish_dataset({"z": 3})
    client.publish_dataset({"z": 3}, override=True)
    assert client.list_datasets() == ["xs", "y", "z"]
    assert set(client.datasets) == {"xs", "y", "z"} and len(client.datasets) == 3 and "z" in client.datasets
    del x
    with Client(cluster, set_as_default=False) as other:
        assert other.compute(other.get_dataset("xs").sum()).result(10) == 55
        assert other.get_dataset(["y", "z"])[0].result(10) == 2
        assert other.datasets["z"] == 3
        assert other.get_dataset("missing", default=None) is None
        with pytest.raises(KeyError, match="not found"):
            other.get_dataset("missing")
    client.datasets[("a", 1)] = "tuple named"
    assert client.get_dataset(("a", 1)) == "tuple named"
    del client.datasets[("a", 1)]
    client.unpublish_dataset(["xs", "y"])
    del client.datasets["z"]
    assert client.list_datasets() == []


def test_a_dataset_is_refused_a_name_that_is_no_key(client):
    with pytest.raises(TypeError, match="dask key"):
        client.publish_dataset(1, name=object())
    with pytest.raises(ValueError, match="name="):
        client.publish_dataset(name="empty")


def journal_has(path, records: int, queued: int) -> bool:
    """The journal at `path` holds `records` coordination objects, a queue among them with `queued` items."""
    held = load(path).coordination.values()
    return len(held) == records and any(r[1] == "queue" and len(r[3]["items"]) == queued for r in held)


def test_coordination_outlives_a_scheduler_restart(tmp_path):
    procs = ClusterProcesses(tmp_path)
    journal = tmp_path / "scheduler.journal"
    try:
        sched, address = procs.scheduler("--journal", str(journal), "--resume")
        procs.worker(address)
        with Client(address, secret=procs.secret, set_as_default=False) as client:
            f = client.submit(inc, 1, pure=False)
            assert f.result(10) == 2
            Variable("v", client=client).set(f)
            key = f.key
            del f                                  # the variable alone keeps it
            Variable("plain", client=client).set("kept")
            client.publish_dataset(d=[1, 2, 3])
            q = Queue("q", client=client)
            q.put("first")
            q.put("second")
            Event("e", client=client).set()
            wait_until(lambda: journal_has(journal, 5, queued=2), what="the journal's coordination records")
            sched.kill()
            sched.wait()
            procs.scheduler("--journal", str(journal), "--resume", port=int(address.rsplit(":", 1)[1]))
            assert Variable("plain", client=client).get(timeout=30) == "kept"
            got = Variable("v", client=client).get(timeout=30)
            assert got.key == key and got.result(30) == 2
            assert client.get_dataset("d") == [1, 2, 3]
            assert q.get(timeout=10) == "first" and q.qsize() == 1
            assert Event("e", client=client).is_set()
    finally:
        procs.end()


def test_unnamed_objects_get_names_of_their_own(client):
    names = {Variable().name, Event().name, Queue().name, Lock().name, Semaphore().name}
    assert len(names) == 5 and all(isinstance(n, str) and n for n in names)
    unnamed = Variable()
    unnamed.set(1)
    assert unnamed.get() == 1
