"""A cluster that starts removes the files ended clusters left past log_retention (issue 34, point
4: daemon and SLURMCluster-*.log files piled up in ~/.config/hpc-cluster/clusters, 20 after one
afternoon), with real cluster daemons (PBSCluster on the command-level PBS simulator): a live
daemon's files stay however old they look, and `hpc-cluster clean` lists them as kept."""

from __future__ import annotations

import json

from hpc_cluster.protocol.clusterfile import clusters_dir
from helpers.cli import run_cli
from helpers.leftover_files import aged, ended_pid, left_by


def test_a_starting_cluster_removes_ended_clusters_old_files_and_spares_a_live_one(sim, tmp_path, capsys):
    from hpc_cluster.deploy.cluster import PBSCluster
    job = dict(cores=1, memory="1GB", walltime="00:10:00", log_directory=str(tmp_path / "logs"))
    first = PBSCluster(**job)
    try:
        live = sorted(p for p in clusters_dir().iterdir() if first.id in p.name)
        assert first.cluster_file in live
        aged(live, days=30)                 # as old as an ended cluster's: its daemon's pid keeps them
        ended = left_by("SLURMCluster-0f0f0f", "log") + left_by("crashed", "cluster", "log", "plan", "tls",
                                                                pid=ended_pid())
        aged(ended, days=30)
        recent = left_by("SLURMCluster-1e1e1e", "log")
        with PBSCluster(**job, log_retention="7d") as second:
            assert second.cluster_file.exists()
        assert not any(p.exists() for p in ended)
        assert all(p.exists() for p in live + recent)
        code, out, err = run_cli(capsys, "clean", "--all", "--json")
        assert code == 0, err
        by = {c["name"]: c for c in json.loads(out)["clusters"]}
        assert by[first.id]["state"] == "running" and by[first.id]["kept"] == "running"
        assert all(p.exists() for p in live) and not recent[0].exists()
    finally:
        first.close()


def test_log_retention_never_leaves_them(sim, tmp_path):
    from hpc_cluster.deploy.cluster import PBSCluster
    ended = left_by("SLURMCluster-0d0d0d", "log", "plan")
    aged(ended, days=365)
    with PBSCluster(cores=1, memory="1GB", walltime="00:10:00", log_retention="never"):
        pass
    assert all(p.exists() for p in ended)
