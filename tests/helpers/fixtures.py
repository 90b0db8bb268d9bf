"""The outputs captured from real batch systems, and the check every rendered job script gets.

The captures live in tests/unit/adapters/fixtures/<system>/ (slurm, pbs, sge, lsf, htcondor; each
folder's SOURCES.md says where they come from, tests/batch/*/capture_*fixtures.py regenerate the
SLURM and Grid Engine ones). One reader for all: each adapter test had its own `read`/`fixture`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "adapters" / "fixtures"


def fixture(system: str, name: str) -> str:
    """The captured output `name` of `system` (a folder of FIXTURES)."""
    return (FIXTURES / system / name).read_text()


def manifest(system: str) -> dict:
    """`system`'s manifest.json: which captured job ended which way (written by its capture script)."""
    return json.loads(fixture(system, "manifest.json"))


def bash_n(script: str) -> None:
    """bash parses the rendered job script (`bash -n`: nothing runs); fails with bash's message and the script."""
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert proc.returncode == 0, f"{proc.stderr}\n---\n{script}"
