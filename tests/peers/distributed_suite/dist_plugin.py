"""The inner runs' pytest plugin: distributed's fixtures for its synchronous tests, made of ours.

distributed's conftest makes every fixture of distributed.utils_test available; so does this
plugin, then replaces those that start a cluster or a client (`cluster_fixture`, `s`, `a`,
`b`, `client`, `c`, `client_no_amm`) with ones on an hpc_cluster LocalCluster
(distributed_switched.utils_test.cluster; one per module, or per test: FRESH), and `loop`/`cleanup` with ones that do not check for
distributed's own threads. Its async tests (gen_cluster, gen_test: they drive distributed's
Scheduler and Worker objects in this process) are deselected: out of scope (issue 31, point 10).
"""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest
from distributed.utils_test import *  # noqa: F401,F403  (its fixtures, as distributed's conftest has them)

from distributed_switched.utils_test import cluster
from hpc_cluster import Client


def _is_async(item) -> bool:
    func = getattr(item, "obj", None)
    while func is not None:
        if inspect.iscoroutinefunction(func):
            return True
        func = getattr(func, "__wrapped__", None)
    return False


# Synchronous tests that start distributed's own Worker or Nanny objects against the scheduler
# (out of scope as the gen_cluster tests are: they cannot join ours, and wait for them until
# their timeout).
STARTS_DISTRIBUTEDS_WORKERS = ("test_open_close_many_workers",)


# Tests whose outcome on our cluster depends on where or how fast things ran, not on the API:
# run, they would pass on one machine and fail on the next (docs/migrating-from-distributed.md).
VARIES = {
    # `varying` counts its calls per worker process: it expects distributed's placement of
    # each retry on the same worker; ours may start a retry on the other one.
    "test_retries": "placement of retries",
    # 0.5 s for the first task of a fresh worker process, which imports distributed.utils_test
    # for `inc` (0.8 s here, less on a faster machine).
    "test_as_completed_timeout_sync": "a 0.5 s timeout on a worker's first import",
}


def _out_of_scope(item) -> bool:
    name = item.name.split("[", 1)[0]
    return _is_async(item) or name in STARTS_DISTRIBUTEDS_WORKERS or name in VARIES


def pytest_collection_modifyitems(config, items):
    dropped = [item for item in items if _out_of_scope(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not _out_of_scope(item)]


@pytest.fixture
def cleanup():
    yield


@pytest.fixture
def loop_in_thread():
    """A tornado IOLoop running in its own thread, as distributed's fixture gives (its checks of
    distributed's own threads and config left out)."""
    from tornado.ioloop import IOLoop

    started = threading.Event()
    box = {}

    def run():
        asyncio.set_event_loop(asyncio.new_event_loop())
        box["loop"] = IOLoop.current()
        started.set()
        box["loop"].start()

    thread = threading.Thread(target=run, daemon=True, name="test IOLoop")
    thread.start()
    started.wait(10)
    yield box["loop"]
    box["loop"].add_callback(box["loop"].stop)
    thread.join(10)


@pytest.fixture
def loop(loop_in_thread):
    return loop_in_thread


# Modules whose tests leave names behind on the scheduler (datasets, variables, queues, locks:
# `Variable("x")` in one test is the next one's too): a cluster per test, as distributed's
# fixture gives. The rest share one per module: each test still has its own Client (its own
# futures), and a cluster per test took most of the run (11 minutes, against 1.5).
FRESH = ("test_publish", "test_variable", "test_queues", "test_locks", "test_semaphore", "test_multi_locks",
         "test_events")


@pytest.fixture(scope="module")
def _module_cluster():
    with cluster() as (scheduler, workers):
        yield scheduler, workers


@pytest.fixture
def cluster_fixture(request):
    if request.module.__name__.rsplit(".", 1)[-1] in FRESH:
        with cluster() as (scheduler, workers):
            yield scheduler, workers
    else:
        yield request.getfixturevalue("_module_cluster")


@pytest.fixture
def s(cluster_fixture):
    return cluster_fixture[0]


@pytest.fixture
def a(cluster_fixture):
    return cluster_fixture[1][0]


@pytest.fixture
def b(cluster_fixture):
    return cluster_fixture[1][1]


@pytest.fixture
def client(cluster_fixture):
    with Client(cluster_fixture[0]["address"]) as c:
        yield c


@pytest.fixture
def c(client):
    return client


@pytest.fixture
def client_no_amm(client):
    return client
