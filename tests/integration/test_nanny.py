"""The nanny's watch over a real worker process: sampling rate, peak RSS, the exit report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from hpc_cluster import Client, LocalCluster
from hpc_cluster.deploy.local.cluster import _child_env
from hpc_cluster.worker.nanny import SAMPLE_INTERVAL, SAMPLE_SECONDS
from helpers.wait import wait_until

MB = 2**20

# A nanny process of its own (as in a job), printing its worker's exit report as JSON.
NANNY = textwrap.dedent("""
    import asyncio, json, sys
    from hpc_cluster.worker.nanny import Nanny
    report = asyncio.run(Nanny(sys.argv[1:]).run_once())
    print(json.dumps(report))
""")


def hold(nbytes, seconds):
    import time
    block = bytearray(nbytes)
    for i in range(0, nbytes, 4096):     # touched pages: real RSS
        block[i] = 1
    time.sleep(seconds)
    return len(block)


def test_the_nanny_samples_at_10_hz_or_more_over_a_workers_life():
    with LocalCluster(n_workers=0) as cluster, Client(cluster) as client:
        nanny = subprocess.Popen([sys.executable, "-c", NANNY, "--scheduler", cluster.scheduler_address,
                                  "--nthreads", "1", "--name", "watched", "--no-nanny"],
                                 env=_child_env(cluster.secret), stdout=subprocess.PIPE)
        try:
            client.wait_for_workers(1, timeout=30)
            pid = next(iter(client.scheduler_info()["workers"].values()))["pid"]
            held = client.submit(hold, 150 * MB, 30, pure=False)     # noqa: F841 (released tasks are cancelled)
            worker = psutil.Process(pid)
            wait_until(lambda: worker.memory_info().rss > 150 * MB, timeout=30, what="the task's 150 MB")
            # The nanny's clock ('started') starts a moment after the process exists (it reads the
            # cgroup first; 0.55 s on a loaded CI box): wait well past the 2.5 s asserted below.
            wait_until(lambda: time.time() - worker.create_time() > 4.0, what="4 s of the worker's life")
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            out, _ = nanny.communicate(timeout=30)
        finally:
            if nanny.poll() is None:
                nanny.kill()
                nanny.wait()
    report = json.loads(out)

    assert report["pid"] == pid and report["signal"] == signal.SIGKILL and report["exit_code"] is None
    samples = report["samples"]
    life = killed_at - report["started"]          # from its start to our SIGKILL
    assert 2.5 <= life < SAMPLE_SECONDS           # so the report's samples (the last 10 s) cover its life
    assert 0 <= report["ended"] - killed_at < 5   # the nanny saw the death
    times = [t for t, _ in samples]
    assert times == sorted(times) and report["started"] <= times[0] and times[-1] <= report["ended"]
    # Where the machine did not run the nanny for more than two slots (a loaded CI box), no
    # sampler could have kept its rate; leave that time out, and say how much it was.
    gaps = [b - a for a, b in zip(times, times[1:])]
    starved = sum(g - SAMPLE_INTERVAL for g in gaps if g > 2 * SAMPLE_INTERVAL)
    watched = life - starved
    assert watched > 1.5, f"the machine starved the nanny for {starved:.2f} s of {life:.2f} s"
    rate = len(samples) / watched
    print(f"nanny: {len(samples)} samples in {life:.3f} s of life ({starved:.3f} s starved) = {rate:.2f} Hz; "
          f"between first and last sample {(len(samples) - 1) / (times[-1] - times[0]):.2f} Hz")
    assert rate >= 10.0, (f"{len(samples)} samples in {life:.2f} s of life ({starved:.2f} s starved): "
                          f"{rate:.2f} Hz; intervals {[round(g, 3) for g in gaps]}")
    # Peak RSS: above what the task held, and the largest sample (the samples cover the whole life).
    assert report["peak_rss"] > 150 * MB
    assert report["peak_rss"] == max(rss for _, rss in samples)
    assert all(rss > 0 for _, rss in samples), [rss for _, rss in samples]
    # Its whole-life timeline (bounded, downsampled keeping maxima) holds the peak too, in time order.
    timeline = report["timeline"]
    assert 0 < len(timeline) <= 720 and [t for t, _ in timeline] == sorted(t for t, _ in timeline)
    assert max(rss for _, rss in timeline) == report["peak_rss"] and timeline[0][0] >= report["started"]


def test_the_process_tree_counts_descendants_found_at_the_last_look():
    from hpc_cluster.worker.nanny import CHILDREN_REFRESH, ProcessTree

    # A parent whose child (a grandchild of this test) holds 120 MB.
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'b = bytearray(120 * 2**20); b[::4096] = b\"\\\\1\" * len(b[::4096]); "
            "import time; time.sleep(60)']); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        ps = psutil.Process(parent.pid)
        wait_until(lambda: ps.children() and ps.children()[0].memory_info().rss > 120 * MB,
                   what="the child to hold its memory")
        tree = ProcessTree(ps)
        own = ps.memory_info().rss
        assert tree.rss(0.0) > own + 120 * MB                  # the first look finds the child
        child = tree.children[0]
        child.kill()                                            # a zombie until its parent reaps it
        wait_until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
                   what="the child to die")
        assert tree.rss(0.5) < own + 20 * MB                    # a gone child is no longer counted
        known = tree.children
        assert known == [child]                                 # ... without looking again yet
        tree.rss(CHILDREN_REFRESH)
        assert tree.children is not known                       # a second later it looks again
        parent.kill()
        parent.wait(10)
        assert tree.rss(CHILDREN_REFRESH * 2) is None           # the process itself is gone
    finally:
        parent.kill()
        parent.wait(10)


def test_a_terminate_fraction_of_false_turns_the_nanny_memory_kill_off():
    # dask's `false` for a memory threshold: the task holds 150 MB in a worker whose budget is
    # 100 MB; with the default fraction the nanny stops it, with False it runs to the end.
    with LocalCluster(n_workers=1, memory_limit="100MB", memory_terminate_fraction=False) as cluster, \
            Client(cluster) as client:
        assert client.submit(hold, 150 * MB, 1.5, pure=False).result(timeout=60) == 150 * MB
        assert client.deaths() == []
    with LocalCluster(n_workers=1, memory_limit="100MB", allowed_failures=0) as cluster, Client(cluster) as client:
        future = client.submit(hold, 150 * MB, 1.5, pure=False)
        wait_until(lambda: future.done(), 60, "the nanny to stop the worker")
        assert [d["cause"] for d in client.deaths()] == ["memory-nanny"]
