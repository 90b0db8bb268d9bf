"""Looking inside a running cluster with distributed's calls (issue 31, point 7): who holds and
runs what, task streams, performance reports, logs, events, a task's print and warn, forwarded
loggers, metadata, rebalance. Real LocalClusters; every wait is on a condition."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest

import hpc_cluster
from hpc_cluster import Client, LocalCluster, get_task_stream, performance_report, wait
from helpers.funcs import inc, slow_inc
from helpers.wait import wait_for_file, wait_until
from helpers.pages import ReportPage


def printing_task(x):
    hpc_cluster.print("printed by task", x, sep="|")
    hpc_cluster.print("to stderr", x, file=sys.stderr)
    return x


def quick_printing_task(x):
    hpc_cluster.print("quick", x)


def warning_task(x):
    hpc_cluster.warn(f"careful with {x}", RuntimeWarning)
    return x


def logging_task(x, gate=None):
    if gate:
        wait_for_file(gate)
    logging.getLogger("looking.inside").warning("logged by task %s", x)
    return x


def test_who_has_what_and_how_many_threads(client):
    futures = client.map(inc, range(6), pure=False)
    wait(futures)
    threads = client.nthreads()
    assert len(threads) == 2 and set(threads.values()) == {2}
    assert client.ncores() == threads
    some = next(iter(threads))
    assert client.nthreads(workers=[some]) == {some: 2} and client.nthreads(some) == {some: 2}
    who = client.who_has(futures)
    assert set(who) == {f.key for f in futures} and all(len(h) == 1 and h[0] in threads for h in who.values())
    assert set(who) <= set(client.who_has())                # every task the scheduler knows
    has = client.has_what()
    assert set(has) == set(threads)
    assert {k for keys in has.values() for k in keys} >= set(who)
    for key, (holder,) in who.items():
        assert key in has[holder]
    assert client.has_what(workers=["tcp://nowhere:1"]) == {"tcp://nowhere:1": []}


def test_processing_shows_what_runs_where(client, tmp_path):
    gate = tmp_path / "gate"
    fut = client.submit(wait_for_file, str(gate), 60, pure=False)
    running = wait_until(lambda: {a: ks for a, ks in client.processing().items() if fut.key in ks},
                         what="the task to be processing on a worker")
    (address,) = running
    assert client.processing(workers=[address])[address] == [fut.key]
    gate.touch()
    fut.result()
    wait_until(lambda: not any(fut.key in ks for ks in client.processing().values()), what="processing to empty")


def test_get_task_stream_as_a_method_and_as_a_context_manager(client):
    with get_task_stream(client=client) as ts:
        futures = client.map(slow_inc, range(4), delay=0.05, pure=False)
        wait(futures)
    assert {r["key"] for r in ts.data} == {f.key for f in futures}
    workers = set(client.nthreads())
    for r in ts.data:
        (span,) = r["startstops"]
        assert r["worker"] in workers and r["status"] == "OK" and span["action"] == "compute"
        assert span["stop"] - span["start"] >= 0.04           # each slept 0.05 s on its worker
    latest = client.get_task_stream(count=2)
    assert len(latest) == 2 and latest[-1]["key"] in {f.key for f in futures}
    assert {r["key"] for r in client.get_task_stream(start="60s")} >= {f.key for f in futures}


def test_get_task_stream_saves_a_figure(client, tmp_path):
    with get_task_stream(client=client, plot="save", filename=str(tmp_path / "ts.html")) as ts:
        wait(client.map(inc, range(3), pure=False))
    assert len(ts.data) == 3 and ts.figure is not None
    assert ReportPage((tmp_path / "ts.html").read_text()).tags.count("rect") == 3


def test_performance_report_writes_one_self_contained_file(client, tmp_path):
    path = tmp_path / "report.html"
    with performance_report(filename=str(path)):
        wait(client.map(slow_inc, range(4), delay=0.02, pure=False) + client.map(inc, range(3), pure=False))
    text = path.read_text()
    page = ReportPage(text)
    assert not page.fetches and "script" not in page.tags
    assert page.tags.count("rect") == 7
    assert "slow_inc" in text and ">inc<" in text
    assert all(address in text for address in client.nthreads())
    assert "test_looking_inside.py" in text                   # the code that ran


def test_scheduler_and_worker_logs(client, cluster):
    lines = client.get_scheduler_logs()
    assert lines and all(len(x) == 2 for x in lines)
    assert any("registered" in line for _, line in lines)
    assert len(client.get_scheduler_logs(n=1)) == 1
    some = next(iter(client.nthreads()))
    logs = client.get_worker_logs(workers=[some])
    assert list(logs) == [some] and any("connected to" in line for line in logs[some])
    assert len(client.get_worker_logs(n=1, workers=some)[some]) == 1
    cluster_logs = cluster.get_logs()
    assert {"Cluster", "Scheduler"} <= set(cluster_logs) and set(client.nthreads()) <= set(cluster_logs)
    assert "registered" in cluster_logs["Scheduler"]
    assert set(cluster.get_logs(cluster=False, scheduler=False, workers=[some])) == {some}


def test_profile_says_it_is_not_available_and_why(client):
    with pytest.raises(NotImplementedError, match="do not sample"):
        client.profile()


def test_events_are_kept_and_reach_subscribers(client, cluster):
    heard = []
    with Client(cluster, set_as_default=False) as other:
        other.subscribe_topic("looking-topic", heard.append)
        other.get_events("looking-topic")              # the subscription is in before the event below
        client.log_event("looking-topic", {"n": 1})
        client.log_event(["looking-topic", "looking-other"], "both")
        wait_until(lambda: len(heard) == 2, what="the subscriber to hear both events")
        assert [m for _, m in heard] == [{"n": 1}, "both"]
        other.unsubscribe_topic("looking-topic")
    events = client.get_events("looking-topic")
    assert [m for _, m in events] == [{"n": 1}, "both"] and all(isinstance(t, float) for t, _ in events)
    assert "looking-other" in client.get_events()
    with pytest.raises(TypeError, match="msgpack serializable"):
        client.log_event("looking-topic", object())


def test_a_tasks_print_and_warn_reach_the_client(client, capsys):
    fut = client.submit(printing_task, 7, pure=False)
    wait(fut)                                   # done, and its print already here: it came first
    out, err = capsys.readouterr()
    assert fut.result() == 7
    assert "printed by task|7\n" in out and "to stderr 7\n" in err
    assert any(m["args"] == ["printed by task", "7"] for _, m in client.get_events("print"))
    with pytest.warns(RuntimeWarning, match="careful with 3"):
        client.submit(warning_task, 3, pure=False).result()



def test_a_quick_tasks_print_comes_before_its_result_also_when_run_on_the_workers_loop(client, capsys):
    # After a few quick runs a worker runs such a function on its event loop (worker/inline.py):
    # its event must still go ahead of its result there.
    # wait(), not result(): fetching the result would give a late event time to arrive.
    for i in range(20):
        wait(client.submit(quick_printing_task, i, pure=False))
        assert f"quick {i}\n" in capsys.readouterr().out


def test_print_and_warn_outside_a_task_are_the_builtins(capsys):
    hpc_cluster.print("plain", 1)
    assert capsys.readouterr().out == "plain 1\n"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        hpc_cluster.warn("plain warning")
    assert [str(w.message) for w in seen] == ["plain warning"]


def test_metadata(client):
    client.set_metadata("looking-x", 123)
    client.set_metadata(["looking-y", "a", "b"], [1, 2])
    assert client.get_metadata("looking-x") == 123
    assert client.get_metadata(["looking-y", "a"]) == {"b": [1, 2]}
    assert client.get_metadata("looking-missing", default=None) is None
    with pytest.raises(KeyError):
        client.get_metadata("looking-missing")
    with pytest.raises(TypeError, match="msgpack serializable"):
        client.set_metadata("looking-bad", object())


def test_forward_logging_from_workers_now_and_joining_later(tmp_path, caplog):
    gate = tmp_path / "gate"
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        caplog.set_level(logging.WARNING, logger="looking.inside")
        client.forward_logging("looking.inside")
        assert client.submit(logging_task, "first", pure=False).result() == "first"
        wait_until(lambda: any(r.getMessage() == "logged by task first" for r in caplog.records),
                   what="the task's log record here")
        (first,) = [r for r in caplog.records if r.getMessage() == "logged by task first"]
        assert first.name == "looking.inside" and first.worker in client.nthreads()
        cluster.scale(2)
        client.wait_for_workers(2, timeout=30)
        # One at a time per worker (one thread each): the two gated tasks run on both workers.
        futures = [client.submit(logging_task, i, str(gate), pure=False) for i in range(2)]
        wait_until(lambda: sum(len(k) for k in client.processing().values()) == 2 and
                   all(client.processing().values()), what="a task on each worker")
        gate.touch()
        wait(futures)
        wait_until(lambda: {r.worker for r in caplog.records if r.getMessage().startswith("logged by task ")}
                   == set(client.nthreads()), what="records from both workers, the new one too")
        client.unforward_logging("looking.inside")


def test_rebalance_evens_out_the_bytes_workers_hold():
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        data = client.scatter([bytes([i]) * 200_000 for i in range(6)])
        cluster.scale(2)
        client.wait_for_workers(2, timeout=30)
        (first,) = {h[0] for h in client.who_has(data).values()}
        client.rebalance(data)
        held = client.has_what()
        assert sorted(len(keys) for keys in held.values()) == [3, 3]
        assert all(len(h) == 1 for h in client.who_has(data).values())        # moved, not copied
        assert [len(set(v)) for v in client.gather(data)] == [1] * 6
        assert client.gather(data)[5] == bytes([5]) * 200_000
        client.rebalance()                                                      # balanced: nothing moves
        assert client.has_what() == held and first in held
