"""The dashboard (issue 17): its address keyword, token, JSON API and the scheduler's task stream.

The pages in a real browser: tests/integration/test_dashboard_browser.py.
"""

from __future__ import annotations

import json
import re
import socket

import pytest

from helpers.dashboard import died  # noqa: F401  (the module fixture its tests ask for)
from helpers.dashboard import (api, fake_scheduler, request, serving, slowinc,
                               split_link, timeline, with_deaths)
from hpc_cluster import Client, LocalCluster
from hpc_cluster.config.schema import parse_dashboard_address
from hpc_cluster.dashboard.views import MAX_SAMPLES, Views, key_prefix
from hpc_cluster.protocol.clusterfile import dashboard_token, new_secret
from hpc_cluster.scheduler.state import SchedulerState
from hpc_cluster.scheduler.stream import TaskStream
from helpers.wait import wait_until


# -- dashboard_address -----------------------------------------------------------------------
@pytest.mark.parametrize("given, bind", [
    (":8787", ("", 8787)), (":0", ("", 0)), ("127.0.0.1:9000", ("127.0.0.1", 9000)), ("0.0.0.0:80", ("0.0.0.0", 80)),
    ("login1.cluster.org:8787", ("login1.cluster.org", 8787)), (8787, ("", 8787)), ("8787", ("", 8787)),
    ("[::1]:8787", ("::1", 8787)), (None, None), (False, None)])
def test_dashboard_addresses_are_read_as_dask_writes_them(given, bind):
    assert parse_dashboard_address(given) == bind


@pytest.mark.parametrize("given", ["8787:", "localhost", ":99999", "http://x:1/", "host:port", ":", "", 1.5, True])
def test_a_malformed_dashboard_address_is_refused_saying_what_to_write(given):
    with pytest.raises(ValueError, match=r"is not a dashboard address: write ':PORT' .* or None to turn"):
        parse_dashboard_address(given)


def test_local_cluster_refuses_a_bad_dashboard_address_before_starting_anything():
    with pytest.raises(ValueError, match=r"LocalCluster\(dashboard_address=...\)='nonsense' is not a dashboard"):
        LocalCluster(n_workers=0, dashboard_address="nonsense")


def test_scheduler_options_dashboard_address_is_checked_with_the_config():
    from hpc_cluster.config import ConfigError, resolve
    with pytest.raises(ConfigError, match=r"scheduler_options.dashboard_address='x:y' is not a dashboard address"):
        resolve(batch="slurm", cores=1, memory="1GB", scheduler_options={"dashboard_address": "x:y"})


def test_the_daemons_plan_carries_the_dashboards_bind_or_none():
    from hpc_cluster.deploy.plan import dashboard_bind
    # No host: 127.0.0.1 (issue 34: its token stays off the network), where dask means every interface.
    assert dashboard_bind({}) == ["127.0.0.1", 8787]                     # dask's default port
    assert dashboard_bind({"dashboard_address": ":0"}) == ["127.0.0.1", 0]
    assert dashboard_bind({"dashboard_address": "127.0.0.1:8000"}) == ["127.0.0.1", 8000]
    assert dashboard_bind({"dashboard_address": "0.0.0.0:8000"}) == ["0.0.0.0", 8000]     # as asked
    assert dashboard_bind({"dashboard_address": None}) is None
    assert dashboard_bind({"dashboard": False, "dashboard_address": ":1"}) is None


# -- the task stream (scheduler/stream.py) ------------------------------------------------------
def test_the_task_stream_gives_each_running_task_the_lowest_free_lane_and_stays_bounded():
    s = TaskStream(size=3)
    s.started("tcp://a", "w-a", "x-1", 1.0)
    s.started("tcp://a", "w-a", "x-2", 1.5)
    s.started("tcp://a", "w-a", "x-1", 1.7)          # a repeat does not take a second lane
    assert s.now_running(10) == [("w-a", 0, "x-1", 1.0), ("w-a", 1, "x-2", 1.5)]
    s.finished("tcp://a", "x-1", 2.0, "memory")
    s.started("tcp://a", "w-a", "x-3", 2.1)          # lane 0 is free again
    assert ("w-a", 0, "x-3", 2.1) in s.now_running(10)
    s.finished("tcp://a", "unknown", 2.2, "memory")  # never started: nothing recorded
    s.finished("tcp://a", "x-2", 2.5, "erred")
    s.worker_gone("tcp://a", 3.0)                    # what it ran ends as "lost"
    assert list(s.done) == [("w-a", 0, "x-1", 1.0, 2.0, "memory"), ("w-a", 1, "x-2", 1.5, 2.5, "erred"),
                            ("w-a", 0, "x-3", 2.1, 3.0, "lost")]
    assert s.running == {} and s.names == {}
    for i in range(10):                              # bounded: only the last `size` are kept
        s.started("tcp://b", "w-b", f"y-{i}", 10 + i)
        s.finished("tcp://b", f"y-{i}", 10.5 + i, "memory")
    assert [e[2] for e in s.done] == ["y-7", "y-8", "y-9"]
    assert [e[2] for e in s.recent(since=18.0, limit=10)] == ["y-9", "y-8"]     # newest first, by end
    assert [e[2] for e in s.recent(since=0, limit=1)] == ["y-9"]


@pytest.mark.parametrize("key, prefix", [
    ("inc-9f1c2d3e4b5a69788796a5b4c3d2e1f0", "inc"), ("('sum-aggregate-ab12cd34ef56', 0)", "sum-aggregate"),
    ("slowinc-1", "slowinc"), ("read-parquet-deadbeefcafe-3", "read-parquet"), ("x", "x"),
    ("('add-5c2e8d3a', 3, 1)", "add"), ("lambda-0a1b2c3d4e5f6a7b", "lambda")])
def test_key_prefixes_are_the_name_part_of_a_key(key, prefix):
    assert key_prefix(key) == prefix


# -- the views on a state made by hand ---------------------------------------------------------
def test_deaths_list_their_verdicts_without_the_samples_and_the_timeline_comes_alone():
    views = Views(fake_scheduler(with_deaths(timeline(300), None)))
    out = views.deaths()
    assert out["total"] == 2 and [d["id"] for d in out["deaths"]] == [1, 0]            # newest first
    first = out["deaths"][1]
    assert first["memory_samples"] == 300 and "memory" not in first and first["final"] is True
    assert first["cause"] == "memory-nanny" and first["advice"] and first["evidence"]
    assert out["deaths"][0]["memory_samples"] == 0
    m = views.death_memory(0)
    assert m["worker"] == "worker-0" and m["cause"] == "memory-nanny"
    assert len(m["memory"]["samples"]) == 300 and m["memory"]["terminate_at"] == int(400 * 2**20 * 0.95)
    assert m["memory"]["task_starts"][1] == [1001.5, "hog-abc"] and m["memory"]["died_at"] == 1003.0
    assert views.death_memory(1) == {"id": 1, "worker": "worker-1", "cause": "memory-nanny", "memory": None}
    assert views.death_memory(7) is None


def test_a_long_timeline_is_thinned_keeping_its_peaks():
    memory = timeline(3 * MAX_SAMPLES + 5)
    spike = 1234
    memory["samples"][spike][1] = 10**12
    m = Views(fake_scheduler(with_deaths(memory))).death_memory(0)["memory"]
    assert len(m["samples"]) <= MAX_SAMPLES
    assert max(v for _, v in m["samples"]) == 10**12


def test_the_states_death_memory_is_preferred_to_the_records_own():
    st = with_deaths(None)
    st.death_memory = lambda death_id: timeline(5) if death_id == 0 else None     # the timeline work's accessor
    assert len(Views(fake_scheduler(st)).death_memory(0)["memory"]["samples"]) == 5


def test_a_finished_and_forgotten_map_still_shows_done_in_its_bar():
    """Tasks gathered and let go leave the scheduler; their bar counts them as released
    (dask's progress bars do the same) instead of vanishing."""
    from hpc_cluster.scheduler.state.records import TaskState
    st = SchedulerState()
    for i in range(5):
        st.tasks[f"inc-{i}"] = TaskState(f"inc-{i}", state="memory")
    now = [100.0]
    views = Views(fake_scheduler(st), clock=lambda: now[0])
    assert {r["prefix"]: r["memory"] for r in views.tasks()["prefixes"]} == {"inc": 5}
    for i in range(3):
        del st.tasks[f"inc-{i}"]
    now[0] += 2.0
    row = {r["prefix"]: r for r in views.tasks()["prefixes"]}["inc"]
    assert (row["memory"], row["released"], row["total"]) == (2, 3, 5)


def test_progress_per_prefix_counts_each_state_column_and_is_reused_for_a_second():
    from hpc_cluster.scheduler.state.records import TaskState
    st = SchedulerState()
    for i, state in enumerate(["memory", "memory", "processing", "queued", "waiting", "erred", "released", "held"]):
        st.tasks[f"inc-{i}"] = TaskState(f"inc-{i}", state=state)
    st.tasks["('sum-aggregate-ab12cd34ef', 0)"] = TaskState("x", state="memory")
    now = [100.0]
    views = Views(fake_scheduler(st), clock=lambda: now[0])
    out = views.tasks()
    rows = {r["prefix"]: r for r in out["prefixes"]}
    assert rows["inc"] == {"prefix": "inc", "waiting": 2, "processing": 1, "memory": 3, "erred": 1, "released": 1,
                           "total": 8}
    assert rows["sum-aggregate"]["memory"] == 1 and out["tasks_total"] == 9
    st.tasks["inc-99"] = TaskState("inc-99", state="waiting")
    now[0] += 0.5
    assert views.tasks()["tasks_total"] == 9                  # within a second: the same counts
    now[0] += 1.0
    out = views.tasks()
    assert out["tasks_total"] == 10 and out["counted_at"] == now[0]


def test_slow_counts_are_reused_longer_so_they_take_a_bounded_share(monkeypatch):
    from hpc_cluster.dashboard import views as views_module
    from hpc_cluster.scheduler.state.records import TaskState
    st = SchedulerState()
    st.tasks["a-1"] = TaskState("a-1", state="memory")
    now = [100.0]
    views = Views(fake_scheduler(st), clock=lambda: now[0])
    monkeypatch.setattr(views_module, "COUNT_SHARE", 1e-9)   # as if counting took ages
    views.tasks()
    st.tasks["a-2"] = TaskState("a-2", state="memory")
    del st.tasks["a-1"]
    now[0] += 60
    assert views.tasks()["tasks_total"] == 1 and views.tasks()["counted_at"] == 100.0
    monkeypatch.setattr(views_module, "COUNT_SHARE", 0.02)
    views._reuse = views_module.TASKS_CACHE
    now[0] += 1.5
    assert views.tasks()["tasks_total"] == 1
    assert set(views._prefix_of) == {"a-2"}                 # the prefix map follows the tasks


# -- a dashboard on a state made by hand, in this process ----------------------------------------
def test_a_port_in_use_makes_the_dashboard_take_another():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with serving(fake_scheduler(), new_secret(), port=port) as d:
            assert d.address.startswith("http://127.0.0.1:") and not d.address.endswith(f":{port}/")
            status, _, _ = request(d.link, "/api/workers", d.token)
            assert status == 200
    finally:
        taken.close()


def test_the_token_opens_the_dashboard_and_its_cookie_keeps_it_open():
    secret = new_secret()
    sched = fake_scheduler()
    with serving(sched, secret) as d:
        host, port, token = split_link(d.link)
        assert d.link == f"http://127.0.0.1:{port}/status?token={token}" and token == dashboard_token(secret)
        assert token not in (secret.hex(), secret.hex()[:32])              # never the secret itself
        assert sched.services["dashboard"] == f"http://127.0.0.1:{port}/"
        for path in ("/", "/status", "/api/workers", "/api/tasks", "/api/jobs", "/api/deaths",
                     "/api/deaths/0/memory", "/static/dashboard.js", "/nowhere"):
            status, _, body = request(d.link, path)
            assert status == 403 and b"needs its token" in body, path
            assert request(d.link, path, "0" * 32)[0] == 403, path                  # a wrong token
        status, headers, body = request(d.link, "/status", token)
        assert status == 200 and b"<title>hpc-cluster dashboard</title>" in body
        cookie = headers["Set-Cookie"]
        assert cookie.startswith(f"hpc_cluster_dashboard_{port}={token};") and "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        pair = cookie.split(";")[0]
        assert request(d.link, "/api/workers", headers={"Cookie": pair})[0] == 200             # the cookie alone
        assert request(d.link, "/static/dashboard.js", headers={"Cookie": pair})[0] == 200
        other_port = pair.replace(f"_{port}=", f"_{port + 1}=")
        assert request(d.link, "/api/workers", headers={"Cookie": other_port})[0] == 403       # another's cookie
        assert request(d.link, "/api/workers", headers={"Cookie": pair[:-1] + "x"})[0] == 403
        assert request(d.link, "/api/workers", headers={"Authorization": f"Bearer {token}"})[0] == 200
        assert request(d.link, "/api/nothing", token)[0] == 404
        assert request(d.link, "/api/deaths/5/memory", token)[0] == 404                       # no such death
        assert request(d.link, "/static/../server.py", token)[0] in (403, 404)


def test_a_dashboard_turned_off_leaves_no_trace_and_none_for_links():
    with LocalCluster(n_workers=1, dashboard_address=None) as cluster, Client(cluster) as client:
        assert cluster.dashboard_link is None and client.dashboard_link is None
        assert not (cluster.log_directory / "scheduler.dashboard").exists()
        with Client(cluster.scheduler_address, secret=cluster.secret) as by_address:
            assert by_address.dashboard_link is None and by_address.services == {}


# -- the JSON API of a real LocalCluster --------------------------------------------------------------
def test_the_links_of_cluster_and_clients_agree_and_name_a_port_of_its_own(died):
    cluster, client = died
    link = cluster.dashboard_link
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/status\?token=[0-9a-f]{32}", link), link
    host, port, token = split_link(link)
    assert port not in (0, int(cluster.scheduler_address.rsplit(":", 1)[1]))        # ':0' took a free port
    assert client.dashboard_link == link
    # A client that has only the address and secret learns the dashboard from the scheduler.
    with Client(cluster.scheduler_address, secret=cluster.secret) as by_address:
        assert by_address.dashboard_link == link


def test_api_workers(died):
    cluster, client = died
    out = api(cluster.dashboard_link, "workers")
    assert out["total"] == 1 and isinstance(out["now"], float)
    (w,) = out["workers"]
    assert set(w) >= {"name", "address", "nthreads", "executing", "processing", "stored", "memory_limit", "pause_at",
                      "terminate_at", "rss", "managed", "spilled", "job_id", "node", "pool", "time_left", "status"}
    assert w["nthreads"] == 2 and w["memory_limit"] == 400 * 10**6 and w["pool"] == "default"
    assert w["terminate_at"] == int(400 * 10**6 * 0.95) and w["status"] == "running" and w["node"]
    assert w["job_id"] is None and w["time_left"] is None                        # no batch job, no walltime
    wait_until(lambda: api(cluster.dashboard_link, "workers")["workers"][0]["rss"], 30, "a memory report")


def test_api_tasks(died):
    cluster, client = died
    futures = client.map(slowinc, range(40), delay=0.05)
    seen = wait_until(lambda: [p for p in api(cluster.dashboard_link, "tasks")["prefixes"]
                               if p["prefix"] == "slowinc" and p["total"] >= 40], 30, "the slowinc prefix")
    row = seen[0]
    assert set(row) == {"prefix", "waiting", "processing", "memory", "erred", "released", "total"}
    assert row["total"] == sum(row[k] for k in ("waiting", "processing", "memory", "erred", "released"))
    client.gather(futures)
    out = api(cluster.dashboard_link, "tasks")
    stream = out["stream"]
    assert stream["window"] == 60.0 and stream["since"] == pytest.approx(out["now"] - 60.0)
    done = [t for t in stream["done"] if t["prefix"] == "slowinc"]
    assert len(done) >= 40 and all(t["stop"] >= t["start"] and t["outcome"] == "memory" for t in done)
    # The nanny restarted worker-0 under its name: one worker of 2 threads, so 2 lanes.
    assert {t["lane"] for t in done} <= {0, 1} and stream["lanes"] == {"worker-0": 2}
    # The hog that killed worker-0 ended in the stream as "lost".
    assert [t for t in stream["done"] if t["prefix"] == "hog" and t["outcome"] == "lost"]


def test_api_jobs_of_a_local_cluster_says_there_are_none(died):
    out = api(died[0].dashboard_link, "jobs")
    assert out["batch"] is False and out["jobs"] == []


def test_api_deaths_and_the_memory_of_one(died):
    cluster, client = died
    out = api(cluster.dashboard_link, "deaths")
    assert out["total"] == 1
    (d,) = out["deaths"]
    assert d["cause"] == "memory-nanny" and d["blame"] is True and d["final"] is True
    assert d["name"] == "worker-0" and d["executing"] and d["executing"][0].startswith("hog-")
    assert any("over its memory budget" in e for e in d["evidence"]) and d["advice"]
    assert d["memory_samples"] >= 20                  # the record's timeline (scheduler/state/timeline.py)
    m = api(cluster.dashboard_link, f"deaths/{d['id']}/memory")
    assert m["id"] == d["id"] and m["worker"] == "worker-0" and m["cause"] == "memory-nanny"
    memory = m["memory"]
    assert set(memory) == {"worker", "samples", "memory_limit", "terminate_at", "batch_limit", "task_starts",
                           "died_at"}
    assert len(memory["samples"]) == d["memory_samples"] and memory["memory_limit"] == 400 * 10**6
    assert memory["terminate_at"] == 380 * 10**6 and memory["batch_limit"] is None
    times = [t for t, _ in memory["samples"]]
    assert times == sorted(times) and times[-1] <= memory["died_at"] + 1
    assert max(v for _, v in memory["samples"]) > 380 * 10**6 * 0.9          # it grew to the nanny's line
    assert any(k.startswith("hog-") for _, k in memory["task_starts"])
    # JSON, all of it, even where a peer's number could have been NaN.
    json.dumps(out, allow_nan=False)


# -- `hpc-cluster up` and `status` print the link the daemon wrote into the cluster file ---------
def test_up_and_status_print_the_daemons_dashboard_link_and_it_serves_the_jobs(sim, capsys):
    # `hpc-cluster up` on the PBS simulator: the daemon's dashboard, where scheduler_options say.
    from hpc_cluster.cli import main
    site = sim.parent / "site.yaml"
    site.write_text("default: sim\nsites:\n  sim:\n    batch: pbs\n    cores: 1\n    memory: 1GB\n"
                    "    walltime: '00:10:00'\n    scheduler_options: {host: 127.0.0.1, dashboard_address: ':0'}\n")
    assert main(["up", "--config", str(site), "--name", "dash", "-n", "1", "--no-wait"]) == 0
    try:
        out = capsys.readouterr().out
        found = re.search(r"dashboard \(the link carries its access token\): (http://127\.0\.0\.1:\d+/status"
                          r"\?token=[0-9a-f]{32})\n", out)
        assert found, out
        link = found.group(1)
        jobs = wait_until(lambda: [j for j in api(link, "jobs")["jobs"] if j["state"] == "running"], 60,
                          "the job to run, on the dashboard")
        assert jobs[0]["pool"] == "default" and api(link, "jobs")["batch"] is True
        assert main(["status", "dash"]) == 0
        assert f"\ndashboard: {link}\n" in capsys.readouterr().out
        assert main(["status", "dash", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["dashboard"] == link
    finally:
        assert main(["down", "dash"]) == 0

    def closed():
        try:
            request(link, "/api/jobs", split_link(link)[2])
        except OSError:
            return True
        return False
    wait_until(closed, 30, "the dashboard to stop with its daemon")


def test_a_nan_from_a_peer_is_sent_as_null_not_as_invalid_json():
    st = with_deaths(None)
    st.deaths[0]["peak_memory"] = float("nan")
    st.deaths[0]["time"] = float("inf")
    with serving(fake_scheduler(st), new_secret()) as d:
        status, _, body = request(d.link, "/api/deaths", d.token)
        death = json.loads(body)["deaths"][0]                    # strict JSON: NaN would not parse in a browser
        assert status == 200 and b"NaN" not in body and b"Infinity" not in body
        assert death["peak_memory"] is None and death["time"] is None and death["cause"] == "memory-nanny"


def test_an_ipv6_loopback_address_is_served_and_linked_in_brackets():
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    with serving(fake_scheduler(), new_secret(), host="::1") as d:
        assert re.fullmatch(r"http://\[::1\]:\d+/", d.address), d.address
        assert request(d.link, "/api/workers", d.token)[0] == 200
