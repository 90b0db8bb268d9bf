"""A real one-host Grid Engine for the SGE tests: brought up if needed, never mocked."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers.sge import CLUSTER_SH, gridengine_is_up


@pytest.fixture(scope="session")
def gridengine():
    """The gridengine, up: started with cluster.sh when we are root; skipped loudly otherwise."""
    if gridengine_is_up():
        return
    if os.geteuid() != 0:
        pytest.skip(f"SGE TESTS SKIPPED: the test gridengine is not up and we are not root to start it. "
                    f"Run `sudo {CLUSTER_SH} up` first.")
    proc = subprocess.run(["bash", str(CLUSTER_SH), "up"], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"{CLUSTER_SH} up failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
