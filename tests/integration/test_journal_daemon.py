"""A cluster daemon SIGKILLed with a journal: a new daemon of the same name rebuilds what the
client had submitted (issue 16, points 1 and 2's state half). Against the PBS simulator
(tests/helpers/pbs_sim), as test_pbs_deploy.py: a real daemon, real jobs, a real worker.

Workers and clients reattaching is the other half of the issue; here the old job is ended
before the new daemon starts, and the rebuilt task table is read through `why`.
"""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from helpers.funcs import inc
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.deploy.cluster import PBSCluster  # noqa: E402
from hpc_cluster.protocol.clusterfile import clusters_dir, journal_for as journal_path  # noqa: E402
from hpc_cluster.deploy.launch import control, launch  # noqa: E402
from hpc_cluster.scheduler.journal import load  # noqa: E402
import pbssim  # noqa: E402


def _fail(x):
    raise ValueError(f"bad input {x}")


def _sleep(x):
    time.sleep(600)
    return x


def _add(a, b):
    return a + b


def _journal_says(path: Path, want: dict, jobs: bool = False) -> bool:
    try:
        rec = load(path)
    except (OSError, ValueError):
        return False
    return (not jobs or bool(rec.jobs)) and all(key in rec.status and rec.status[key][2] == code for key, code in want.items())


def _why(client, key):
    return client._lt.run(client._request({"op": "why", "key": key}), 30)


def test_a_killed_daemon_leaves_a_journal_a_new_daemon_rebuilds_from(sim, tmp_path):
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"),
                         journal=True)
    name, cfg, proc2 = cluster.id, cluster.config, None
    path = journal_path(cluster.cluster_file)
    try:
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=120)
            x = client.submit(inc, 1, key="x")
            bad = client.submit(_fail, 2, key="bad")
            slow = client.submit(_sleep, 3, key="slow")
            z = client.submit(_add, x, slow, key="z")
            assert x.result(timeout=60) == 2
            wait_until(lambda: bad.status == "error", 60, "the failing task to fail")
            # The journal is written every 0.2 s: wait until it says what the client knows.
            wait_until(lambda: _journal_says(path, {"x": "m", "bad": "e", "slow": "p", "z": "p"}, jobs=True), 30,
                       "the journal to hold the submitted tasks and the job")
            assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.parent == cluster.cluster_file.parent
            worker_name = next(iter(client.scheduler_info()["workers"].values()))["name"]
            cluster._keeper.stop()                             # this test restarts it by hand, below
            cluster._proc.send_signal(signal.SIGKILL)          # no goodbye, no cleanup
            cluster._proc.wait(30)
            del x, bad, slow, z
        # Its job runs on (the daemon could not cancel it); end it with qdel, so no worker of
        # the old daemon comes back in this test (reattaching: the test below, test_reattach.py).
        assert path.exists(), "a SIGKILLed daemon must leave its journal"
        old = load(path)
        subprocess.run(["qdel", *old.jobs], check=True, capture_output=True)
        wait_until(lambda: not pbssim.live_pids(str(sim)), 30, "the old job's processes to exit")
        assert set(old.specs) == {"x", "bad", "slow", "z"}
        assert old.jobs and {j["pool"] for j in old.jobs.values()} == {"default"}
        assert [j["workers"] for j in old.jobs.values()] == [[worker_name]]      # who held what, by job

        # `hpc-cluster up --name NAME` again (launch(), as up does): the new daemon resumes.
        proc2, cluster_file = launch(cfg, name, n_jobs=0)
        with Client(cluster_file=str(cluster_file), timeout=30) as client2:
            got = {k: _why(client2, k) for k in ("x", "bad", "slow", "z")}
            assert all(got.values()), got
            # x was on worker_name, whose job (adopted) ended meanwhile: as soon as the queue says
            # so, x is to be computed again (no worker now: queued), not held for the 10 minutes
            # a worker may take to reattach.
            assert got["x"]["state"] in ("held", "queued"), got["x"]
            assert got["bad"]["state"] == "erred" and "bad input 2" in got["bad"]["error"]["text"]
            assert got["slow"]["state"] == "queued"             # no worker: waits at the scheduler
            assert got["z"]["state"] == "waiting"
            assert _why(client2, "never-submitted") is None
            wait_until(lambda: _why(client2, "x")["state"] == "queued", 30,
                       "x to be recomputed once the job of its holder is known to have ended")
            # Its own journal started as a snapshot of the rebuilt state.
            wait_until(lambda: _journal_says(path, {"x": "p", "bad": "e", "slow": "p", "z": "p"}), 30,
                       "the new daemon's journal")
            # The old daemon's job is adopted by id, and the cluster's size with it (1 job): the
            # job ended meanwhile (qdel), so once the queue says so a new one may replace it.
            table = control(cluster_file, "jobs")
            assert set(old.jobs) <= {str(r["job_id"]) for r in table["jobs"]} and table["target"] == 1, table
        control(cluster_file, "shutdown")
        proc2.wait(60)
        assert proc2.returncode == 0
        assert not path.exists(), "a daemon shut down on purpose removes its journal"
    finally:
        if proc2 is not None and proc2.poll() is None:
            proc2.kill()
            proc2.wait()
        if cluster._proc is not None and cluster._proc.poll() is None:
            cluster._proc.kill()
        cluster.close()


def test_a_local_cluster_keeps_a_journal_on_request_and_removes_it_when_closed(tmp_path):
    from hpc_cluster import LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, journal=True, log_directory=str(tmp_path / "logs")) as c:
        path = c.journal_path
        with Client(c) as client:
            one = client.submit(inc, 1, key="one")
            assert one.result(timeout=60) == 2
            wait_until(lambda: _journal_says(path, {"one": "m"}), 30, "the journal to hold the result")
            assert load(path).status["one"][3] == ["worker-0"]          # by the worker's name
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not path.exists(), "a scheduler closed on purpose removes its journal"


def test_a_pbscluster_daemon_that_dies_is_restarted_once_and_its_worker_and_client_reattach(sim, tmp_path):
    """deploy/keeper.py: the daemon a PBSCluster started dies (SIGKILL) while its owner lives:
    it is started again from its journal, on the same secret; the worker job keeps running
    (adopted, no new job), the client's pending result arrives. A second death is left dead."""
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"),
                         name="keep-me")
    try:
        assert cluster.id.startswith("keep-me-")
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=120)
            first = cluster._proc
            jobs_before = set(cluster.jobs)
            slow = client.submit(time.sleep, 3, key="slow-3")
            wait_until(lambda: any(w.get("executing") for w in client.scheduler_info()["workers"].values())
                       or slow.done(), 30, "the task to start")
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            wait_until(lambda: cluster._proc is not first and cluster._proc.poll() is None, 60,
                       "the keeper to start the daemon again")
            assert slow.result(timeout=120) is None            # through the restart, nothing resubmitted by hand
            # The dead daemon's log (why it died is in it) is kept beside the new one, not truncated.
            previous = clusters_dir() / f"{cluster.id}.previous.log"
            assert f"cluster {cluster.id} up at" in previous.read_text(), previous
            assert stat.S_IMODE(previous.stat().st_mode) == 0o600
            assert client.submit(inc, 41).result(timeout=60) == 42
            assert set(cluster.jobs) == jobs_before            # the same job, adopted
            assert cluster._keeper.restarts == 1
            second = cluster._proc
            second.send_signal(signal.SIGKILL)
            second.wait(30)
            wait_until(lambda: cluster._keeper.error is not None, 30, "the keeper to give up")
            assert cluster._proc is second and "not restarting" in cluster._keeper.error
    finally:
        if cluster._proc is not None and cluster._proc.poll() is None:
            cluster._proc.kill()
        cluster.close()
        pbssim.cleanup(str(sim))


def test_a_name_resumes_its_stopped_cluster_and_two_live_ones_never_share_an_id(isolated_home):
    """cluster_id: SLURMCluster(name=N) started twice at once (the SLURM scenarios do) gets two
    ids; one started after a cluster N whose daemon died leaving its journal takes that id
    again (once), so it resumes."""
    import subprocess as sp
    import sys as _sys
    from hpc_cluster.deploy.cluster import cluster_id
    from hpc_cluster.protocol.clusterfile import cluster_file_for, new_secret, write_cluster_file
    a, b = cluster_id("sc-x", explicit=True), cluster_id("sc-x", explicit=True)
    assert a != b and a.startswith("sc-x-") and b.startswith("sc-x-")
    dead = sp.Popen([_sys.executable, "-c", "pass"])
    dead.wait()
    stopped = cluster_file_for("sc-x-abc123")
    write_cluster_file(stopped, "tcp://127.0.0.1:1", new_secret(), name="sc-x-abc123", pid=dead.pid)
    assert cluster_id("sc-x", explicit=True).startswith("sc-x-")        # no journal: nothing to resume
    journal_path(stopped).write_bytes(b"")
    assert cluster_id("sc-x", explicit=True) == "sc-x-abc123"
    assert cluster_id("sc-x", explicit=True) != "sc-x-abc123"             # claimed once, by one cluster
    assert cluster_id("sc-x", explicit=False) != "sc-x-abc123"
