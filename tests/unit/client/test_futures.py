"""Futures' states and waiting on them (futures.FutureStates), without a cluster: states are
settled by a thread of the test's, as the client's loop thread settles them."""

from __future__ import annotations

import threading
import time

import pytest

from hpc_cluster import TimeoutError
from hpc_cluster.client.futures import Future, FutureStates, wait
from helpers.wait import wait_until


class Owner:
    """The calls a Future makes of its client, over a FutureStates (as the Client's)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.states = FutureStates(self.lock)

    def future_state(self, key):
        return self.states.state(key)

    def hold_key(self, key):
        self.states.state(key)

    def release_key(self, key):
        pass

    def wait_keys(self, keys, timeout, first=False, until_error=False):
        return self.states.wait(keys, timeout, first, until_error)

    def settle(self, key, status="finished", error=None):
        with self.lock:
            self.states.state(key).settle(status, error)


def settle_later(owner: Owner, *settles, when: threading.Event) -> threading.Thread:
    """Settle (key, status) pairs from another thread once `when` is set."""
    def run():
        when.wait(10)
        for key, status in settles:
            owner.settle(key, status)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def waiting(owner: Owner, keys) -> bool:
    """Every key's state has a waiter hung on it: the waiting thread is inside its wait."""
    with owner.lock:
        return all(owner.states.state(k).waiters for k in keys)


def wait_in_thread(owner: Owner, keys, **kw) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(owner.states.wait(keys, 10, **kw)), daemon=True)
    t.start()
    wait_until(lambda: waiting(owner, [k for k in keys if owner.states.state(k).status == "pending"]), 10,
               "the waiter to register", interval=0.001)
    return t, out


def test_one_wait_wakes_when_its_last_key_settles():
    owner = Owner()
    keys = [f"k{i}" for i in range(100)]
    t, out = wait_in_thread(owner, keys)
    for k in keys[:-1]:
        owner.settle(k)
    t.join(0.2)
    assert t.is_alive() and out == []                    # one key is still pending
    owner.settle(keys[-1], "error")
    t.join(10)
    assert out == [True]
    assert all(owner.states.state(k).waiters is None for k in keys)


def test_a_timed_out_wait_leaves_no_waiter_behind():
    owner = Owner()
    owner.settle("done")
    start = time.monotonic()
    assert owner.states.wait(["done", "never"], 0.05) is False
    assert time.monotonic() - start >= 0.05
    assert not owner.states.state("never").waiters
    assert owner.states.wait(["done"], 0) is True        # already done: no waiting at all


def test_first_and_until_error_end_the_wait_early():
    owner = Owner()
    t, out = wait_in_thread(owner, ["a", "b"], first=True)
    owner.settle("b")
    t.join(10)
    assert out == [True] and owner.states.state("a").status == "pending"
    owner.settle("a")                                    # its spent countdown goes with it
    assert owner.states.state("a").waiters is None

    t, out = wait_in_thread(owner, ["c", "d"], until_error=True)
    owner.settle("c")                                    # finished: not an error, keep waiting
    t.join(0.2)
    assert t.is_alive()
    owner.settle("d", "cancelled")
    t.join(10)
    assert out == [True]
    # Failed already: returns at once while another key is still pending.
    assert owner.states.wait(["d", "e"], 0, until_error=True) is True
    assert owner.states.wait(["d", "e"], 0) is False


def test_a_key_recomputing_again_is_waited_for_again():
    owner = Owner()
    owner.settle("x")
    with owner.lock:
        owner.states.state("x").status = "pending"       # the client's key-recomputing
    assert owner.states.wait(["x"], 0.02) is False
    t, out = wait_in_thread(owner, ["x"])
    owner.settle("x")
    t.join(10)
    assert out == [True]


def test_many_threads_wait_on_the_same_keys():
    owner = Owner()
    keys = [f"k{i}" for i in range(50)]
    go = threading.Event()
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(owner.states.wait(keys, 10)), daemon=True)
               for _ in range(8)]
    for t in threads:
        t.start()
    settler = settle_later(owner, *((k, "finished") for k in keys), when=go)
    go.set()
    for t in [settler, *threads]:
        t.join(10)
    assert results == [True] * 8


def test_wait_all_completed_waits_on_each_client_once():
    one, two = Owner(), Owner()
    fa, fb = Future("a", one), Future("b", two)
    go = threading.Event()
    settle_later(one, ("a", "finished"), when=go)
    settle_later(two, ("b", "error"), when=go)
    go.set()
    done, not_done = wait([fa, fb], timeout=10)
    assert done == {fa, fb} and not not_done
    with pytest.raises(TimeoutError):
        wait([fa, Future("c", two)], timeout=0.05)


def test_done_callbacks_run_once_settled_or_at_once_when_already_done():
    owner = Owner()
    seen: list = []
    ran = threading.Event()
    owner.states.add_callback("k", lambda: (seen.append("later"), ran.set()))
    assert seen == []
    owner.settle("k")
    owner.states.run_callbacks(owner.states.state("k"))
    assert ran.wait(10) and seen == ["later"]
    ran.clear()
    owner.states.add_callback("k", lambda: (seen.append("at once"), ran.set()))
    assert ran.wait(10) and seen == ["later", "at once"]
    owner.states.close()
