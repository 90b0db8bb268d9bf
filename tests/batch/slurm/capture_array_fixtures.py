#!/usr/bin/env python3
"""Regenerate tests/unit/adapters/fixtures/slurm/array_*.txt from the real test cluster (job arrays).

    sudo tests/batch/slurm/cluster.sh up && sudo python3 tests/batch/slurm/capture_array_fixtures.py

About 20 s. One held array (what squeue prints for pending elements: the range form
`ID_[0-7]`, and `ID_[3,5]` when asked for two of them), then one array whose elements end
differently by their index: 0 exits 0, 1 exits 3, 2 goes over its --mem (cgroup OOM), 4 is
scancel'ed on its own (`scancel ID_4`), 3 and 5 still run. manifest.json's "array" entry says
which ids these were, for the parser tests.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parents[1]))                   # tests/: helpers

from helpers.capture import command, saver, slurm_sacct, slurm_squeue  # noqa: E402

OUT = HERE.parents[1] / "unit" / "adapters" / "fixtures" / "slurm"

SCRIPT = """#!/bin/bash
#SBATCH -J arrcap
#SBATCH -o {logs}/arrcap-%A_%a.out
#SBATCH --mem=100M
#SBATCH -t 2
echo "id=$SLURM_JOB_ID arr=$SLURM_ARRAY_JOB_ID task=$SLURM_ARRAY_TASK_ID"
case $SLURM_ARRAY_TASK_ID in
 0) exit 0;;
 1) exit 3;;
 2) exec python3 -c "x = bytearray(400*1024*1024); import time; time.sleep(5)";;
 *) exec sleep 300;;
esac
"""


save = saver(OUT)


def stdout_of(argv, **kw) -> str:
    """The command's stdout; a failing command stops the capture (check=True)."""
    return command(argv, check=True, **kw).stdout


def main() -> None:
    logs = tempfile.mkdtemp(prefix="slurm-array-capture-")
    script = SCRIPT.format(logs=logs)
    held = stdout_of(["sbatch", "--parsable", "--hold", "--array=0-7"], input=script)
    save("array_sbatch_parsable.txt", held)
    held = held.strip()
    time.sleep(1)
    save("array_squeue_pending.txt", slurm_squeue([held]))
    save("array_squeue_pending_some.txt", slurm_squeue([f"{held}_3", f"{held}_5"], header=False))
    stdout_of(["scancel", held])
    array = stdout_of(["sbatch", "--parsable", "--array=0-5"], input=script).strip()
    deadline = time.time() + 60
    while time.time() < deadline:
        if slurm_squeue([f"{array}_4"], header=False).count("RUNNING") and "OUT_OF_MEMORY" in slurm_squeue([array]):
            break
        time.sleep(0.5)
    stdout_of(["scancel", f"{array}_4"])
    elements = [f"{array}_{i}" for i in range(6)]
    deadline = time.time() + 60
    while time.time() < deadline and "CANCELLED" not in slurm_sacct([f"{array}_4"]):
        time.sleep(0.5)
    save("array_squeue_elements.txt", slurm_squeue(elements, header=False))
    save("array_sacct_whole.txt", slurm_sacct([array]))
    save("array_sacct_elements.txt", slurm_sacct([f"{array}_2", f"{array}_4"]))
    stdout_of(["scancel", array])
    manifest = json.loads((OUT / "manifest.json").read_text())
    manifest["array"] = {"held": held, "array": array, "completed": f"{array}_0", "exit3": f"{array}_1",
                         "oom": f"{array}_2", "cancelled": f"{array}_4", "running": [f"{array}_3", f"{array}_5"],
                         "captured_by": "tests/batch/slurm/capture_array_fixtures.py (SLURM 22.05, this host's test "
                                        "cluster): array_*.txt"}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print("  manifest.json: array =", manifest["array"])


if __name__ == "__main__":
    main()
