"""Package versions that differ across client, scheduler and workers: the user is warned
(the scheduler's log alone is not enough); versions='strict' refuses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest

from hpc_cluster import Client, LocalCluster
from hpc_cluster.deploy.local.cluster import _child_env
from hpc_cluster.protocol.comm import AuthenticationError
from hpc_cluster.protocol.versions import (VersionMismatchWarning, format_grouped, get_versions,
                                           grouped_mismatches)
from helpers.wait import wait_until

# A worker (no nanny) that announces tornado 1.0: versions.get_versions is replaced before
# the worker module imports it.
OLD_TORNADO_WORKER = textwrap.dedent("""
    import sys
    import hpc_cluster.protocol.versions as versions
    real = versions.get_versions()
    versions.get_versions = lambda: dict(real, tornado="1.0")
    from hpc_cluster.worker.__main__ import main
    sys.exit(main(sys.argv[1:]))
""")


def _fake_client_versions(monkeypatch, **changes) -> dict:
    fake = dict(get_versions(), **changes)
    monkeypatch.setattr("hpc_cluster.client.client.get_versions", lambda: fake)
    return fake


def test_grouped_mismatches_table():
    ours = dict(get_versions(), python="3.11.7")
    peers = {"scheduler": dict(ours, python="3.11.2"),                     # patch level: fine
             "worker a": dict(ours, tornado="1.0"), "worker b": dict(ours, tornado="1.0"),
             "worker c": dict(ours, python="3.10.1", tornado="1.0"), "worker d": dict(ours, tornado="1.0")}
    rows = grouped_mismatches(ours, peers)
    assert rows == [("python", "3.11.7", "3.10.1", ["worker c"]),
                    ("tornado", ours["tornado"], "1.0", ["worker a", "worker b", "worker c", "worker d"])]
    table = format_grouped(rows).splitlines()
    assert table[0].split() == ["package", "client", "theirs", "where"]
    assert table[2].split()[:3] == ["tornado", ours["tornado"], "1.0"]
    assert table[2].endswith("worker a, worker b, worker c and 1 more")


def test_client_warns_of_a_worker_with_other_versions_once():
    with LocalCluster(n_workers=0) as cluster:
        with warnings.catch_warnings():
            warnings.simplefilter("error")              # all alike: not a word
            client = Client(cluster)
        worker = subprocess.Popen([sys.executable, "-c", OLD_TORNADO_WORKER, "--scheduler",
                                   cluster.scheduler_address, "--no-nanny", "--nthreads", "1",
                                   "--name", "old-tornado"], env=_child_env(cluster.secret))
        try:
            with pytest.warns(VersionMismatchWarning) as record:
                client.wait_for_workers(1, timeout=30)
            [address] = client.scheduler_info()["workers"]
            assert len(record) == 1 and record[0].filename == __file__     # points at our line
            text = str(record[0].message)
            assert "package versions differ between this client and the cluster" in text
            row = next(line for line in text.splitlines() if line.split()[:1] == ["tornado"])
            assert row.split() == ["tornado", get_versions()["tornado"], "1.0", "worker", address]
            with warnings.catch_warnings():
                warnings.simplefilter("error")          # told once per worker
                client.scheduler_info()
            # A client connecting later hears of it at once.
            with pytest.warns(VersionMismatchWarning, match=rf"(?m)^\s+tornado\s+\S+\s+1\.0\s+worker {address}$"):
                Client(cluster).close()
            # The scheduler logged it too, and (versions='warn') let the worker work.
            wait_until(lambda: "package versions that differ" in cluster.logs()["scheduler"],
                       what="the scheduler's log line")
            assert client.submit(sum, [1, 2]).result(30) == 3
        finally:
            client.close()
            worker.terminate()
            worker.wait(30)


def test_client_warns_of_a_scheduler_and_workers_with_other_versions(cluster, monkeypatch):
    _fake_client_versions(monkeypatch, msgpack="0.1.0")
    with pytest.warns(VersionMismatchWarning) as record:
        c = Client(cluster)
    try:
        assert len(record) == 1 and record[0].filename == __file__
        [row] = [line for line in str(record[0].message).splitlines() if line.split()[:1] == ["msgpack"]]
        workers = sorted(c.scheduler_info()["workers"])
        assert row.split(None, 3) == ["msgpack", "0.1.0", get_versions()["msgpack"],
                                      f"scheduler, worker {workers[0]}, worker {workers[1]}"]
    finally:
        c.close()


def test_a_python_patch_release_does_not_matter(cluster, monkeypatch):
    major, minor, _ = get_versions()["python"].split(".")
    _fake_client_versions(monkeypatch, python=f"{major}.{minor}.999")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Client(cluster).close()


def test_strict_refuses_the_client_instead_of_warning(monkeypatch):
    with LocalCluster(n_workers=0, versions="strict") as strict:
        with Client(strict) as ok:                      # matching versions are let in
            assert ok.scheduler_info()["workers"] == {}
        _fake_client_versions(monkeypatch, tornado="1.0")
        with pytest.raises(AuthenticationError, match=r"(?s)versions='strict'.*tornado\s+\S+\s+1\.0"):
            Client(strict)
