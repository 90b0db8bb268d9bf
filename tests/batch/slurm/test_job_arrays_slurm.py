"""Job arrays on the real SLURM (issue 18 point 5): `job_array: true` turns scale(4) into one
sbatch of a 4-element array, and from there each element is a job of its own: its workers'
names, scale-down, and the diagnosis of one element's death, found in its own accounting.

sbatch is counted by a shim on PATH (it logs its arguments and execs the real sbatch): the
daemon that submits is another process, so counting inside the adapter would not see it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers.funcs import inc
from helpers.wait import wait_until  # noqa: E402
from helpers.slurm import squeue_ids  # noqa: E402

from hpc_cluster import Client  # noqa: E402
from hpc_cluster.deploy.cluster import SLURMCluster  # noqa: E402

pytestmark = pytest.mark.slurm


@pytest.fixture
def sbatch_log(tmp_path, monkeypatch) -> Path:
    """Every sbatch the daemon runs, one line each (its arguments)."""
    real = shutil.which("sbatch")
    assert real, "no sbatch on PATH"
    shim_dir, log = tmp_path / "shim", tmp_path / "sbatch.log"
    shim_dir.mkdir()
    shim = shim_dir / "sbatch"
    shim.write_text(f'#!/bin/sh\necho "sbatch $*" >> {log}\nexec {real} "$@"\n')
    shim.chmod(0o755)
    log.write_text("")
    monkeypatch.setenv("PATH", f"{shim_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def _jobs(cluster) -> dict[str, dict]:
    return cluster.jobs


def test_scale_4_is_one_array_and_each_element_lives_and_dies_alone(slurm_cluster, sbatch_log, tmp_path):
    name = f"arr-{uuid.uuid4().hex[:4]}"
    logs = tmp_path / "logs"
    seen: set[str] = set()
    with SLURMCluster(cores=1, memory="500MB", walltime="00:10:00", log_directory=str(logs), name=name,
                      job_array=True) as cluster, Client(cluster) as client:
        try:
            cluster.scale(jobs=4)
            client.wait_for_workers(4, timeout=90)
            submissions = [line for line in sbatch_log.read_text().splitlines() if line]
            assert len(submissions) == 1, submissions           # one array, not four jobs

            jobs = _jobs(cluster)
            seen.update(jobs)
            array_id = next(iter(jobs)).split("_")[0]
            assert sorted(jobs) == [f"{array_id}_{i}" for i in range(4)], jobs
            workers = client.scheduler_info()["workers"].values()
            names = {w["name"]: str(w.get("job_id") or "") for w in workers}
            by_job = {j["job_id"]: j for j in cluster.status_table()["jobs"]}
            # Each element's worker carries the element's index and the element's id.
            assert sorted(names) == [f"{name}-{i}" for i in range(4)], names
            for job_id, row in by_job.items():
                assert row["worker_names"] == [f"{name}-{row['index']}"], row
                assert row["index"] == int(job_id.split("_")[1])
            # The element logs are named by element id, which `logs`/the diagnosis look up.
            assert {p.name for p in logs.glob("*.err")} >= {f"dask-worker-{j}.err" for j in jobs}, \
                sorted(p.name for p in logs.iterdir())

            assert client.gather(client.map(inc, range(40))) == list(range(1, 41))

            # Scale down: two elements retire, each alone; the other two stay.
            cluster.scale(jobs=2)

            def two_ended():
                js = _jobs(cluster)
                done = [j for j, row in js.items() if row["state"] in ("completed", "cancelled")]
                return done if len(done) == 2 else None
            ended = wait_until(two_ended, 60, "scale(2) to end two array elements", interval=0.2)
            client.wait_for_workers(2, timeout=1)
            alive = sorted(set(jobs) - set(ended))
            assert len(client.scheduler_info()["workers"]) == 2
            assert all(d["cause"] == "retired" and not d["blame"] for d in client.deaths()), client.deaths()

            # One remaining element cancelled by hand: that element's worker alone dies, diagnosed
            # from that element's own accounting record.
            victim, survivor = alive[-1], alive[0]
            victim_name = f"{name}-{victim.split('_')[1]}"
            subprocess.run(["scancel", victim], check=True)

            def victim_judged():
                ds = [d for d in client.deaths() if d["name"] == victim_name and d.get("final_at")]
                return ds[0] if ds else None
            death = wait_until(victim_judged, 60, f"a final verdict on {victim_name}", interval=0.2)
            assert death["cause"] == "cancelled" and not death["blame"], death
            assert death["job_id"] == victim, death
            assert any(f"job {victim} CANCELLED" in e for e in death["evidence"]), death["evidence"]
            others = [d for d in client.deaths() if d["name"] != victim_name]
            assert {d["cause"] for d in others} == {"retired"} and len(others) == 2, others
            survivor_name = f"{name}-{survivor.split('_')[1]}"
            # The survivor lives on; the cluster still wants 2 jobs, so a replacement (a new
            # index, 4 or more) may already have joined beside it (it did in CI), never an old one.
            names = [w["name"] for w in client.scheduler_info()["workers"].values()]
            assert survivor_name in names, names
            assert all(n == survivor_name or int(n.rsplit("-", 1)[1]) >= 4 for n in names), names
            assert _jobs(cluster)[survivor]["state"] == "running"
            assert client.submit(inc, 1).result(30) == 2
        finally:
            seen.update(_jobs(cluster))
    wait_until(lambda: not (seen & squeue_ids()), 60, "the array's elements to leave squeue")
