"""A worker's memory over its life (issue 17): the chart `hpc-cluster why WORKER` prints, the
death record `client.deaths()` carries after a real memory death on a LocalCluster, and the
--json outputs of `status`, `why` and `list` checked against docs/cli-json.md."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.cli import cluster as cli_cluster
from hpc_cluster.cli.chart import memory_chart
from hpc_cluster.protocol.clusterfile import cluster_file_for, write_cluster_file
from helpers.cli import run_cli
from helpers.wait import wait_until

MiB = 2**20
MEMORY_KEYS = {"worker", "samples", "memory_limit", "terminate_at", "batch_limit", "task_starts", "died_at"}
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli-json.md"


def documented_keys(command: str, table: int = 0) -> set[str]:
    """The keys docs/cli-json.md lists for `command`: the first column of its section's
    `table`-th key table (0: the top level)."""
    section = DOC.read_text().split(f"## `hpc-cluster {command} --json`")[1].split("\n## ")[0]
    rows = section.split("| key |")[1 + table].split("\n\n")[0]
    return set(re.findall(r"^\| `(\w+)` \|", rows, re.M))


# -- the chart, on a fixed timeline -------------------------------------------------------

FIXED = {"worker": "c-3", "samples": [[0.0, 100 * MiB], [10.0, 200 * MiB], [20.0, 900 * MiB], [30.0, 500 * MiB]],
         "memory_limit": 1000 * MiB, "terminate_at": 950 * MiB, "batch_limit": 2000 * MiB,
         "task_starts": [[0.0, "a"], [20.0, "b"], [99.0, "after its death?"]], "died_at": 30.0}


def plot(text: str, width: int = 60, height: int = 10) -> list[str]:
    """The plot area of a chart: `height` rows of `width` columns."""
    rows = text.splitlines()[1:1 + height]
    return [r.split(" |", 1)[1][:width].ljust(width) for r in rows]


def test_the_chart_draws_the_limits_the_peak_the_task_starts_and_the_death():
    text = memory_chart(FIXED)
    lines = text.splitlines()
    assert all(ord(c) < 128 for c in text)                      # plain ASCII: works over ssh
    area = plot(text)
    assert len(area) == 10 and all(len(r) == 60 for r in area)
    # y from 0 to the highest of samples and limits (the batch limit, 2000 MiB: the top row);
    # a row is 2000/9 MiB, so the limit (1000) rounds to row 4 and the nanny's level (950) to row 5
    assert area[0] == "~" * 60 and lines[1].lstrip().startswith("1.95GiB |") and "~ batch limit 1.95 GiB" in lines[1]
    assert area[4] == "=" * 60 and "= limit 0.98 GiB" in lines[5]
    assert set(area[5]) == {"-", "*"} and "- nanny ends it at 0.93 GiB" in lines[6]
    # the peak (900 MiB at 20 s of 30) in column 20/30 x 59 = 39, on row 9 - 900/2000 x 9 = 5
    assert area[5][39] == "*" and [c for c, ch in enumerate(area[5]) if ch == "*"] == [39]
    # the death at the right end, at the last value (500 MiB: row 9 - round(2.25) = 7)
    assert area[7][59] == "X" and "X died at 0.49 GiB" in lines[8]
    assert area[9][0] == "*" and lines[10].split(" |")[0].strip() == "0GiB"
    starts = lines[12]
    assert starts[11 + 0] == "^" and starts[11 + 39] == "^" and "^ task starts (2)" in starts   # not the one after
    assert lines[13].strip().startswith("30s before its death") and lines[13].endswith("death")
    assert lines[0] == ("memory of c-3: peak 0.88 GiB 10s before its death; limit 0.98 GiB; batch limit 1.95 GiB; "
                        "nanny ends it at 0.93 GiB")


def test_limits_on_one_row_share_it_and_the_legend_names_both():
    memory = dict(FIXED, batch_limit=None)
    lines = memory_chart(memory).splitlines()
    area = plot("\n".join(lines))
    # without the batch limit the top is the limit: the nanny's 95 % rounds to the same row
    assert set(area[0]) == {"-"} and "= limit 1000 MiB; - nanny ends it at 950 MiB" in lines[1]
    assert lines[1].lstrip().startswith("1000MiB |")


def test_a_chart_of_nothing_says_so_and_bad_sizes_are_refused():
    assert memory_chart({"worker": "c-1", "samples": []}) == \
        "memory of c-1: no samples (the worker died before it reported its memory)"
    one = memory_chart({"worker": "c-1", "samples": [[5.0, 10 * MiB]], "died_at": 5.0})
    assert "X died at 10 MiB" in one and "no memory limit known" in one.splitlines()[0]
    with pytest.raises(ValueError, match="width >= 10 and height >= 3"):
        memory_chart(FIXED, width=5)


# -- a real memory death on a LocalCluster -------------------------------------------------

def grow_in_steps(step, pause, steps):
    """Take memory a step at a time (written, so it is resident): a rise the heartbeats see."""
    import time
    held = []
    for _ in range(steps):
        held.append(b"\1" * step)
        time.sleep(pause)
    return len(held)


@pytest.fixture(scope="module")
def memory_death():
    """A worker that its nanny stopped over its budget while running `grow_in_steps`, judged and refined."""
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="400MB", allowed_failures=0) as cluster, \
            Client(cluster) as client:
        future = client.submit(grow_in_steps, 16 * MiB, 0.1, 60, pure=False)
        wait_until(future.done, 60, "the nanny to stop the worker")
        # The nanny's report (its 10 Hz samples) arrives a moment after the death.
        death = wait_until(lambda: next((d for d in client.deaths() if d["memory"]["terminate_at"]
                                         and len(d["memory"]["samples"]) > 10), None), 30, "the nanny's report")
        yield cluster, client, future.key, death


def test_a_memory_deaths_record_carries_its_rise_toward_the_limit_and_its_task(memory_death):
    _, client, key, death = memory_death
    assert death["cause"] == "memory-nanny" and death["name"] == "worker-0"
    memory = death["memory"]
    assert set(memory) == MEMORY_KEYS and memory["worker"] == "worker-0" and memory["died_at"] == death["time"]
    assert memory["memory_limit"] == 400_000_000 and memory["terminate_at"] == int(400_000_000 * 0.95)
    assert memory["batch_limit"] is None                          # no batch system here
    samples = memory["samples"]
    times = [t for t, _ in samples]
    assert 10 < len(samples) <= 1000 and times == sorted(times)
    # It rose toward the limit: it starts far below the nanny's level and ends past it (the
    # sample that made the nanny act is among them).
    peak = max(v for _, v in samples)
    assert samples[0][1] < 0.5 * memory["terminate_at"] < memory["terminate_at"] < peak
    assert max(v for t, v in samples if t >= times[len(times) // 2]) == peak
    assert [k for _, k in memory["task_starts"]] == [key]
    assert samples[0][0] <= memory["task_starts"][0][0] <= memory["died_at"]


def local_cluster_file(cluster, name: str) -> Path:
    """Make the LocalCluster findable by the CLI, as a daemon's cluster file makes its cluster."""
    return write_cluster_file(cluster_file_for(name), cluster.scheduler_address, cluster.secret, name=name,
                              pid=os.getpid(), batch="local", site=None, daemon_log=None)


def test_why_worker_prints_the_verdict_and_a_memory_chart_and_why_json_carries_it(
        memory_death, isolated_home, capsys):
    cluster, _, key, _ = memory_death
    local_cluster_file(cluster, "lc")
    code, out, err = run_cli(capsys, "why", "worker-0", "lc")
    assert code == 0, err
    assert "worker-0  memory-nanny  blamed on its task" in out          # the verdict, as before
    chart = out[out.index("memory of worker-0: peak "):].splitlines()
    # 400 MB is 381 MiB, and the nanny ends it at 95 % of that
    assert "limit 381 MiB" in chart[0] and "nanny ends it at 362 MiB" in chart[0]
    assert any(" X died at " in line for line in chart[1:11])
    assert "^ task starts (1)" in out and "before its death" in out
    code, out, err = run_cli(capsys, "why", "worker-0", "lc", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == documented_keys("why") and data["cluster"] == "lc" and data["target"] == "worker-0"
    (death,) = data["deaths"]
    assert set(death["memory"]) == MEMORY_KEYS and death["memory"]["samples"] and death["executing"] == [key]
    # a task key finds the same death; a name nobody has is an error naming what to give
    code, out, _ = run_cli(capsys, "why", key, "lc", "--json")
    assert code == 0 and [d["id"] for d in json.loads(out)["deaths"]] == [death["id"]]
    code, out, err = run_cli(capsys, "why", "worker-9", "lc", "--json")
    assert code == 1 and out == "" and "no worker death in cluster 'lc' matches 'worker-9'" in err
    assert "a worker name or address, a job id or a task key" in err
    # all deaths, no chart but a pointer to it
    code, out, _ = run_cli(capsys, "why", "lc")
    assert code == 0 and "memory of" not in out and "`hpc-cluster why WORKER lc` charts" in out


def test_status_json_has_the_documented_keys_and_deaths_with_memory(memory_death, isolated_home, capsys,
                                                                     monkeypatch):
    cluster, _, _, _ = memory_death
    local_cluster_file(cluster, "lc")
    # A LocalCluster has no job manager: the daemon's job table is the one thing faked here.
    table = {"jobs": [], "target": 0, "halted": None, "renewals": 0, "queue_wait": None, "errors": [],
             "adaptive": None, "batch_calls": {"squeue": 3}, "pools": {"default": {"target": 0, "jobs": []}}}
    monkeypatch.setattr(cli_cluster, "_jobs", lambda *a, **k: table)
    code, out, err = run_cli(capsys, "status", "lc", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == documented_keys("status")
    assert data["name"] == "lc" and data["address"] == cluster.scheduler_address and data["daemon_pid"] == os.getpid()
    assert [d["cause"] for d in data["deaths"]] == ["memory-nanny"] and data["deaths"][0]["memory"]["samples"]


def test_list_json_has_the_documented_keys(memory_death, isolated_home, capsys):
    cluster, _, _, _ = memory_death
    code, out, _ = run_cli(capsys, "list", "--json")
    assert code == 3 and json.loads(out) == {"clusters": []}      # none: still JSON, and exit 3
    local_cluster_file(cluster, "lc")
    code, out, err = run_cli(capsys, "list", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == documented_keys("list")
    (entry,) = data["clusters"]
    assert set(entry) == documented_keys("list", table=1)
    # our LocalCluster is alive but has no daemon to answer for its jobs
    assert entry["name"] == "lc" and entry["state"] == "running" and entry["pid"] == os.getpid()
    assert entry["answering"] is False and entry["jobs"] is None and entry["left_jobs"] is None
    code, out, _ = run_cli(capsys, "list")
    assert code == 0 and "lc" in out and "not answering" in out


def test_on_a_batch_cluster_status_list_and_why_json_are_the_daemons_and_carry_the_batch_limit(sim, tmp_path, capsys):
    """A real cluster daemon (PBSCluster, on the command-level PBS simulator): every --json
    output from a real job table, and a memory death whose record learns the job's memory
    request from the accounting."""
    from hpc_cluster.deploy.cluster import PBSCluster
    # The job asks for 1 GB, its worker's budget is 400 MB: the nanny ends it long before the
    # batch system would (the simulator ends jobs over their request, as PBS's MOM does).
    cluster = PBSCluster(cores=1, memory="1GB", memory_limit="400MB", allowed_failures=0, walltime="00:10:00",
                         log_directory=str(tmp_path / "logs"))
    name = Path(cluster.cluster_file).stem
    try:
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=120)
            future = client.submit(grow_in_steps, 16 * MiB, 0.1, 60, pure=False)
            wait_until(future.done, 90, "the nanny to stop the worker")
            death = wait_until(lambda: next((d for d in client.deaths() if d["memory"]["batch_limit"]), None), 60,
                               "the accounting's memory request")
        # the job's request as the batch system has it: 1GB is asked for in whole MiB (mem=954mb)
        assert death["cause"] == "memory-nanny" and death["memory"]["batch_limit"] == 954 * MiB
        limit = death["memory"]["memory_limit"]
        assert abs(limit - 400_000_000) < 1000 and death["memory"]["terminate_at"] == int(limit * 0.95)
        code, out, err = run_cli(capsys, "status", name, "--json")
        assert code == 0, err
        status = json.loads(out)
        assert set(status) == documented_keys("status")
        assert set(status["jobs"][0]) == documented_keys("status", table=1)
        assert status["name"] == name and status["batch"] == "pbs" and status["jobs"][0]["state"] == "running"
        assert status["deaths"][0]["memory"]["samples"] and status["deaths"][0]["memory"]["batch_limit"] == 954 * MiB
        code, out, err = run_cli(capsys, "list", "--json")
        assert code == 0, err
        (entry,) = json.loads(out)["clusters"]
        assert entry["name"] == name and entry["answering"] is True and entry["jobs"] == {"running": 1, "pending": 0}
        code, out, err = run_cli(capsys, "why", death["name"], name)
        assert code == 0, err
        chart = out[out.index(f"memory of {death['name']}: peak "):].splitlines()
        assert "batch limit 954 MiB" in chart[0] and any("~ batch limit 954 MiB" in line for line in chart[1:11])
    finally:
        cluster.close()
