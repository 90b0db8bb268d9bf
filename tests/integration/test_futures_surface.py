"""Futures and the rest of the Client's surface as distributed's (issue 31, point 7): retry,
traceback, cancelled at once, as_completed's batches, wait_for_workers, get_executor, scatter's
keywords, client.scheduler, and LocalCluster.adapt, on real clusters."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
import traceback
import uuid

import pytest

from hpc_cluster import CancelledError, Client, Future, LocalCluster, TimeoutError, as_completed, wait
from helpers.aio import run
from helpers.ask import holders
from helpers.funcs import add, inc, slow_inc
from helpers.wait import wait_for_file, wait_until


def fail_unless(path: str) -> int:
    """Fails until the test creates `path` (the fix a user makes before retrying)."""
    with open(path) as f:             # FileNotFoundError until then
        f.read()
    return 10


def nested_failure(x):
    return _divide(1, x)


def _divide(a, b):
    return a / b


def fresh_token() -> str:
    return uuid.uuid4().hex


def test_retry_runs_a_failed_future_again_with_the_failure_it_came_from(client, tmp_path):
    flag = tmp_path / "fixed"
    a = client.submit(fail_unless, str(flag), pure=False)
    b = client.submit(add, a, 1)
    wait([a, b], timeout=30)
    assert a.status == b.status == "error" and isinstance(b.exception(), FileNotFoundError)
    flag.touch()
    b.retry()                                  # b's failure came from a: both run again
    assert b.status != "error" and a.status != "error"
    assert b.result(timeout=30) == 11 and a.result(timeout=30) == 10


def test_cancelled_is_true_as_cancel_returns_and_retry_runs_it_after_all(client, tmp_path):
    gate = tmp_path / "gate"
    gated = client.submit(wait_for_file, str(gate), 30, pure=False)
    gated.cancel()
    assert gated.cancelled() and gated.status == "cancelled"
    with pytest.raises(CancelledError):
        gated.result(timeout=10)
    done = client.submit(inc, 1)
    assert done.result(timeout=30) == 2
    client.cancel([done])                      # a finished one too, as distributed's
    assert done.cancelled()
    gate.touch()
    client.retry([gated, done])                # the finished one is told again, not recomputed
    assert gated.result(timeout=30) == str(gate) and done.result(timeout=30) == 2


def test_traceback_and_exception_carry_the_tasks_own_frames(client):
    f = client.submit(nested_failure, 0)
    tb = f.traceback(timeout=30)
    frames = traceback.extract_tb(tb)
    assert [fr.name for fr in frames] == ["nested_failure", "_divide"]
    assert all(fr.filename == __file__ for fr in frames)
    exc = f.exception()
    assert isinstance(exc, ZeroDivisionError)
    assert [fr.name for fr in traceback.extract_tb(exc.__traceback__)] == ["nested_failure", "_divide"]
    ok = client.submit(inc, 1)
    assert ok.traceback(timeout=30) is None and ok.exception() is None


def test_an_asynchronous_clients_futures_retry_and_tell_their_traceback(cluster, tmp_path):
    flag = tmp_path / "fixed"

    async def main():
        async with Client(cluster, asynchronous=True) as c:
            f = c.submit(fail_unless, str(flag), pure=False)
            tb = await f.traceback(timeout=30)         # awaited on the user's loop, as distributed's
            assert traceback.extract_tb(tb)[-1].name == "fail_unless"
            assert isinstance(await f.exception(), FileNotFoundError)
            flag.touch()
            await f.retry()
            assert await f == 10
            one = c.submit(inc, 1)
            assert [g.key async for g in as_completed([one])] == [one.key]
    run(main(), timeout=120)


def test_a_future_has_distributeds_public_names_and_meanings(client, cluster):
    import distributed
    assert {n for n in dir(distributed.Future) if not n.startswith("_")} <= set(dir(Future))
    f = client.submit(inc, 41)
    assert f.executor is client
    assert f.result(timeout=30) == 42 and f.type is int
    with Client(cluster, set_as_default=False) as other:
        f.bind_client(other)
        assert f.client is other
        client.close()                         # the first client's hold on it is gone with it
        assert f.result(timeout=30) == 42


def test_as_completed_hands_out_batches_and_answers_as_distributeds(client, tmp_path):
    quick = client.map(inc, range(6))
    ac = as_completed(quick)
    assert ac.count() == 6 and not ac.is_empty()
    wait_until(lambda: not ac.futures and ac.has_ready(), 30, "the six to be queued as done")
    batch = ac.next_batch(block=False)
    assert sorted(f.key for f in batch) == sorted(f.key for f in quick)
    assert ac.is_empty() and ac.next_batch(block=False) == [] and list(ac) == []

    gate = tmp_path / "gate"
    gated = client.submit(wait_for_file, str(gate), 30, pure=False)
    ac.update([gated])
    ac.add(client.submit(inc, 100))
    assert ac.count() == 2
    assert next(ac).result() == 101 and not ac.has_ready() and ac.count() == 1
    ac.clear()
    seen = threading.Event()
    gated.add_done_callback(lambda _: seen.set())      # runs after as_completed's own callback
    gate.touch()
    assert seen.wait(30) and not ac.has_ready() and ac.is_empty()

    futures = client.map(slow_inc, range(8), [0.05] * 8, pure=False)
    batches = list(as_completed(futures).batches())
    assert all(batches) and sorted(f.key for b in batches for f in b) == sorted(f.key for f in futures)


def test_as_completed_with_results_raises_errors_or_pairs_them(client, tmp_path):
    bad = client.submit(fail_unless, str(tmp_path / "never"), pure=False)
    good = client.submit(inc, 5)
    pairs = dict(as_completed([bad, good], with_results=True, raise_errors=False))
    assert pairs[good] == 6
    kind, exc, tb = pairs[bad]
    assert kind is FileNotFoundError and isinstance(exc, FileNotFoundError)
    assert traceback.extract_tb(tb)[-1].name == "fail_unless"
    with pytest.raises(FileNotFoundError):
        list(as_completed([bad], with_results=True))
    batches = list(as_completed([good, bad], with_results=True, raise_errors=False).batches())
    assert sum(len(b) for b in batches) == 2
    gated = client.submit(wait_for_file, str(tmp_path / "gate"), 2, pure=False)
    with pytest.raises(TimeoutError):
        next(as_completed([gated], timeout=0.2))
    with pytest.raises(TypeError, match="as_completed takes futures"):
        as_completed([1])


def test_wait_for_workers_takes_n_workers_and_the_older_n(client):
    client.wait_for_workers(n_workers=2, timeout=30)
    client.wait_for_workers(2, 30)
    client.wait_for_workers(n=1)
    client.wait_for_workers(0)                 # none to wait for (distributed's harnesses ask so)
    with pytest.raises(ValueError, match="whole number of workers"):
        client.wait_for_workers(-1)
    with pytest.raises(TimeoutError, match="fewer than 3 workers"):
        client.wait_for_workers(3, timeout=0.3)


def test_get_executor_runs_submit_and_map_on_the_cluster(client, tmp_path):
    with client.get_executor() as ex:
        fs = [ex.submit(inc, i) for i in range(10)]
        assert all(isinstance(f, cf.Future) for f in fs)
        assert [f.result(timeout=30) for f in fs] == list(range(1, 11))
        assert list(ex.map(add, range(3), range(3))) == [0, 2, 4]
        done, _ = cf.wait([ex.submit(inc, 1), ex.submit(fail_unless, str(tmp_path / "never"))], timeout=30)
        assert sorted(type(f.exception()).__name__ for f in done) == ["FileNotFoundError", "NoneType"]
        same = [ex.submit(fresh_token) for _ in range(3)]          # pure by default: one task
        assert len({f.result(timeout=30) for f in same}) == 1
    own = [client.get_executor(pure=False).submit(fresh_token) for _ in range(3)]   # kwargs reach submit
    assert len({f.result(timeout=30) for f in own}) == 3
    with pytest.raises(TypeError, match="'colour'.*submit's keywords"):
        client.get_executor(colour="red")


def test_an_executors_shutdown_and_map_timeout(client, tmp_path):
    waits = client.get_executor(pure=False)
    ended = waits.submit(slow_inc, 1, 0.3)
    waits.shutdown(wait=True)
    assert ended.done() and ended.result() == 2
    with pytest.raises(RuntimeError, match="after shutdown"):
        waits.submit(inc, 1)
    gate = tmp_path / "gate"
    cancels = client.get_executor(pure=False)
    gated = cancels.submit(wait_for_file, str(gate), 30)
    cancels.shutdown(wait=False)
    assert gated.cancelled()
    results = client.get_executor(pure=False).map(wait_for_file, [str(gate)], [30], timeout=0.3)
    with pytest.raises(cf.TimeoutError):
        next(results)
    gate.touch()                               # the worker threads those tasks hold are let go


def test_scatter_takes_workers_direct_broadcast_and_distributeds_shapes(client):
    info = client.scheduler_info()["workers"]
    first, second = sorted(info)
    xs = client.scatter([1, 2, 3], workers=[first], direct=True)
    assert all(h == [first] for h in holders(client, [x.key for x in xs]).values())
    assert xs[0].type is int and [x.result() for x in xs] == [1, 2, 3]
    named = client.scatter({"scattered-by-name": 1}, workers=info[second]["name"])
    assert holders(client, ["scattered-by-name"])["scattered-by-name"] == [second]
    host, port = second.split("://")[1].rsplit(":", 1)
    [paired] = client.scatter(["by pair"], workers=[(host, int(port))], hash=False)
    assert holders(client, [paired.key])[paired.key] == [second]
    [everywhere] = client.scatter(["everywhere"], broadcast=True, workers=[first, second])
    assert sorted(holders(client, [everywhere.key])[everywhere.key]) == [first, second]
    with pytest.raises(ValueError, match="no worker is 'nobody'"):
        client.scatter(1, workers="nobody")
    Point = collections.namedtuple("Point", "x y")
    point = client.scatter(Point(1, 2))
    assert isinstance(point, Point) and point.y.result() == 2
    both = client.scatter({1, 2})
    assert isinstance(both, set) and sorted(f.result() for f in both) == [1, 2]
    ordered = client.scatter(collections.OrderedDict(a=1))         # a dict subclass: one object
    assert isinstance(ordered, Future) and ordered.result() == {"a": 1}
    assert len(client.scatter(range(3))) == 3
    with pytest.raises(TypeError, match="not an iterator"):
        client.scatter(iter([1]))
    assert named["scattered-by-name"].result() == 1


def test_client_scheduler_has_the_address(client, cluster):
    assert client.scheduler.address == cluster.scheduler_address == client.scheduler_address


def running_workers(cluster) -> list[str]:
    return [name for name, proc in list(cluster.workers.items()) if proc.poll() is None]


def test_local_cluster_adapts_its_workers_to_the_load(tmp_path):
    with LocalCluster(n_workers=0, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        adaptive = cluster.adapt(minimum=0, maximum=2, interval="100ms", wait_count=2, target_duration="1s")
        gate = tmp_path / "gate"
        # 4 tasks of unknown length (1 s each to the scheduler): 4 workers wanted, 2 at most
        futures = c.map(wait_for_file, [str(gate)] * 4, [60] * 4, pure=False)
        wait_until(lambda: len(running_workers(cluster)) == 2 and len(c.scheduler_info()["workers"]) == 2,
                   90, "adapt to start two workers")
        gate.touch()
        wait(futures, timeout=60)
        kept = futures[0]
        del futures
        # idle, but a result is held: one worker stays for it
        wait_until(lambda: len(running_workers(cluster)) == 1, 60, "adapt to retire one idle worker")
        assert kept.result(timeout=30) == str(gate)
        del kept
        wait_until(lambda: not running_workers(cluster), 60, "adapt to retire the last one, nothing held")
        assert [d["status"] for _, d in adaptive.log][:1] == ["up"] and adaptive.log[-1][1] == {"status": "down", "n": 0}
        cluster.scale(1)                       # an explicit size ends adapt
        assert adaptive.state == "stopped"
        wait_until(lambda: len(c.scheduler_info()["workers"]) == 1, 60, "the scaled worker")
