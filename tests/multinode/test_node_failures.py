"""Nodes that die and networks that partition, for real (issue 33, point 3): a compute node's
every process SIGKILLed (SLURM marks it DOWN, its jobs end NODE_FAIL), a node's link down for 30 s
and then back, a node's link down for good, and the login node cut off from every compute node
for 30 s. Each says which it was, with the evidence; no task is blamed; no result is lost; a
worker that comes back is reattached or cleanly replaced.

The three single-node failures run side by side, each cluster on two nodes of its own (its victim
and a partner; its jobs exclude every other node), two 4-core workers on each: a failure never
touches another scenario's workers, and each has workers that live on. The login node's partition
runs alone after them, since it cuts every worker off.
"""

from __future__ import annotations

import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import pytest

from hpc_cluster import Client
from hpc_cluster.deploy.cluster import SLURMCluster
from helpers import multinode as MN
from helpers.wait import wait_until

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(900)

# Each scenario's 4 workers: 4 cores each, so 2 fit on a node of 8 and the jobs fill both its nodes.

WORKERS = 4
VERDICT = 240          # a node killed for good is DOWN after SlurmdTimeout (60 s), then sacct says NODE_FAIL
PARTITION = 30


def add_one_held(x):
    return x + 1


def slow_times_ten(x):
    time.sleep(4)
    return x * 10


def host_of_worker():
    return socket.gethostname()


def staged(name: str, base, victim: str | None, exclude: list[str], fail) -> dict:
    """A cluster of WORKERS workers over the nodes not in `exclude`; results held everywhere and
    slow tasks running when `fail(run)` fails `victim` (None: the login node); then every result
    checked. Returns what the user saw."""
    out: dict = {"name": name}
    extra = [f"--exclude={','.join(exclude)}"] if exclude else []
    with SLURMCluster(cores=4, memory="400MB", walltime="00:15:00", name=name, processes=1,
                      log_directory=str(base / "logs" / name), job_extra_directives=extra) as cluster:
        cluster.scale(WORKERS)
        with Client(cluster) as c:
            c.wait_for_workers(WORKERS, timeout=240)
            hosts = c.run(host_of_worker)
            out["hosts"] = hosts
            out["victims"] = {a for a, h in hosts.items() if victim is None or h == victim}
            assert out["victims"], f"{name}: no worker on {victim}: {hosts}"
            held = c.map(add_one_held, range(300))
            c.gather(held)
            out["held_on_victims"] = sum(1 for ws in c.who_has(held).values() if set(ws) & out["victims"])
            running = c.map(slow_times_ten, range(2 * WORKERS))          # some run on the victims as they fail
            wait_until(lambda: any(c.processing().get(a) for a in out["victims"]), 60, "a task on a victim",
                       interval=0.2)
            t0 = time.monotonic()
            out["client"] = c
            fail(out)
            del out["client"]
            out["results_right"] = (c.gather(held) == [i + 1 for i in range(300)]
                                    and c.gather(running) == [i * 10 for i in range(2 * WORKERS)])

            def final_deaths():
                ds = [d for d in c.deaths() if d.get("worker") in out["victims"]]
                return ds if len(ds) >= len(out["victims"]) and all(d.get("final_at") for d in ds) else None
            out["deaths"] = wait_until(final_deaths, VERDICT, f"{name}: final verdicts on the victims' deaths",
                                       interval=1)
            out["all_deaths"] = c.deaths()
            out["seconds"] = round(time.monotonic() - t0)
            out["workers_after"] = wait_until(lambda: (w := c.scheduler_info()["workers"]) and len(w) >= WORKERS and w,
                                              240, f"{name}: {WORKERS} workers again", interval=1)
    return out


def node_death(out):
    """Every process of the node SIGKILLed: slurmd, the job's step, the nanny and the worker."""
    with MN.node_down(out["victim"]):
        MN.wait_node_state(out["victim"], ("down",), VERDICT)
        out["node_state"] = MN.node_state(out["victim"])


def partition_for(seconds):
    def cut(out):
        with MN.cut_off(out["victim"] or "login") as mend:
            time.sleep(seconds)        # the partition's length is the scenario itself, not a wait for a condition
            mend()
    return cut


def partition_for_good(out):
    """Cut off until the verdicts are in (for good, as far as anyone could tell), then mended
    so that the node serves the next tests."""
    with MN.cut_off(out["victim"]):
        MN.wait_node_state(out["victim"], ("down",), VERDICT)
        out["node_state"] = MN.node_state(out["victim"])
        wait_until(lambda: all(d.get("final_at") for d in out["client"].deaths() if d.get("worker") in out["victims"])
                   and {d.get("worker") for d in out["client"].deaths()} >= out["victims"],
                   VERDICT, "final verdicts while the node is cut off", interval=1)
    # Mended at the end so the node serves the next tests; SLURM returns it to service.
    MN.wait_node_state(out["victim"], ("idle", "mixed", "allocated"), VERDICT)


def with_victim(victim, fn):
    def run(out):
        out["victim"] = victim
        fn(out)
    return run


@pytest.fixture(scope="module")
def outcomes():
    base = MN.SHARED / "tests" / "node-failures"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(base / "xdg"))
        mp.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(base / "etc"))
        plan = {"node-death": ("hpcn1", "hpcn4", node_death), "cut-for-good": ("hpcn2", "hpcn5", partition_for_good),
                "cut-30s": ("hpcn3", "hpcn6", partition_for(PARTITION))}
        with ThreadPoolExecutor(len(plan)) as pool:
            runs = {name: pool.submit(staged, f"mn-{name}", base, victim,
                                      [n for n in MN.NODES if n not in (victim, partner)], with_victim(victim, fn))
                    for name, (victim, partner, fn) in plan.items()}
            out = {name: f.result() for name, f in runs.items()}
        out["login-30s"] = staged("mn-login-30s", base, None, [], with_victim(None, partition_for(PARTITION)))
    return out


def test_a_dead_node_is_node_failure_for_exactly_its_workers(outcomes):
    o = outcomes["node-death"]
    assert o["node_state"].startswith("down"), o["node_state"]
    deaths = o["deaths"]
    assert {d["worker"] for d in deaths} == o["victims"]
    others = [d for d in o["all_deaths"] if d.get("worker") not in o["victims"]]
    assert not others, others                           # the workers on other nodes lived on
    for d in deaths:
        assert (d["cause"], d["blame"]) == ("node-failure", False), d["text"]
        assert "hpcn1" in d["text"], d["text"]
        assert any("NODE_FAIL" in e for e in d["evidence"]), d["evidence"]
    assert o["held_on_victims"] > 0 and o["results_right"]      # its results recomputed elsewhere


def test_a_node_cut_off_for_30_s_comes_back_reattached(outcomes):
    o = outcomes["cut-30s"]
    deaths = o["deaths"]
    assert {d["worker"] for d in deaths} == o["victims"]
    for d in deaths:
        assert (d["cause"], d["blame"]) == ("heartbeat-lost", False), d["text"]
        assert "came back" in d["text"] and "reattached" in d["text"], d["text"]
        assert "RUNNING throughout" in d["text"], d["text"]
        assert any(e.startswith("reconnection: ") for e in d["evidence"]), d["evidence"]
        assert d["advice"].startswith("nothing to do"), d["advice"]
    # One record per worker: the nanny did not kill the worker that came back.
    assert len([d for d in o["all_deaths"] if d.get("worker") in o["victims"]]) == len(o["victims"])
    assert o["victims"] <= set(o["workers_after"]), "the same workers (addresses) are back"
    assert o["results_right"]


def test_a_node_cut_off_for_good_is_a_node_failure_after_silence(outcomes):
    o = outcomes["cut-for-good"]
    assert o["node_state"].startswith("down"), o["node_state"]
    for d in o["deaths"]:
        assert (d["cause"], d["blame"]) == ("node-failure", False), d["text"]
        assert "after the worker had fallen silent (it never came back)" in d["text"], d["text"]
        assert any(e == "connection: heartbeat-lost" for e in d["evidence"]), d["evidence"]
        assert any("NODE_FAIL" in e for e in d["evidence"]), d["evidence"]
    assert o["held_on_victims"] > 0 and o["results_right"]
    assert not o["victims"] & set(o["workers_after"]), "replaced by new workers, not the cut-off ones"


def test_the_login_node_cut_off_for_30_s_loses_nothing(outcomes):
    o = outcomes["login-30s"]
    assert o["victims"] == set(o["hosts"])                  # every worker was cut off
    for d in o["deaths"]:
        assert d["blame"] is False, d["text"]
        assert d["cause"] == "heartbeat-lost" and "reattached" in d["text"], d["text"]
    assert o["results_right"]
    assert len(o["workers_after"]) >= WORKERS
