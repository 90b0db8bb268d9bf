"""What the fixture-capture scripts share (tests/batch/slurm/capture_*.py, tests/batch/sge/
capture_fixtures.py): they are run by hand on a real cluster, outside pytest, and save what the
batch system's commands printed as the parsers' fixtures. Each puts tests/ on sys.path itself."""

from __future__ import annotations

import subprocess
from pathlib import Path


def command(argv, timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    """A command's run with its output kept as text (check=, input=, env= as subprocess.run)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def saver(folder: Path, say: bool = True):
    """save(name, text): writes folder/name verbatim and, if `say`, says so with its line count."""
    def save(name: str, text: str) -> None:
        (folder / name).write_text(text)
        if say:
            print(f"  wrote {name} ({len(text.splitlines())} lines)")
    return save


# SLURM's two capture scripts ask squeue and sacct alike: in the adapter's own formats, so the
# fixtures are what the adapter parses. The import waits for the call: Grid Engine's script
# imports this module without the repository on sys.path.
def slurm_squeue(ids, header: bool = True) -> str:
    """squeue on `ids`, every state, in SQUEUE_FORMAT; with its header unless told (the parser
    must cope with it, and the fixture says what it holds). A failing squeue stops the capture."""
    from hpc_cluster.adapters.slurm_text import SQUEUE_FORMAT
    return command(["squeue", *([] if header else ["-h"]), "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT],
                   check=True).stdout


def slurm_sacct(ids) -> str:
    """sacct -P on `ids` with SACCT_FIELDS. A failing sacct stops the capture."""
    from hpc_cluster.adapters.slurm_text import SACCT_FIELDS
    return command(["sacct", "-P", "-j", ",".join(ids), "--format=" + ",".join(SACCT_FIELDS)], check=True).stdout
