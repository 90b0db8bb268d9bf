"""fakebatch: a batch system small enough to read in one sitting, for the example adapter.

Like `at`, it runs each submitted script at once on this machine, under a watcher process of
its own that enforces the job's time limit and writes down how it ended. Four commands:

    fbsub  < script.sh     prints the job id
    fbstat ID...           one '|'-separated line per known job, with a header
    fbdel  ID...           ends the jobs (SIGTERM to the job's process group, then SIGKILL)
    python -m hpc_cluster_fakebatch.commands watch ID    (started by fbsub; not for users)

Directives are lines `#FB --time=SECONDS`, `#FB --name=NAME`, `#FB --output=PATH` (`%j` is the
job id), `#FB --grace=SECONDS` (between SIGTERM and SIGKILL at the time limit; default 5).
Records live in $FAKEBATCH_SPOOL (default ~/.fakebatch), one JSON file per job.
It has no memory limit: a job over its memory is whatever the kernel makes of it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HEADER = "ID|NAME|STATE|EXIT|SIGNAL|ELAPSED|LIMIT|START|END|NODE"
KILL_WAIT = 5          # seconds between SIGTERM and SIGKILL, at the limit and on fbdel


def spool() -> Path:
    path = Path(os.environ.get("FAKEBATCH_SPOOL") or Path.home() / ".fakebatch")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _locked(fn):
    """Run fn(records_dir) holding the spool's lock: fbdel and the watcher write one record."""
    with open(spool() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return fn(spool())


def _read(job_id: str) -> dict | None:
    path = spool() / f"{job_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _write(record: dict) -> None:
    path = spool() / f"{record['id']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)                       # readers never see half a record


def _update(job_id: str, **changes) -> dict:
    def change(_):
        record = _read(job_id) or {}
        record.update(changes)
        _write(record)
        return record
    return _locked(change)


def _directives(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("#FB --") and "=" in line:
            key, _, value = line[len("#FB --"):].partition("=")
            out[key.strip()] = value.strip()
    return out


def submit() -> int:
    script = sys.stdin.read()
    if not script.startswith("#!"):
        print("fbsub: the script must start with #! (an interpreter line)", file=sys.stderr)
        return 1
    given = _directives(script)
    try:
        limit = int(given.get("time", "3600"))
        grace = int(given.get("grace", str(KILL_WAIT)))
    except ValueError:
        print(f"fbsub: --time={given.get('time')!r} or --grace={given.get('grace')!r} is not a number of seconds",
              file=sys.stderr)
        return 1

    def next_id(directory: Path) -> str:
        counter = directory / ".next"
        n = int(counter.read_text()) if counter.exists() else 1
        counter.write_text(str(n + 1))
        return str(n)
    job_id = _locked(next_id)
    (spool() / f"{job_id}.sh").write_text(script)
    output = given.get("output", str(Path.cwd() / "fakebatch-%j.out")).replace("%j", job_id)
    _write({"id": job_id, "name": given.get("name", "job"), "state": "pending", "limit": limit, "grace": grace,
            "output": output, "cwd": os.getcwd(), "submitted": time.time()})
    subprocess.Popen([sys.executable, "-m", "hpc_cluster_fakebatch.commands", "watch", job_id],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    print(job_id)
    return 0


def watch(job_id: str) -> int:
    record = _read(job_id)
    if record.get("cancel"):
        _update(job_id, state="cancelled", end=time.time())
        return 0
    env = {**os.environ, "FAKEBATCH_JOB_ID": job_id}
    with open(record["output"], "ab") as out:
        proc = subprocess.Popen(["bash", str(spool() / f"{job_id}.sh")], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=record["cwd"], env=env, start_new_session=True)
    start = time.time()
    _update(job_id, state="running", pgid=proc.pid, start=start, node=socket.gethostname())
    timed_out = False
    try:
        proc.wait(timeout=record["limit"])
    except subprocess.TimeoutExpired:
        timed_out = True
        with open(record["output"], "a") as out:
            out.write(f"fakebatch: job {job_id} killed: time limit of {record['limit']} s reached\n")
        _end(proc, record.get("grace", KILL_WAIT))
    code = proc.returncode
    latest = _read(job_id)
    if latest.get("cancel"):
        state = "cancelled"
    elif timed_out:
        state = "timeout"
    else:
        state = "completed" if code == 0 else "failed"
    _update(job_id, state=state, exit=code if code >= 0 else None, signal=-code if code < 0 else None,
            end=time.time(), elapsed=round(time.time() - start))
    return 0


def _end(proc: subprocess.Popen, grace: float = KILL_WAIT) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def stat(ids: list[str]) -> int:
    print(HEADER)
    missing = 0
    for job_id in ids:
        r = _read(job_id)
        if r is None:
            print(f"fbstat: unknown job {job_id}", file=sys.stderr)
            missing += 1
            continue
        elapsed = r.get("elapsed")
        if elapsed is None and r.get("start"):
            elapsed = round(time.time() - r["start"])
        fields = [job_id, r["name"], r["state"], r.get("exit"), r.get("signal"), elapsed, r["limit"],
                  _when(r.get("start")), _when(r.get("end")), r.get("node")]
        print("|".join("" if f is None else str(f) for f in fields))
    return 1 if missing == len(ids) and ids else 0


def _when(t: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else None


def delete(ids: list[str]) -> int:
    rc = 0
    for job_id in ids:
        r = _read(job_id)
        if r is None:
            print(f"fbdel: unknown job {job_id}", file=sys.stderr)
            rc = 1
        elif r["state"] not in ("pending", "running"):
            print(f"fbdel: job {job_id} already finished", file=sys.stderr)
            rc = 1
        else:
            r = _update(job_id, cancel=True, cancelled_by=os.environ.get("USER") or str(os.getuid()))
            if r.get("pgid"):
                try:
                    os.killpg(r["pgid"], signal.SIGTERM)
                except ProcessLookupError:
                    pass
    return rc


def main_submit() -> int:
    return submit()


def main_stat() -> int:
    return stat(sys.argv[1:])


def main_delete() -> int:
    return delete(sys.argv[1:])


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"]:
        sys.exit(watch(sys.argv[2]))
    sys.exit({"sub": main_submit, "stat": main_stat, "del": main_delete}[sys.argv.pop(1)]())
