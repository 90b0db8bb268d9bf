#!/usr/bin/env python3
"""Regenerate tests/unit/adapters/fixtures/slurm/*.txt from the real test cluster.

    sudo tests/batch/slurm/cluster.sh up && sudo python3 tests/batch/slurm/capture_fixtures.py

Runs the same scenario jobs as the integration tests (about 2.5 minutes: one of them
waits for a time limit), and saves what sbatch, squeue, sacct and scontrol printed about
them. manifest.json says which job id had which outcome, for the parser tests. The node
failure comes last, once nothing else is running, and the node is restored afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2]))                   # the repository: hpc_cluster
sys.path.insert(0, str(HERE.parents[1]))                   # tests/: helpers

from slurm_jobs import (fail_node, restore_node, scenarios, wait_final,  # noqa: E402
                        wait_running)

from hpc_cluster.adapters.slurm import SLURMAdapter  # noqa: E402
from hpc_cluster.runners.local import LocalRunner  # noqa: E402
from helpers.capture import command, saver, slurm_sacct, slurm_squeue  # noqa: E402

OUT = HERE.parents[1] / "unit" / "adapters" / "fixtures" / "slurm"


save = saver(OUT)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    adapter = SLURMAdapter(LocalRunner())
    node = command(["sinfo", "-h", "-N", "-o", "%N"], check=True).stdout.split()[0]
    logs = tempfile.mkdtemp(prefix="slurm-capture-")
    specs = scenarios(logs)
    ids: dict[str, str] = {}
    try:
        print("submitting scenario jobs")
        first = command(["sbatch", "--parsable"], input=adapter.render(specs["completed"]), check=True)
        save("sbatch_parsable.txt", first.stdout)
        ids["completed"] = first.stdout.strip()
        for name in ("exit3", "segfault", "oom", "timeout", "cancelled", "preempted"):
            ids[name] = adapter.submit(adapter.render(specs[name]))
        plain = command(["sbatch"], input=adapter.render(specs["exit3"].replace(job_name="t-plain")),
                        check=True)
        save("sbatch_plain.txt", plain.stdout)
        ids["plain"] = plain.stdout.split()[-1]
        federated = command(["sbatch", "--parsable", "--clusters", "hpctest"],
                            input=adapter.render(specs["exit3"].replace(job_name="t-cluster")), check=True)
        save("sbatch_parsable_cluster.txt", federated.stdout)
        ids["cluster"] = federated.stdout.strip().split(";")[0]

        wait_running(adapter, ids["cancelled"])
        command(["scancel", ids["cancelled"]], check=True)
        wait_running(adapter, ids["preempted"])
        ids["preemptor"] = adapter.submit(adapter.render(specs["preemptor"]))
        # Right away: the preemptor is usually still pending, others running or done.
        save("squeue_mixed.txt", slurm_squeue(ids.values()))
        save("sacct_running.txt", slurm_sacct(ids.values()))

        quick = [i for n, i in ids.items() if n != "timeout"]
        print("waiting for the quick jobs")
        wait_final(adapter, quick, timeout=120)
        # Before MinJobAge lets the controller forget them.
        save("scontrol_show_job.txt", command(["scontrol", "show", "job", ids["oom"]], check=True).stdout
             + "\n" + command(["scontrol", "show", "job", ids["timeout"]], check=True).stdout)
        save("scontrol_show_job_oneline.txt", command(["scontrol", "-o", "show", "job"], check=True).stdout)
        save("squeue_all.txt", slurm_squeue(ids.values()))

        print("waiting for the time limit (70-80 s)")
        wait_final(adapter, [ids["timeout"]], timeout=200)

        print("failing the node")
        ids["node_fail"] = adapter.submit(adapter.render(specs["node_fail"]))
        wait_running(adapter, ids["node_fail"])
        fail_node(node, ids["node_fail"])
        wait_final(adapter, [ids["node_fail"]], timeout=120)
        restore_node(node)

        save("sacct_all.txt", slurm_sacct(ids.values()))
        # Accounting turned off, as some sites run: a copy of slurm.conf saying so.
        conf = Path(logs) / "slurm.conf"
        conf.write_text(Path("/etc/slurm/slurm.conf").read_text().replace(
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageType=accounting_storage/none"))
        disabled = command(["sacct", "-P", "-j", ids["completed"]], env={**os.environ, "SLURM_CONF": str(conf)})
        save("sacct_disabled_stderr.txt", disabled.stderr)
        save("manifest.json", json.dumps({"node": node, "jobs": ids}, indent=2) + "\n")
    finally:
        adapter.cancel(list(ids.values()))


if __name__ == "__main__":
    main()
