"""The state directory the three batch-system simulators share the layout of (pbssim.py here,
../lsf_sim/lsfsim.py, ../htcondor_sim/condorsim.py): $<SYSTEM>_SIM_HOME/seq numbers the jobs,
jobs/<n>/job.json holds one job's record (a PBS job, an LSF job, an HTCondor ad), beside its
script and pids. The simulators run as their own processes (bin/ puts this folder on sys.path),
so this is a module of its own rather than a tests/helpers one; plain stdlib, as they are.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import sys


def sim_home(variable: str, program: str) -> str:
    """The state directory named by the environment `variable` (made if missing); without it,
    `program` says so on stderr and exits 2, as a batch command run without its server would."""
    home = os.environ.get(variable)
    if not home:
        sys.stderr.write(f"{program}: set {variable} to the simulator's state directory\n")
        sys.exit(2)
    os.makedirs(os.path.join(home, "jobs"), exist_ok=True)
    return home


def job_dir(home: str, seq: int) -> str:
    return os.path.join(home, "jobs", str(seq))


def next_seq(home: str) -> int:
    """The next job number; the lock keeps two submissions at once from taking the same one."""
    with open(os.path.join(home, "seq"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read().strip()
        seq = int(text) + 1 if text else 1
        fh.seek(0)
        fh.truncate()
        fh.write(str(seq))
        return seq


def load(home: str, seq: int) -> dict:
    with open(os.path.join(job_dir(home, seq), "job.json")) as fh:
        return json.load(fh)


def save(home: str, seq: int, job: dict, indent: int | None = None) -> None:
    """Written aside then renamed: a status command reading meanwhile sees the old or the new record."""
    path = os.path.join(job_dir(home, seq), "job.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(job, fh, indent=indent)
    os.replace(tmp, path)


def directives(script: str, prefix: str) -> list[str]:
    """The words of the `prefix` lines (#PBS, #BSUB) up to the script's first command, as the
    batch system reads them: the shebang, blank lines and other comments are skipped."""
    found: list[str] = []
    for n, line in enumerate(script.splitlines()):
        stripped = line.strip()
        if n == 0 and stripped.startswith("#!") or not stripped:
            continue
        if stripped.startswith(prefix):
            found.extend(shlex.split(stripped[len(prefix):], comments=False))
        elif not stripped.startswith("#"):
            break
    return found
