"""TLS (issue 14, point 9): `security=` encrypts every connection (client, scheduler, workers,
nannies, peers), the secret handshake runs inside it, a cleartext peer is refused, and what
travels cannot be read off the wire. Real processes and sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import pytest

from helpers.files import mode  # noqa: E402
from helpers.wait import wait_until  # noqa: E402

from hpc_cluster import Client, LocalCluster  # noqa: E402
from hpc_cluster.protocol.comm import AuthenticationError  # noqa: E402

PAYLOAD = b"known-payload-4f1c9a-" * 64


def _make(n: int) -> bytes:
    return bytes(range(256)) * n


def _inner_sum(x):
    from hpc_cluster import get_client
    return get_client().submit(sum, [x, 1]).result(timeout=30)


@pytest.fixture(scope="module")
def tls_cluster():
    with LocalCluster(n_workers=1, threads_per_worker=2, security=True) as c:
        yield c


def test_computation_and_worker_to_worker_transfer_over_tls(tls_cluster):
    c = tls_cluster
    assert c.scheduler_address.startswith("tls://")
    sec = c.security
    for path in (sec.tls_cert, sec.tls_key):
        assert mode(path) == 0o600
    assert mode(Path(sec.tls_key).parent) == 0o700
    with Client(c) as client:
        assert client.submit(sum, [1, 2, 3]).result(timeout=30) == 6
        assert client.submit(_inner_sum, 41).result(timeout=30) == 42      # get_client() in a task
        x = client.submit(_make, 4000, pure=False)                         # ~1 MB on worker-0
        x.result(timeout=30)
        c.scale(2)
        client.wait_for_workers(2, timeout=30)
        workers = client.scheduler_info()["workers"]
        assert all(a.startswith("tls://") for a in workers)
        client.replicate(x, n=2, timeout=30)                               # worker-1 fetches it from worker-0
        who_has = client._lt.run(client._request({"op": "who-has", "keys": [x.key]}), 30)[x.key]
        assert len(who_has) == 2 and all(a.startswith("tls://") for a in who_has)
        c._stop_worker("worker-0")                                         # only the copy is left
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 1, 20, "worker-0 to leave")
        assert client.gather(x, timeout=30) == _make(4000)
        c.scale(1)


def test_cleartext_peers_are_refused_and_the_cluster_serves_on(tls_cluster):
    c = tls_cluster
    cleartext = c.scheduler_address.replace("tls://", "tcp://")
    with pytest.raises(ConnectionError):        # speaks our protocol in clear to a TLS port
        Client(cleartext, secret=c.secret, timeout=10)
    with pytest.raises(ConnectionError, match="speaks TLS: pass the cluster's security="):
        Client(c.scheduler_address, secret=c.secret, timeout=10)
    with pytest.raises(ConnectionError, match="not a TLS address but security= asks for encryption"):
        Client(cleartext, secret=c.secret, security=c.security, timeout=10)
    wait_until(lambda: "dropped connection" in c.logs()["scheduler"], 10, "the scheduler to log the drop")
    # Our own certificates are needed, not just any: a CA of another cluster is refused.
    from hpc_cluster.protocol.tls import Security
    other = Security.temporary(Path(c._tmp.name) / "other-tls")
    with pytest.raises(AuthenticationError, match="TLS handshake"):
        Client(c.scheduler_address, secret=c.secret, security=other, timeout=10)
    with Client(c.scheduler_address, secret=c.secret, security=c.security) as client:
        assert client.submit(sum, [2, 2]).result(timeout=30) == 4


class _Sniffer:
    """A TCP relay on 127.0.0.1 that keeps every byte it forwards (both ways)."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.seen = target, bytearray()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._socks: list[socket.socket] = [self.server]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            self._socks += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            with self._lock:
                self.seen += data
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self):
        for s in self._socks:
            s.close()


def _sniffed_submission(cluster) -> bytes:
    from hpc_cluster.protocol.comm import parse_address
    sniffer = _Sniffer(parse_address(cluster.scheduler_address))
    scheme = cluster.scheduler_address.split("://")[0]
    try:
        tls = {"security": cluster.security} if getattr(cluster, "security", None) else {}
        with Client(f"{scheme}://127.0.0.1:{sniffer.port}", secret=cluster.secret, **tls) as client:
            assert client.submit(len, PAYLOAD).result(timeout=30) == len(PAYLOAD)
        return bytes(sniffer.seen)
    finally:
        sniffer.close()


def test_payload_does_not_cross_the_wire_in_clear(tls_cluster):
    seen = _sniffed_submission(tls_cluster)
    assert len(seen) > len(PAYLOAD)              # the submission did go through the relay
    assert PAYLOAD[:32] not in seen
    assert b"HPCC" not in seen                   # nor our handshake: it runs inside TLS


def test_the_sniffer_does_see_a_cleartext_cluster():
    """The control: with security=False the same submission is readable on the wire."""
    with LocalCluster(n_workers=1, threads_per_worker=1, security=False) as c:
        seen = _sniffed_submission(c)
    assert PAYLOAD[:32] in seen and b"HPCC" in seen


def test_dask_security_objects_are_taken():
    from distributed.security import Security as DaskSecurity
    with LocalCluster(n_workers=1, threads_per_worker=1, security=DaskSecurity.temporary()) as c, \
            Client(c) as client:
        assert c.scheduler_address.startswith("tls://")
        assert mode(c.security.tls_key) == 0o600              # the in-memory key, written 0600
        assert client.submit(sum, [1, 1]).result(timeout=30) == 2
    with pytest.raises(ValueError, match="asks for encryption but does not give both a CA"):
        LocalCluster(n_workers=0, security=DaskSecurity(require_encryption=True))


def test_batch_cluster_with_security_true_runs_over_tls(sim, tmp_path):
    """PBSCluster (the daemon that SLURMCluster uses too) with dask's security=True and
    protocol='tls', against the command-level PBS simulator: the job's worker reads the
    certificate's paths from the cluster file and joins over TLS; the files go with the cluster."""
    from hpc_cluster.deploy.cluster import PBSCluster
    from hpc_cluster.protocol.clusterfile import read_cluster_file
    cluster = PBSCluster(cores=1, memory="1GB", walltime="00:10:00", security=True, protocol="tls",
                         log_directory=str(tmp_path / "logs"))
    try:
        assert cluster.scheduler_address.startswith("tls://")
        tls = read_cluster_file(cluster.cluster_file)["tls"]
        assert {mode(tls["cert"]), mode(tls["key"]), mode(Path(tls["key"]).parent)} == {0o600, 0o700}
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=120)
            assert all(a.startswith("tls://") for a in client.scheduler_info()["workers"])
            assert client.submit(lambda x: x + 1, 10).result(timeout=60) == 11
        with pytest.raises(ConnectionError, match="speaks TLS"):
            Client(cluster.scheduler_address, secret=cluster.secret, timeout=10)
    finally:
        cluster.close()
    assert not Path(tls["key"]).parent.exists()


def _scheme(cluster) -> str:
    """The scheme of a batch cluster's address, checked against what the cluster file says."""
    from hpc_cluster.protocol.clusterfile import read_cluster_file
    scheme = cluster.scheduler_address.split("://")[0]
    assert ("tls" in read_cluster_file(cluster.cluster_file)) == (scheme == "tls") == (cluster.security is not None)
    return scheme


def test_batch_clusters_are_tls_unless_told_otherwise(sim, monkeypatch, tmp_path):
    """Issue 34, point 3: no keyword is TLS; security=False, protocol='tcp://', a site's `security:
    false` ($HPC_CLUSTER_SECURITY or a site file) and jobqueue.yaml's scheduler-options are plain
    TCP; an explicit keyword wins over the site. The dashboard listens on 127.0.0.1."""
    import dask

    from hpc_cluster.deploy.cluster import PBSCluster
    job = {"cores": 1, "memory": "1GB", "walltime": "00:10:00"}
    with PBSCluster(**job) as cluster:
        assert _scheme(cluster) == "tls"
        assert cluster.dashboard_link.startswith("http://127.0.0.1:")
        with Client(cluster) as client:
            assert client.scheduler_info()["workers"] == {}        # connected, over TLS
    for keywords in ({"security": False}, {"protocol": "tcp://"}, {"scheduler_options": {"protocol": "tcp"}}):
        with PBSCluster(**job, **keywords) as cluster:
            assert _scheme(cluster) == "tcp", keywords
    for section in ({"scheduler-options": {"protocol": "tcp://"}}, {"security": False}):
        with dask.config.set({f"jobqueue.pbs.{k}": v for k, v in section.items()}), PBSCluster(**job) as cluster:
            assert _scheme(cluster) == "tcp", section             # jobqueue.yaml's, not ignored
    site = tmp_path / "site.yaml"
    site.write_text("default: plain\nsites:\n  plain:\n    batch: pbs\n    security: false\n")
    with PBSCluster(**job, config=str(site)) as cluster:
        assert _scheme(cluster) == "tcp"
    monkeypatch.setenv("HPC_CLUSTER_SECURITY", "false")
    with PBSCluster(**job) as cluster:
        assert _scheme(cluster) == "tcp"
        with Client(cluster) as client:
            assert client.scheduler_info()["workers"] == {}
    for keywords in ({"security": True}, {"protocol": "tls://"}):     # a keyword wins over the site
        with PBSCluster(**job, **keywords) as cluster:
            assert _scheme(cluster) == "tls", keywords


def test_dask_jobqueues_security_object_and_protocol_keep_their_meaning(sim, tmp_path):
    """dask-jobqueue's pair, security=Security(...) with protocol='tls' (its test_security), on
    the user's own files: used as they are, and left in place when the cluster closes."""
    from hpc_cluster.deploy.cluster import PBSCluster
    from hpc_cluster.protocol.clusterfile import read_cluster_file
    from hpc_cluster.protocol.tls import Security
    made = Security.temporary(tmp_path / "mine")
    from distributed.security import Security as DaskSecurity
    theirs = DaskSecurity(tls_ca_file=made.tls_ca_file, tls_scheduler_cert=made.tls_cert,
                          tls_scheduler_key=made.tls_key, tls_worker_cert=made.tls_cert,
                          tls_worker_key=made.tls_key, require_encryption=True)
    with PBSCluster(cores=1, memory="1GB", walltime="00:10:00", security=theirs, protocol="tls") as cluster:
        assert _scheme(cluster) == "tls"
        assert read_cluster_file(cluster.cluster_file)["tls"] == made.to_dict()
        with Client(cluster) as client:
            assert client.scheduler_info()["workers"] == {}
    assert all(Path(p).exists() for p in made.to_dict().values())     # the user's files stay


def _outside_address() -> str:
    """An IPv4 address of this machine that is not loopback (skips where there is none)."""
    import psutil
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.skip("this machine has no IPv4 address but loopback")


def test_a_local_cluster_beyond_loopback_is_tls_and_its_dashboard_stays_local():
    """LocalCluster: plain TCP on 127.0.0.1 (its default: loopback cannot be read by another
    unprivileged user), TLS by default on any other host; its dashboard on 127.0.0.1 either way
    unless dashboard_address names a host."""
    host = _outside_address()
    with LocalCluster(n_workers=1, threads_per_worker=1, host=host, dashboard_address=":0") as c, \
            Client(c) as client:
        assert c.scheduler_address.startswith(f"tls://{host}:") and c.security is not None
        assert all(a.startswith("tls://") for a in client.scheduler_info()["workers"])
        assert client.submit(sum, [1, 2]).result(timeout=30) == 3
        assert c.dashboard_link.startswith("http://127.0.0.1:")
    with LocalCluster(n_workers=0, host=host, security=False, dashboard_address=None) as c:
        assert c.scheduler_address.startswith("tcp://") and c.security is None
    with LocalCluster(n_workers=0, dashboard_address=None) as c:
        assert c.scheduler_address.startswith("tcp://127.0.0.1:") and c.security is None
    with LocalCluster(n_workers=0, protocol="tls://", dashboard_address=None) as c:     # distributed's keyword
        assert c.scheduler_address.startswith("tls://127.0.0.1:")
    with LocalCluster(n_workers=0, dashboard_address=f"{host}:0") as c:       # a host, as asked
        assert c.dashboard_link.startswith(f"http://{host}:")
        assert "over plain HTTP: its token crosses the network in clear" in c.logs()["scheduler"]


def test_a_batch_clusters_dashboard_stays_on_loopback_unless_given_a_host(sim):
    """The daemon's dashboard (plain HTTP behind its token) listens on 127.0.0.1 even where the
    scheduler listens on the network; a dashboard_address with a host is taken as asked, and the
    daemon's log says that its token then crosses the network in clear."""
    from hpc_cluster.deploy.cluster import PBSCluster
    host = _outside_address()
    job = {"cores": 1, "memory": "1GB", "walltime": "00:10:00"}
    with PBSCluster(**job, scheduler_options={"host": host}) as cluster:
        assert cluster.scheduler_address.startswith(f"tls://{host}:")
        assert cluster.dashboard_link.startswith("http://127.0.0.1:")
    with PBSCluster(**job, scheduler_options={"host": host, "dashboard_address": f"{host}:0"}) as cluster:
        assert cluster.dashboard_link.startswith(f"http://{host}:")
        assert "over plain HTTP: its token crosses the network in clear" in Path(cluster.daemon_log).read_text()
