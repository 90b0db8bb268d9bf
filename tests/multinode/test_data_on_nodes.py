"""Data that lives on nodes (issue 33, point 4): dask dataframe and bag shuffles, files in a
worker's local directory and spilled results, with workers on several nodes, each node with a
/tmp of its own. Dataframe shuffles that silently lost rows across nodes were once found only
by simulating node-local disks; here the disks are node-local for real.

Every result is compared with pandas (or plain Python) computed here, row for row. dask's
'disk' shuffle (partd files in each worker's /tmp) and its 'p2p' shuffle (distributed's worker
extension) cannot run on our workers: both are refused before anything runs, saying what to use.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid

import dask
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from hpc_cluster import Client, get_worker
from hpc_cluster.client.graph import UnsupportedGraph
from hpc_cluster.deploy.cluster import SLURMCluster
from helpers import multinode as MN
from helpers.wait import wait_until

pytestmark = pytest.mark.timeout(600)

N_WORKERS = 5
# Room for what the earlier tests leave in a worker (pandas, pyarrow, the shuffles: ~340 MiB
# unmanaged) and the spill test's 10 results, below the pause fraction (80%): at 500 MB the
# chosen worker paused after two of them and the others, loosely pinned, ran elsewhere.
WORKER_MEMORY = "800MB"
# Results above this fraction of a worker's memory (80 MB) go to its disk: the spill test's
# worker spills to its node's /tmp.
TARGET_FRACTION = 0.1
JOB_NAME = "mn-data-worker"      # our jobs, told apart from other clusters' on a node we kill


@pytest.fixture(scope="module")
def data_cluster():
    # A node another test killed comes back within a minute or two (node_down gives it back).
    wait_until(lambda: len(nodes_in_service()) >= 3, 180, "3 nodes in service", interval=1)
    base = MN.SHARED / "tests" / f"data-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(base / "xdg"))
        mp.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(base / "etc"))
        with SLURMCluster(cores=1, memory=WORKER_MEMORY, walltime="00:15:00", name="mn-data", job_name=JOB_NAME,
                          log_directory=str(base / "logs"), memory_target_fraction=TARGET_FRACTION) as cluster:
            cluster.scale(N_WORKERS)
            with Client(cluster) as client:
                client.wait_for_workers(N_WORKERS, timeout=180)
                hosts = client.run(socket.gethostname)
                assert len(set(hosts.values())) >= 3, hosts          # CR_LLN spreads the jobs
                assert set(hosts.values()) <= set(MN.NODES), hosts
                yield cluster, client


def nodes_in_service() -> list[str]:
    return [n for n in MN.NODES if MN.node_state(n).startswith(("idle", "mixed", "allocated"))]


def hosts_of(client) -> dict[str, str]:
    return client.run(socket.gethostname)


def private(directory) -> bool:
    """Readable by its owner alone."""
    return os.stat(directory).st_mode & 0o077 == 0


def frame(rows: int, keys: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": rng.integers(0, keys, rows), "v": np.arange(rows, dtype="int64") + seed * rows,
                         "x": rng.random(rows), "s": rng.choice(["a", "bb", "ccc", "dddd"], rows)})


def with_host(part: pd.DataFrame) -> pd.DataFrame:
    """Each input partition marks the node it was made on (the shuffle must bring them together)."""
    return part.assign(host=socket.gethostname())


def spread_frame(pdf: pd.DataFrame, npartitions: int):
    meta = pdf.iloc[:0].assign(host=pd.Series([], dtype=object))
    return dd.from_pandas(pdf, npartitions=npartitions).map_partitions(with_host, meta=meta)


def rows(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Rows in one order, with a fresh index, strings as objects with None for missing (dask
    keeps them as pyarrow strings, NA for missing; pandas as its own, NaN): two frames with the
    same rows compare equal."""
    df = df.assign(**{c: df[c].astype(object).where(df[c].notna(), None)
                      for c in df.columns if pd.api.types.is_string_dtype(df[c])})
    return df.sort_values(by, kind="mergesort").reset_index(drop=True)


def assert_from_nodes(hosts: pd.Series, at_least: int = 3) -> None:
    """The rows came from input partitions made on >= `at_least` nodes: the shuffle crossed them."""
    made_on = set(hosts.astype(str))
    assert made_on <= set(MN.NODES) and len(made_on) >= at_least, made_on


# -- dataframe shuffles -------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["tasks", None])          # None: what the Client makes dask choose
def test_set_index_on_many_partitions_keeps_every_row(data_cluster, method):
    cluster, client = data_cluster
    pdf = frame(60_000, 5_000, seed=1)
    df = spread_frame(pdf, 48)
    got = df.set_index("k", **({"shuffle_method": method} if method else {})).compute()
    assert len(got) == len(pdf)
    assert got.index.is_monotonic_increasing                  # sorted across the output partitions
    assert_from_nodes(got["host"])
    pd.testing.assert_frame_equal(rows(got.drop(columns="host").reset_index(), ["k", "v"]),
                                  rows(pdf, ["k", "v"]), check_exact=True)


@pytest.mark.parametrize("how", ["inner", "outer"])
def test_a_shuffled_hash_join_matches_pandas(data_cluster, how):
    cluster, client = data_cluster
    left, right = frame(40_000, 8_000, seed=2), frame(15_000, 8_000, seed=3)
    merged = spread_frame(left, 20).merge(spread_frame(right, 9), on="k", how=how,
                                          shuffle_method="tasks", broadcast=False)
    got = merged.compute()
    want = left.merge(right, on="k", how=how)
    assert len(got) == len(want)
    assert_from_nodes(pd.concat([got["host_x"].dropna(), got["host_y"].dropna()]))
    got = got.drop(columns=["host_x", "host_y"])
    pd.testing.assert_frame_equal(rows(got, ["k", "v_x", "v_y"]), rows(want, ["k", "v_x", "v_y"]),
                                  check_exact=True, check_dtype=False)


def test_groupby_with_split_out_matches_pandas(data_cluster):
    cluster, client = data_cluster
    pdf = frame(80_000, 20_000, seed=4)
    agg = {"v": ["sum", "count"], "x": ["min", "max"]}
    grouped = spread_frame(pdf, 32).groupby("k").agg(agg, split_out=4, shuffle_method="tasks")
    assert grouped.npartitions == 4
    got = grouped.compute().sort_index()
    want = pdf.groupby("k").agg(agg).sort_index()
    assert len(got) == len(want) == pdf["k"].nunique()
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    # The rows of one key, brought from every node, in one partition: the shuffle's count.
    assert got[("v", "count")].sum() == len(pdf)


def by_shuffle(method: str, pdf: pd.DataFrame) -> dict:
    df = dd.from_pandas(pdf, npartitions=6)
    return {"set_index": lambda: df.set_index("k", shuffle_method=method),
            "merge": lambda: df.merge(df, on="k", shuffle_method=method, broadcast=False),
            "groupby": lambda: df.groupby("k").agg({"v": "sum"}, split_out=3, shuffle_method=method),
            "shuffle": lambda: df.shuffle("k", shuffle_method=method)}


@pytest.mark.parametrize("method,says", [
    ("disk", r"'disk' shuffle method.*share no filesystem.*shuffle_method='tasks'"),
    ("p2p", r"'p2p' shuffle.*distributed's workers.*shuffle_method='tasks'.*engine='distributed'"),
])
def test_shuffles_our_workers_cannot_run_are_refused_before_anything_runs(data_cluster, method, says):
    cluster, client = data_cluster
    pdf = frame(3_000, 50, seed=5)
    for name, build in by_shuffle(method, pdf).items():
        with pytest.raises(UnsupportedGraph, match=says):
            build().compute()
    if method == "disk":                      # bag's groupby has 'disk' and 'tasks' only
        with pytest.raises(UnsupportedGraph, match=says):
            db.from_sequence(range(100), npartitions=4).groupby(lambda x: x % 3, shuffle="disk").compute()
    # Refused in the client, before anything was sent: the same frame shuffled by tasks runs.
    assert len(by_shuffle("tasks", pdf)["set_index"]().compute()) == len(pdf)


# -- bags -----------------------------------------------------------------------------------------

def test_bag_groupby_and_foldby_match_python(data_cluster):
    cluster, client = data_cluster
    items = [(i * 7919) % 100_003 for i in range(30_000)]
    bag = db.from_sequence(items, npartitions=24)
    groups = dict(bag.groupby(lambda x: x % 97).compute())
    want: dict[int, list] = {}
    for x in items:
        want.setdefault(x % 97, []).append(x)
    assert sorted(groups) == sorted(want)
    assert all(sorted(groups[k]) == sorted(want[k]) for k in want)
    folded = dict(bag.foldby(lambda x: x % 13, lambda acc, x: acc + x, 0, lambda a, b: a + b, 0).compute())
    assert folded == {k: sum(x for x in items if x % 13 == k) for k in range(13)}
    # distinct: a reduction whose pieces each hold part of the set, from every node.
    assert sorted(bag.distinct().compute()) == sorted(set(items))


# -- a worker's local directory -------------------------------------------------------------------

def write_in_local_directory(name: str, text: str) -> tuple[str, str]:
    path = os.path.join(get_worker().local_directory, name)
    with open(path, "w") as f:
        f.write(text)
    return socket.gethostname(), path


def read_in_local_directory(name: str) -> tuple[str, str]:
    with open(os.path.join(get_worker().local_directory, name)) as f:
        return socket.gethostname(), f.read()


def test_a_file_in_the_local_directory_is_read_back_by_a_later_task_on_that_worker(data_cluster):
    cluster, client = data_cluster
    hosts = hosts_of(client)
    name = f"note-{uuid.uuid4().hex[:8]}.txt"
    written = {w: client.submit(write_in_local_directory, name, f"from {w}", workers=[w], pure=False)
               for w in hosts}
    # Bounded: a task pinned to a worker that is gone waits for it (seen once in CI under load).
    written = dict(zip(written, client.gather(list(written.values()), timeout=180)))
    read = {w: client.submit(read_in_local_directory, name, workers=[w], pure=False) for w in hosts}
    read = dict(zip(read, client.gather(list(read.values()), timeout=180)))
    for w, host in hosts.items():
        assert written[w][0] == read[w][0] == host
        assert read[w][1] == f"from {w}"                      # its own file, not another worker's
        path = written[w][1]
        assert path.startswith("/tmp/"), path                 # node-local: on the node's own /tmp
        on_node = MN.STATE / host / "tmp" / os.path.relpath(path, "/tmp")
        assert on_node.read_text() == f"from {w}"
        assert private(on_node.parent)                        # /tmp is every user's on a node
        others = [n for n in MN.NODES if n != host and (MN.STATE / n / "tmp" / os.path.relpath(path, "/tmp")).exists()]
        assert not others, others
        assert not os.path.exists(path)                       # nor in the login node's /tmp


# -- spilled results on a node that dies ----------------------------------------------------------

BLOCK = 1_500_000                 # float64s: 12 MB a result, 10 of them 120 MB > the 80 MB target


def block(i: int) -> np.ndarray:
    return np.random.default_rng(1000 + i).random(BLOCK)


def spill_files(node: str, pid: int) -> list:
    directory = MN.STATE / node / "tmp" / f"hpc-cluster-spill-{node}-{pid}"
    return sorted(directory.iterdir()) if directory.is_dir() else []


def foreign_jobs(node: str) -> int:
    """Jobs of other clusters on `node` (killing it would end theirs too)."""
    out = subprocess.run(["squeue", "-h", "-w", node, "-o", "%j"], capture_output=True, text=True, timeout=60)
    return sum(1 for name in out.stdout.split() if name != JOB_NAME)


def mark_down(node: str) -> None:
    """What slurmctld does SlurmdTimeout (60 s here) after a node stops answering: DOWN, its jobs
    NODE_FAIL (test_node_failures.py waits for slurmctld to do it; this module keeps to its time)."""
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test_data_on_nodes: node killed"],
                   check=True, capture_output=True, timeout=60)


def test_spilled_results_on_a_dead_node_are_recomputed_and_the_node_is_blamed(data_cluster):
    cluster, client = data_cluster
    hosts = hosts_of(client)
    by_node: dict[str, list] = {}
    for w, host in hosts.items():
        by_node.setdefault(host, []).append(w)
    # A node with no other cluster's jobs, and of those one where our worker is alone, if any.
    w = min(hosts, key=lambda a: (foreign_jobs(hosts[a]), len(by_node[hosts[a]]), a))
    node = hosts[w]
    pid = client.run(os.getpid, workers=[w])[w]
    # One at a time: a loose restriction is a preference, and a busy worker's tasks may run on
    # others; each then finds `w` idle. Loose, so that they can be computed again elsewhere.
    futures = []
    for i in range(10):
        futures.append(client.submit(block, i, workers=[w], allow_other_workers=True, pure=False))
        wait_until(lambda: futures[-1].status == "finished", 60, f"block {i}")
    # Most on `w` (a loose restriction is a preference: under load one may run elsewhere, seen in
    # CI); enough there to spill, and every one of them must come back right after the kill.
    held = client.who_has(futures)
    assert sum(1 for addrs in held.values() if w in addrs) >= 6, held
    # Spilled where the worker runs: the node's own /tmp (the host's view of it), not here.
    files = wait_until(lambda: spill_files(node, pid), 60, f"spill files of worker {w} in {node}'s /tmp")
    assert private(files[0].parent)                           # other users' jobs share the node's /tmp
    assert not os.path.exists(f"/tmp/hpc-cluster-spill-{node}-{pid}")
    known = {d["id"] for d in client.deaths()}
    try:
        with MN.node_down(node):
            mark_down(node)
            wait_until(lambda: w not in client.scheduler_info()["workers"], 120, f"the scheduler to lose {w}")
            values = client.gather(futures, timeout=180)
            for i, value in enumerate(values):
                np.testing.assert_array_equal(value, block(i))
            assert not {a for addrs in client.who_has(futures).values() for a in addrs} & {w}
    finally:
        # No nanny survived to remove what the worker left in the node's /tmp.
        for what in ("spill", "worker"):
            shutil.rmtree(MN.STATE / node / "tmp" / f"hpc-cluster-{what}-{node}-{pid}", ignore_errors=True)
    assert MN.node_state(node).startswith(("idle", "mixed", "allocated"))      # node_down waited for it
    deaths = lambda: [d for d in client.deaths() if d["id"] not in known and d["worker"] == w]  # noqa: E731
    try:
        death = wait_until(lambda: next((d for d in deaths() if d.get("final_at") is not None), None), 180,
                           f"{w}'s death to be final")
    except AssertionError as e:
        raise AssertionError(f"{e}; its death so far: {deaths()}") from None
    assert (death["cause"], death["blame"], death["host"]) == ("node-failure", False, node), death
    assert not death["executing"], death               # idle, holding results: nothing to charge
    assert any("NODE_FAIL" in line for line in death["evidence"]), death["evidence"]
    # The cluster is whole again before any test after this one runs on it.
    client.wait_for_workers(N_WORKERS, timeout=180)
