"""What the tests ask the real one-host Grid Engine directly (tests/batch/sge/cluster.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CLUSTER_SH = Path(__file__).resolve().parents[1] / "batch" / "sge" / "cluster.sh"


def gridengine_is_up() -> bool:
    """qstat is on PATH and cluster.sh says the test gridengine answers."""
    if shutil.which("qstat") is None:
        return False
    return subprocess.run(["bash", str(CLUSTER_SH), "status"], capture_output=True, timeout=60).returncode == 0
