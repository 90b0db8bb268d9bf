"""What distributed's own tests found our Client lacking (issue 31, point 10; the suite is
tests/peers/distributed_suite): timeouts as strings, as_completed's pairs, client.futures and
Future.release, gather/get's keywords, start(), replicate's and wait_for_workers' edges,
scheduler_info's identity, repr and HTML, futures_of of a class, dask's get_scheduler(), nbytes,
normalize_collection, recreating tasks locally, Client.current per thread, get() releasing its
work when a task fails, dependents of a cancelled future, the executor's keywords, and short
tracebacks. On real clusters (tests/conftest.py's `client`: 2 workers x 2 threads)."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
import traceback

import dask
import pytest

from hpc_cluster import Client, TimeoutError, as_completed, futures_of, wait
from helpers.funcs import double, inc
from helpers.wait import wait_for_file, wait_until

pytestmark = pytest.mark.timeout(180)


def ratio(a, b):
    return a / b


def fails_until_attempt(path: str, n: int) -> int:
    """Fails on each of its first n - 1 runs (counted in `path`), then returns how many runs it took."""
    with open(path, "a+") as f:
        f.write("x")
        f.seek(0)
        runs = len(f.read())
    if runs < n:
        raise ZeroDivisionError(f"run {runs}")
    return runs


# -- 1. timeouts as distributed takes them ------------------------------------------------------------
def test_every_wait_takes_a_timeout_as_a_string(client, tmp_path):
    gate = str(tmp_path / "gate")
    held = client.submit(wait_for_file, gate, 60, pure=False)
    with pytest.raises(TimeoutError):
        held.result(timeout="10 ms")
    with pytest.raises(TimeoutError):
        held.exception(timeout="10ms")
    with pytest.raises(TimeoutError):
        client.gather(held, timeout="20ms")
    with pytest.raises(TimeoutError):
        wait([held], timeout="20ms")
    with pytest.raises(TimeoutError):
        next(as_completed([held], timeout="0.1s"))
    with pytest.raises(TimeoutError):
        client.wait_for_workers(3, timeout="300ms")
    with pytest.raises(TypeError, match="timeout.*list"):       # wait(x, y): y in the timeout's place
        wait(held, held)
    with pytest.raises(ValueError, match="not a time"):
        held.result(timeout="soon")
    (tmp_path / "gate").touch()
    assert held.result(timeout="30s") == gate


# -- 2. as_completed's pairs of failed and cancelled futures -------------------------------------------------
def test_as_completed_without_raising_pairs_each_future_with_its_exception(client, tmp_path):
    failed = client.submit(ratio, 1, 0)
    cancelled = client.submit(wait_for_file, str(tmp_path / "never"), 60, pure=False)
    fine = client.submit(inc, 1)
    pairs = as_completed([failed, cancelled, fine], with_results=True, raise_errors=False)
    cancelled.cancel()
    got = dict(pairs)
    assert isinstance(got[cancelled], cf.CancelledError)        # what distributed's code catches
    kind, exc, tb = got[failed]
    assert kind is ZeroDivisionError and isinstance(exc, ZeroDivisionError) and tb is not None
    assert got[fine] == 2


# -- 3. client.futures and Future.release ---------------------------------------------------------------------
def test_client_futures_lists_what_it_holds_and_release_lets_go(client):
    x = client.submit(inc, 10)
    x.result()
    assert x.key in client.futures and client.futures[x.key].status == "finished"
    x.release()
    assert x.key not in client.futures
    x.release()                                   # once only: another Future of the key still holds it
    y = client.submit(inc, 11)
    y2 = client.submit(inc, 11)                   # the same key, pure
    y.release()
    assert y2.key in client.futures and y2.result() == 12
    del y2
    wait_until(lambda: y.key not in client.futures, 10, "the last future of the key gone")


# -- 4. gather/get keywords, start(), direct_to_workers, replicate, wait_for_workers, scheduler_info --------
def test_distributeds_keywords_and_edges(client):
    futures = client.scatter([1, 2, 3], direct=True)
    assert client.gather(futures, direct=True, asynchronous=False) == [1, 2, 3]
    assert dask.delayed(inc)(1).compute(direct=True) == 2
    client.start()
    client.start()                                # started as it was made: nothing to do, twice
    assert client.submit(inc, 1).result() == 2
    assert client.direct_to_workers is None
    with pytest.raises(ValueError, match="replicate"):
        client.replicate(futures, n=0)
    with pytest.raises(ValueError):
        client.replicate(futures, n=-1)
    client.wait_for_workers(0)                    # none to wait for: at once
    with pytest.raises(ValueError):
        client.wait_for_workers(-1)


def test_scheduler_info_is_the_schedulers_identity(client):
    before = time.time()
    info = client.scheduler_info()
    assert isinstance(info["started"], float) and info["started"] < before
    assert info["type"] == "Scheduler" and info["address"] == client.scheduler_address
    assert info["n_workers"] == len(info["workers"]) == 2
    assert info["total_threads"] == 4 and info["total_memory"] == 2 * 2_000_000_000
    assert len(client.scheduler_info(n_workers=1)["workers"]) == 1
    assert client.scheduler_info()["started"] == info["started"]


# -- 5. repr and HTML ------------------------------------------------------------------------------------------
def test_repr_says_workers_threads_and_memory_as_distributeds(cluster):
    c = Client(cluster, set_as_default=False)
    text = repr(c)
    assert text == f"<Client: {c.scheduler_address!r} processes=2 threads=4, memory=3.73 GiB>"
    assert str(c) == text and len(text) < 80
    assert "Total threads: </strong>" in c._repr_html_()
    c.close()
    assert repr(c) == "<Client: No scheduler connected>"
    assert "No scheduler connected" in c._repr_html_()


# -- 6, 7. futures_of a class; dask's get_scheduler() -------------------------------------------------------
def test_futures_of_a_collections_class_is_empty():
    da = pytest.importorskip("dask.array")
    assert futures_of([da.Array]) == []


def test_dasks_get_scheduler_is_the_current_clients_get(cluster):
    with Client(cluster) as c:
        assert dask.base.get_scheduler() == c.get
    assert dask.base.get_scheduler() != c.get


# -- 8. nbytes, normalize_collection, recreating tasks locally ------------------------------------------------
def test_nbytes_by_key_and_by_kind(client):
    incs = client.map(inc, [1, 2, 3])
    doubles = client.map(double, [1, 2, 3])
    wait(incs + doubles)
    each = client.nbytes(incs + doubles, summary=False)
    assert each == {f.key: 28 for f in incs + doubles}           # sys.getsizeof of a small int
    summary = client.nbytes(summary=True)
    assert summary["inc"] >= 3 * 28 and summary["double"] >= 3 * 28


def test_normalize_collection_reads_results_held_already(client):
    da = pytest.importorskip("dask.array")
    x = da.arange(100, chunks=10)
    assert client.normalize_collection(x) is x                  # nothing held: the same collection
    y = x.persist()
    wait(y)
    normalized = client.normalize_collection(x)
    held = set(futures_of(normalized))
    assert len(held) == 10 and {f.key for f in held} == {f.key for f in futures_of(y)}
    assert normalized.sum().compute() == sum(range(100))


def test_recreate_task_and_error_locally(client):
    x0 = client.submit(inc, 0)
    total = client.submit(ratio, 4, x0)
    assert client.recreate_task_locally(total) == 4.0           # finished: run here again all the same
    with pytest.raises(ValueError, match="No errored futures passed"):
        client.recreate_error_locally(total)
    zero = client.submit(int, 0)
    origin = client.submit(ratio, 1, zero)
    failed = client.submit(inc, origin)                         # fails through its input
    wait([failed])
    with pytest.raises(ZeroDivisionError):
        client.recreate_error_locally([failed])


# -- 9. Client.current per thread ---------------------------------------------------------------------------------
def test_current_client_follows_with_blocks_and_as_current_per_thread(cluster):
    with Client(cluster) as outer:
        assert Client.current(allow_global=False) is outer
        with Client(cluster) as inner:
            assert Client.current() is inner
        assert Client.current(allow_global=False) is outer
    with pytest.raises(ValueError, match="as_current"):
        Client.current(allow_global=False)

    both_inside = threading.Barrier(2, timeout=30)
    seen: dict = {}

    def run(name):
        with Client(cluster, set_as_default=False) as c, c.as_current():
            both_inside.wait()
            seen[name] = (c, Client.current(allow_global=False), dask.base.get_scheduler() == c.get)
            both_inside.wait()
    threads = [threading.Thread(target=run, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(mine is current and same_get for mine, current, same_get in seen.values()) and len(seen) == 2


def test_leaving_a_client_from_another_thread_warns(cluster):
    c = Client(cluster)
    with cf.ThreadPoolExecutor(1) as one, cf.ThreadPoolExecutor(1) as other:
        one.submit(c.__enter__).result()
        with pytest.warns(DeprecationWarning, match="different threads"):
            other.submit(c.__exit__, None, None, None).result()
    assert c.status == "closed"


def test_an_asynchronous_client_is_made_in_async_code():
    with pytest.raises(RuntimeError, match="without a running loop"):
        Client(asynchronous=True)


# -- 10. get() when a task fails; dependents of a cancelled future --------------------------------------------
def test_get_returns_at_the_first_error_and_releases_the_rest(client, tmp_path):
    gate = str(tmp_path / "gate")
    kept = client.submit(inc, 41)
    kept.result()
    with pytest.raises(ZeroDivisionError):
        client.get({"bad": (ratio, 1, 0), "held": (wait_for_file, gate, 60), kept.key: (inc, 41)},
                   ["bad", "held", kept.key])
    assert set(client.futures) == {kept.key}                     # the user's own future stays
    wait_until(lambda: not any(client.processing().values()), 10, "the call's work forgotten")
    (tmp_path / "gate").touch()
    assert kept.result() == 42


def test_dependents_of_a_cancelled_future_are_cancelled(client, tmp_path):
    x = client.submit(wait_for_file, str(tmp_path / "gate"), 60, pure=False)
    y = client.submit(inc, x)
    z = client.submit(inc, y)
    client.cancel([y])
    wait_until(z.cancelled, 10, "z cancelled with its input")
    assert z.status == "cancelled"
    (tmp_path / "gate").touch()
    assert x.result() == str(tmp_path / "gate")


# -- 11. the executor's keywords ---------------------------------------------------------------------------------
def test_executor_keywords_retries_and_unsupported_ones(client, tmp_path):
    with pytest.raises(TypeError, match=r"unsupported arguments to ClientExecutor: \['bar', 'foo'\]"):
        client.get_executor(workers=None, foo=1, bar=2)
    with client.get_executor(retries=2, pure=False) as e:
        assert e.submit(fails_until_attempt, str(tmp_path / "three"), 3, pure=False).result() == 3
    with client.get_executor(retries=1) as e:
        with pytest.raises(ZeroDivisionError, match="run 2"):
            e.submit(fails_until_attempt, str(tmp_path / "never"), 3).result()


# -- 12. short tracebacks -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["result", "gather"])
def test_a_tasks_error_shows_only_the_callers_and_the_tasks_frames(client, how):
    future = client.submit(ratio, 1, 0)
    with pytest.raises(ZeroDivisionError) as e:
        future.result() if how == "result" else client.gather([future])
    frames = [f.f_code.co_name for f, _ in traceback.walk_tb(e.value.__traceback__)]
    assert len(frames) < 4 and frames[-1] == "ratio", frames


# -- 13. scatter of a collection that holds futures ------------------------------------------------------------------
def test_scatter_of_a_persisted_dataframe(client):
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    df = pd.DataFrame({"x": [1, 2, 3]})
    persisted = dd.from_pandas(df, npartitions=2).persist()    # held: its futures are the data
    future = client.scatter(persisted)       # the worker measured it with .nbytes, which refused
    assert future.type == dd.DataFrame
    assert future.result().compute().equals(df)



def direct_of_the_tasks_client():
    from hpc_cluster import get_client
    return get_client().direct_to_workers


def test_a_tasks_client_says_it_talks_to_workers_directly(client):
    assert not client.direct_to_workers
    assert client.submit(direct_of_the_tasks_client).result() is True
