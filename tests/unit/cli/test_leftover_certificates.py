"""The certificates made for a cluster (their private key inside) go with its other files
(issue 34): `down`/`list` removing a dead daemon's files left NAME.tls behind, and a resumed
cluster forgot its directory, so its close left it too."""

from __future__ import annotations

import pytest

from hpc_cluster.cli.lookup import _remove_leftovers
from hpc_cluster.deploy.launch import made_tls_directory
from hpc_cluster.protocol.clusterfile import cluster_file_for, new_secret, write_cluster_file
from hpc_cluster.protocol.tls import Security

pytestmark = pytest.mark.usefixtures("isolated_home")


def _left_by_dead_daemon(name: str):
    path = cluster_file_for(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_cluster_file(path, "tls://127.0.0.1:1", new_secret(), name=name, pid=None)
    tls = path.with_name(f"{name}.tls")
    tls.mkdir(mode=0o700)
    (tls / "key.pem").write_text("a private key")
    return path, tls


def test_removing_a_dead_clusters_files_removes_its_certificates():
    path, tls = _left_by_dead_daemon("gone")
    removed = _remove_leftovers("gone")
    assert not tls.exists() and tls in removed
    assert not path.exists()


def test_a_linked_certificate_directory_is_not_followed(tmp_path):
    path, tls = _left_by_dead_daemon("linked")
    (tls / "key.pem").unlink()
    tls.rmdir()
    elsewhere = tmp_path / "users-own"
    elsewhere.mkdir()
    (elsewhere / "key.pem").write_text("not ours")
    tls.symlink_to(elsewhere)
    _remove_leftovers("linked")
    assert (elsewhere / "key.pem").read_text() == "not ours"


def test_a_resumed_cluster_knows_the_directory_made_for_it(tmp_path):
    made = tmp_path / "c1.tls"
    own = tmp_path / "mine"
    assert made_tls_directory(Security(str(made / "ca.pem"), str(made / "cert.pem"), str(made / "key.pem")),
                              "c1") == made
    shared = tmp_path / ".hpc-cluster-c1-tls"
    assert made_tls_directory(Security(str(shared / "ca.pem"), str(shared / "c.pem"), str(shared / "k.pem")),
                              "c1") == shared
    # A user's own certificates, or another cluster's directory: not ours to remove.
    assert made_tls_directory(Security(str(own / "ca.pem"), str(own / "c.pem"), str(own / "k.pem")), "c1") is None
    assert made_tls_directory(Security(str(made / "ca.pem"), str(made / "c.pem"), str(made / "k.pem")), "c2") is None
    assert made_tls_directory(None, "c1") is None
