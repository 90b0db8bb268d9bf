"""dask collections on the cluster, unchanged: the Client is dask's default scheduler, shuffles
move data through the workers (each worker here has a private /tmp, as separate nodes do),
futures and scattered data inside graphs resolve, annotations are honoured or refused,
compute/persist keep data on the workers, and tasks can submit tasks (worker_client).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import dask
import dask.array as da
import dask.bag as db
import numpy as np
import pandas as pd
import pytest

from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client, LocalCluster, futures_of, get_client, progress, wait, worker_client  # noqa: E402
from hpc_cluster.client.graph import UnsupportedGraph  # noqa: E402

dd = pytest.importorskip("dask.dataframe")


def private_tmp_possible() -> bool:
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /tmp"], capture_output=True)
    return probe.returncode == 0


# Mounted again inside a worker's private /tmp when they live under /tmp (a clone in /tmp,
# as CI may make, with its .venv): the worker must still find Python and this package.
_PRIVATE_TMP = """set -e
stage=$(mktemp -d /var/tmp/hpc-cluster-stage-XXXXXX)
mount --bind /tmp "$stage"
mount -t tmpfs tmpfs /tmp
for rel in $KEEP_UNDER_TMP; do mkdir -p "/tmp/$rel"; mount --bind "$stage/$rel" "/tmp/$rel"; done
umount "$stage"; rmdir "$stage"
exec "$@"
"""


def _kept_under_tmp() -> str:
    from hpc_cluster.deploy.local import cluster as local
    keep = set()
    for p in (local._PACKAGE_PARENT, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
        rel = os.path.relpath(os.path.realpath(p), "/tmp")
        if not rel.startswith(".."):
            keep.add(rel.split(os.sep)[0])          # the top directory under /tmp is enough
    return " ".join(sorted(keep))


class PrivateTmpCluster(LocalCluster):
    """Each worker (with its nanny) in its own mount namespace with its own empty /tmp: what
    one worker writes to /tmp the others cannot see, as on separate compute nodes."""

    def _worker_command(self, name: str) -> list[str]:
        return ["env", f"KEEP_UNDER_TMP={_kept_under_tmp()}", "unshare", "--mount", "--propagation", "private",
                "sh", "-c", _PRIVATE_TMP, "--", *super()._worker_command(name)]


@pytest.fixture(scope="module")
def cluster():
    if not private_tmp_possible():
        pytest.skip("needs root for a private /tmp per worker (unshare --mount): CI runs as root")
    with PrivateTmpCluster(n_workers=2, threads_per_worker=1, memory_limit="2GB") as c:
        yield c


# `client`: tests/conftest.py's, on this module's cluster.
@pytest.fixture
def shared(tmp_path_factory):
    """A directory every process sees: not under /tmp, which each worker has its own of."""
    import shutil
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="hpc-cluster-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def process_id() -> int:
    return os.getpid()


# -- 0: no wrong results -------------------------------------------------------------------

def _write_and_list(name):
    time.sleep(0.05)
    Path("/tmp", name).write_text("x")
    return os.getpid(), {n for n in os.listdir("/tmp") if n.startswith("mark-")}


def test_the_workers_really_share_no_tmp(client):
    seen: dict[int, set] = {}
    for pid, names in client.gather([client.submit(_write_and_list, f"mark-{i}", pure=False) for i in range(12)]):
        seen.setdefault(pid, set()).update(names)
    assert len(seen) == 2, seen                              # both workers wrote
    a, b = seen.values()
    assert a and b and not a & b                             # neither sees the other's files
    assert not list(Path("/tmp").glob("mark-*"))             # nor does this machine's /tmp


def test_shuffles_move_data_through_the_workers_and_lose_nothing(client):
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"k": rng.integers(0, 50, 20_000), "v": np.arange(20_000)})
    df = dd.from_pandas(pdf, npartitions=10)
    assert dask.config.get("dataframe.shuffle.method") == "tasks"
    assert len(df.set_index("k").compute()) == 20_000
    merged = df.merge(df, on="v").compute()
    assert len(merged) == 20_000 and (merged["k_x"] == merged["k_y"]).all()
    assert df.shuffle("k").compute()["v"].sum() == pdf["v"].sum()
    groups = dict(db.from_sequence(range(2000), npartitions=10).groupby(lambda x: x % 2).compute())
    assert sorted(len(v) for v in groups.values()) == [1000, 1000]
    means = df.groupby("k")["v"].mean().compute().sort_index()
    pd.testing.assert_series_equal(means, pdf.groupby("k")["v"].mean().sort_index())


def test_a_graph_built_for_a_disk_shuffle_is_refused_not_run(client):
    df = dd.from_pandas(pd.DataFrame({"k": np.arange(1000) % 7, "v": np.arange(1000)}), npartitions=5)
    with dask.config.set({"dataframe.shuffle.method": "disk"}):
        shuffled = df.shuffle("k")
        groups = db.from_sequence(range(100), npartitions=4).groupby(lambda x: x % 3)
    for collection in (shuffled, groups):
        with pytest.raises(UnsupportedGraph, match="dask's 'disk' shuffle method.*shuffle.method': 'tasks'"):
            collection.compute()


def test_a_graph_built_for_a_p2p_shuffle_is_refused_not_run(client):
    # Run, its tasks failed mid-way with "P2P ... failed during transfer phase".
    df = dd.from_pandas(pd.DataFrame({"k": np.arange(1000) % 7, "v": np.arange(1000)}), npartitions=5)
    with dask.config.set({"array.rechunk.method": "p2p"}):
        rechunked = da.ones((100, 100), chunks=(10, 100)).rechunk((100, 10))
    for collection in (df.shuffle("k", shuffle_method="p2p"), df.merge(df, on="k", shuffle_method="p2p"),
                       rechunked):
        with pytest.raises(UnsupportedGraph, match="dask's 'p2p' shuffle.*shuffle_method='tasks'"):
            collection.compute()


@pytest.mark.parametrize("run", range(10))
def test_futures_and_scattered_data_inside_graphs_always_resolve(client, run):
    fut = client.submit(lambda x: x * 10, run, pure=False)
    scattered = client.scatter(np.arange(100) + run)
    total = dask.delayed(lambda a, b: a + int(b.sum()))(fut, scattered)
    assert total.compute() == run * 10 + 4950 + 100 * run
    arr = da.from_delayed(dask.delayed(lambda x: np.full(5, x))(fut), shape=(5,), dtype=int)
    assert arr.sum().compute() == 50 * run


def flaky(path):
    n = int(Path(path).read_text()) if Path(path).exists() else 0
    Path(path).write_text(str(n + 1))
    if n < 2:
        raise RuntimeError(f"attempt {n + 1} fails")
    return n + 1


def test_retries_from_compute_and_from_dask_annotate_are_honoured(client, shared):
    count = str(shared / "count")
    assert dask.delayed(flaky)(count).compute(retries=2) == 3
    count2 = str(shared / "count2")
    with dask.annotate(retries=2):
        assert dask.compute(dask.delayed(flaky)(count2))[0] == 3
    count3 = str(shared / "count3")
    with pytest.raises(RuntimeError, match="attempt 1 fails"):
        dask.delayed(flaky)(count3).compute()


def test_resources_annotation_is_honoured_and_workers_too(client, caplog):
    with dask.annotate(resources={"GPU": 1}):
        future = client.compute(dask.delayed(process_id)())
    time.sleep(1.0)
    assert future.status == "pending"                       # no worker has a GPU: it waits
    future.cancel()
    # workers= runs it there (tests/integration/test_placement_keywords.py: the rest of it)
    address, row = next(iter(client.scheduler_info()["workers"].items()))
    assert dask.delayed(process_id)().compute(workers=[address]) == row["pid"]
    with pytest.warns(UserWarning, match=r"num_workers.*only mean something to dask's local schedulers"):
        assert dask.delayed(process_id)().compute(num_workers=4) != os.getpid()
    # x.compute(...) hands every keyword to the scheduler: one it does not know is ignored (as
    # dask's schedulers and distributed's do) and logged; our own compute() refuses it.
    with caplog.at_level(logging.WARNING, logger="hpc_cluster.client"):
        assert dask.delayed(process_id)().compute(bogus=1) != os.getpid()
    assert "ignored keyword arguments ['bogus']" in caplog.text
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['bogus'\\]"):
        client.compute(dask.delayed(process_id)(), bogus=1)


# -- 1: the default scheduler ----------------------------------------------------------------

def test_the_client_is_dasks_default_and_closing_restores_what_was(cluster):
    task = dask.delayed(process_id)()
    assert task.compute() == os.getpid()                     # no client: dask's local threads
    with Client(cluster) as first:
        assert task.compute() != os.getpid()                 # on a worker
        assert dask.compute(task)[0] != os.getpid()
        assert task.compute(scheduler="threads") == os.getpid()     # an explicit choice stands
        assert task.compute(scheduler=first) != os.getpid()
        with Client(cluster, set_as_default=False) as other:
            assert get_client() is first
            with other.as_current():
                assert get_client() is other
            assert get_client() is first
        with Client(cluster) as second:
            assert get_client() is second
        assert get_client() is first                        # closing the second gives back the first
    assert task.compute() == os.getpid()
    assert dask.config.get("scheduler", None) is None and dask.config.get("dataframe.shuffle.method", None) is None
    assert dask.config.get("array.rechunk.threshold") == 4                  # dask's own default again


def fib(n):
    if n < 2:
        return n
    with worker_client() as c:
        return sum(c.gather([c.submit(fib, n - 1), c.submit(fib, n - 2)]))


def fib_plain(n):          # no worker_client: waiting for its own cluster frees the slot anyway
    if n < 2:
        return n
    c = get_client()
    return c.submit(fib_plain, n - 1).result() + c.submit(fib_plain, n - 2).result()


def _rechunk_steps(y) -> int:
    """How many rechunk steps dask planned: one 'rechunk-merge' name per step."""
    return len({k[0] for k in dict(y.__dask_graph__()) if isinstance(k, tuple) and k[0].startswith("rechunk-merge")})


def test_a_rechunk_that_dask_would_do_in_steps_is_one_step_of_tasks(cluster, client):
    # Rows -> columns of an 11 x 11 block array: dask's default threshold (4) plans it in
    # steps, each copying all the data again; with the Client as dask's default it is one
    # step of tasks (as distributed's P2P is one exchange), and the values are the same.
    x = da.random.random((1100, 1100), chunks=(100, 1100))
    with dask.config.set(scheduler="sync", **{"array.rechunk.threshold": 4}):
        planned_by_dask = _rechunk_steps(x.rechunk((1100, 100), method="tasks"))
    y = x.rechunk((1100, 100), method="tasks")
    assert planned_by_dask > 1 and _rechunk_steps(y) == 1
    assert np.array_equal(y.compute(), x.compute())
    with dask.config.set({"array.rechunk.threshold": 2}):                   # a value the user chose stands
        with Client(cluster) as other, other.as_current():
            assert dask.config.get("array.rechunk.threshold") == 2


def test_tasks_that_wait_on_their_own_subtasks_do_not_deadlock_one_thread(cluster):
    with LocalCluster(n_workers=1, threads_per_worker=1) as one, Client(one) as c:
        assert c.submit(fib, 7).result(timeout=120) == 13
        assert c.submit(fib_plain, 7).result(timeout=120) == 13
        assert c.deaths() == []


# -- 2: compute and persist --------------------------------------------------------------------

def test_compute_returns_futures_and_persist_keeps_the_data_on_the_workers(client, shared):
    x = da.random.random((400, 400), chunks=100)
    f = client.compute(x.sum())
    assert f.result() == pytest.approx(float(x.sum().compute(scheduler="sync")))
    a, b = client.compute([x.mean(), x.max()], sync=True)
    assert 0 < a < b <= 1
    assert client.compute(7) == 7                             # not a collection: passes through

    marks = shared / "marks"
    marks.mkdir()

    def load(i):
        (marks / f"{i}-{time.time_ns()}").write_text("")
        return np.full(10, i)
    parts = [da.from_delayed(dask.delayed(load)(i), shape=(10,), dtype=int) for i in range(6)]
    y = da.concatenate(parts)
    yp = client.persist(y)
    futures = futures_of(yp)
    assert len(futures) == 6
    wait(yp)
    assert all(f.status == "finished" for f in futures)
    progress(yp, file=open(os.devnull, "w"))
    who = client._lt.run(client._request({"op": "who-has", "keys": [f.key for f in futures]}))
    assert all(who[f.key] for f in futures)                  # held by workers, not the client
    assert int((yp * 2).sum().compute()) == 2 * sum(range(6)) * 10
    assert len(list(marks.iterdir())) == 6                   # reused, not loaded again
    (zp,) = dask.persist(y * 3)                              # dask.persist with the default client
    assert futures_of(zp) and int(zp.sum().compute()) == 3 * sum(range(6)) * 10


def test_xarray_computes_loads_and_persists_on_the_workers(client):
    xr = pytest.importorskip("xarray")
    arr = xr.DataArray(da.from_delayed(dask.delayed(lambda: np.full((4, 4), os.getpid()))(), (4, 4), dtype=int),
                       dims=("x", "y"))
    assert int(arr.compute()[0, 0]) != os.getpid()
    assert int(arr.load()[0, 0]) != os.getpid()
    persisted = xr.DataArray(da.ones((8, 8), chunks=4), dims=("x", "y")).persist()
    assert futures_of(persisted.data) and float(persisted.sum().compute()) == 64.0
