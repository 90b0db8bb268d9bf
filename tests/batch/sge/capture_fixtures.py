#!/usr/bin/env python3
"""Regenerate tests/unit/adapters/fixtures/sge/ from the real one-host gridengine.

    sudo tests/batch/sge/cluster.sh up && sudo .venv/bin/python tests/batch/sge/capture_fixtures.py

Submits one job per ending (about 20 s: the walltime job waits for its 5 s h_rt), and saves
what qsub, qstat, qacct and qdel printed about them, verbatim. manifest.json says which job
id had which ending, for the parser tests (tests/unit/adapters/test_sge_parsers.py).
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))                   # tests/: helpers

from helpers import capture  # noqa: E402

OUT = HERE.parents[1] / "unit" / "adapters" / "fixtures" / "sge"
# Two processes of 200 MB under h_vmem=300M: each is under the limit alone, so neither
# allocation fails; their sum is over it, and execd kills the job (failed 37).
TWO_PROCESSES = """#!/bin/bash
python3 -c "import time; x = bytearray(200 * 10**6); time.sleep(30)" &
python3 -c "import time; x = bytearray(200 * 10**6); time.sleep(30)" &
wait
"""
SEGFAULT = "import ctypes; ctypes.string_at(0)"


run = functools.partial(capture.command, timeout=60)       # a hung qstat or qacct ends the capture
save = capture.saver(OUT, say=False)


def submit(args: list[str], logs: Path, script: str | None = None) -> tuple[str, str]:
    out = run(["qsub", "-j", "y", "-o", f"{logs}/", *args], input=script)
    if out.returncode != 0:
        sys.exit(f"qsub {args} failed: {out.stderr}")
    return out.stdout.split()[2], out.stdout       # "Your job 12 ("name") has been submitted"


def wait(what: str, condition, timeout: float = 60) -> None:
    # Not helpers.wait: a script run by hand, outside pytest, that ends with a message, not a traceback.
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.3)


def in_qacct(job_id: str) -> bool:
    return run(["qacct", "-j", job_id]).returncode == 0


def qstat_state(job_id: str) -> str | None:
    for line in run(["qstat"]).stdout.splitlines()[2:]:
        cells = line.split()
        if cells and cells[0] == job_id:
            return cells[4]
    return None


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="sge-capture-"))
    jobs: dict[str, str] = {}
    jobs["completed"], plain = submit(["-N", "t-completed", "-b", "y", "true"], logs)
    save("qsub.txt", plain)
    jobs["exit3"], _ = submit(["-N", "t-exit3", "-b", "y", "bash", "-c", "'exit 3'"], logs)
    jobs["segfault"], _ = submit(["-N", "t-segfault", "-b", "y", "python3", "-c", f"'{SEGFAULT}'"], logs)
    jobs["walltime"], _ = submit(["-N", "t-walltime", "-l", "h_rt=0:0:5", "-b", "y", "sleep", "60"], logs)
    jobs["vmem_kill"], _ = submit(["-N", "t-vmem-kill", "-l", "h_vmem=300M"], logs, TWO_PROCESSES)
    jobs["vmem_alloc"], _ = submit(["-N", "t-vmem-alloc", "-l", "h_vmem=200M", "-b", "y", "python3", "-c",
                                    "'x = bytearray(400 * 10**6)'"], logs)
    jobs["qdel_running"], _ = submit(["-N", "t-qdel", "-l", "h_rt=0:10:0,h_vmem=1G", "-b", "y", "sleep", "300"], logs)
    jobs["qdel_pending"], _ = submit(["-N", "t-held", "-h", "-b", "y", "sleep", "300"], logs)
    jobs["eqw"], _ = submit(["-N", "t-eqw", "-o", "/nonexistent/dir/", "-b", "y", "true"], logs)
    rejected = run(["qsub", "-q", "nosuch.q", "-b", "y", "true"])
    save("qsub_rejected_stderr.txt", rejected.stderr)

    wait("the qdel job running", lambda: qstat_state(jobs["qdel_running"]) == "r")
    wait("the broken job in error state", lambda: qstat_state(jobs["eqw"]) == "Eqw")
    save("qstat_xml.txt", run(["qstat", "-xml"]).stdout)
    save("qstat_j_eqw.txt", run(["qstat", "-j", jobs["eqw"]]).stdout)
    run(["qdel", jobs["qdel_running"], jobs["qdel_pending"]])
    save("qstat_xml_deleting.txt", run(["qstat", "-xml"]).stdout)

    for name in ("completed", "exit3", "segfault", "walltime", "vmem_kill", "vmem_alloc", "qdel_running"):
        wait(f"accounting of {name}", lambda: in_qacct(jobs[name]), timeout=90)
        save(f"qacct_{name}.txt", run(["qacct", "-j", jobs[name]]).stdout)
    save("qacct_not_found_stderr.txt", run(["qacct", "-j", jobs["qdel_pending"]]).stderr)
    save("qdel_finished.txt", run(["qdel", jobs["completed"]]).stdout)          # qdel says it on stdout
    run(["qdel", jobs["eqw"]])
    wait("an empty queue", lambda: not any(qstat_state(j) for j in jobs.values()))
    save("qstat_xml_empty.txt", run(["qstat", "-xml"]).stdout)
    (OUT / "manifest.json").write_text(json.dumps({"host": run(["hostname"]).stdout.strip(), "jobs": jobs},
                                                  indent=2) + "\n")
    print(f"saved {len(list(OUT.iterdir()))} files in {OUT}")


if __name__ == "__main__":
    main()
