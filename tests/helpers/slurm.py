"""What the tests ask the real SLURM test cluster directly, beside the adapter under test."""

from __future__ import annotations

import subprocess


def squeue_ids(squeue: str = "squeue", check: bool = True) -> set[str]:
    """The job ids squeue lists now (pending, running, completing). `squeue`: its path, where
    PATH holds stand-ins that must not be run (test_ssh_deploy.py). check=False: a failing
    squeue lists no job (the SLURM scenarios' cleanup records an outcome either way)."""
    out = subprocess.run([squeue, "-h", "-o", "%i"], capture_output=True, text=True, check=check, timeout=60)
    return set(out.stdout.split())


def squeue_named(name: str) -> set[str]:
    """The ids of the jobs named `name` that squeue lists now (pending, running, completing)."""
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, check=True,
                         timeout=60)
    return set(out.stdout.split())
