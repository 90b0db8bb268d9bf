"""A command-level LSF simulator: `bsub`, `bjobs`, `bkill` over a state directory.

State lives in $LSF_SIM_HOME, laid out as tests/helpers/pbs_sim's (simstate.py: jobs/<n>/job.json, script,
pids), whose process helpers it reuses. bsub starts a detached monitor per job that runs the script in
its own session and enforces what LSF enforces, ending the job as LSF reports it (the formats
of tests/unit/adapters/fixtures/lsf):

- the run limit (-W): SIGUSR2, then SIGKILL after the kill delay; EXIT, TERM_RUNLIMIT, and the
  exit code of the job's top process (140 for a process SIGUSR2 ends, as in real LSF reports);
- the memory limit (-M, in LSF_SIM_UNITS, kb by default, 1024-based as LSF reads it) over the
  RSS of the session: SIGINT, SIGTERM, then SIGKILL; EXIT, TERM_MEMLIMIT;
- bkill: the same three signals; EXIT, TERM_OWNER (a pending job ends at once).

`bjobs -a -o "<fields>" -json ID...` prints the requested fields upper case, with a record
{"JOBID": id, "ERROR": "Job <id> is not found"} for an unknown id (and exit 255).

Deliberate differences from a real LSF: one "minute" of -W and RUNTIMELIMIT is LSF_SIM_MINUTE
seconds (default 60), so tests can reach a run limit quickly; RUN_TIME is told on the same
clock (seconds x 60 / LSF_SIM_MINUTE), so run time and limit stay comparable as on a real LSF.
Limits are checked every 0.1 s; LSF_SIM_KILL_DELAY (default 1 s) separates the signals (real
LSF: JOB_TERMINATE_INTERVAL, 10 s). The job's PATH is the submitter's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pbs_sim"))
from pbssim import _killpg, cleanup, live_pids, session_usage  # noqa: E402
from simstate import directives, job_dir, load, next_seq, save, sim_home  # noqa: E402

__all__ = ["cleanup", "live_pids", "load", "main"]      # the tests' fixtures use these

POLL = 0.1
UNITS = {"kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}


def minute() -> float:
    return float(os.environ.get("LSF_SIM_MINUTE", "60"))


def lsf_time(t: float) -> str:
    return time.strftime("%b %d %H:%M", time.localtime(t))


# -- bsub ------------------------------------------------------------------------------------
_WITH_ARG = {"-J", "-q", "-P", "-n", "-R", "-M", "-W", "-o", "-e", "-cwd", "-u"}


def options(words: list[str], opts: dict) -> list[str]:
    i = 0
    while i < len(words):
        w = words[i]
        if w in _WITH_ARG:
            if i + 1 >= len(words):
                raise ValueError(f"{w}: option requires an argument")
            opts.setdefault(w, []).append(words[i + 1])
            i += 2
        elif w.startswith("-"):
            raise ValueError(f"{w}: Illegal option")
        else:
            return words[i:]
    return []


def run_limit(text: str) -> int:
    """-W [hours:]minutes -> minutes; ValueError otherwise."""
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2 and parts[1] < 60:
        return parts[0] * 60 + parts[1]
    raise ValueError(text)


def bsub(argv: list[str]) -> int:
    home = sim_home("LSF_SIM_HOME", "lsfsim")
    opts: dict = {}
    try:
        operands = options(argv, {})
        script = open(operands[0]).read() if operands else sys.stdin.read()
        options(directives(script, "#BSUB"), opts)
        limit_min = run_limit(opts["-W"][-1]) if "-W" in opts else None
        unit = UNITS[os.environ.get("LSF_SIM_UNITS", "kb").lower()]
        mem = int(opts["-M"][-1]) * unit if "-M" in opts else None
    except (ValueError, OSError, KeyError) as exc:
        sys.stderr.write(f"{exc}. Job not submitted.\n")
        return 255
    seq = next_seq(home)
    os.makedirs(job_dir(home, seq))
    with open(os.path.join(job_dir(home, seq), "script.sh"), "w") as fh:
        fh.write(script)
    queue = opts.get("-q", [None])[-1]
    cwd = opts.get("-cwd", [os.getcwd()])[-1]

    def path(flag):
        given = opts.get(flag, [None])[-1]
        return os.path.join(cwd, given.replace("%J", str(seq))) if given else None
    job = {"JOBID": str(seq), "JOB_NAME": opts.get("-J", ["NONAME"])[-1], "STAT": "PEND",
           "QUEUE": queue or "normal", "PROJ_NAME": opts.get("-P", ["default"])[-1], "EXIT_CODE": "",
           "EXIT_REASON": "", "PEND_REASON": "New job is waiting for scheduling;", "RUN_TIME": "0 second(s)",
           "RUNTIMELIMIT": f"{limit_min:.1f}" if limit_min is not None else "",
           "MAX_MEM": "", "MEMLIMIT": f"{mem // 1024**2} M" if mem else "", "EXEC_HOST": "",
           "SUBMIT_TIME": lsf_time(time.time()), "START_TIME": "", "FINISH_TIME": "",
           "_limit_s": limit_min * minute() if limit_min is not None else None, "_mem": mem, "_cwd": cwd,
           "_out": path("-o"), "_err": path("-e") or path("-o")}
    save(home, seq, job)
    env = {k: os.environ[k] for k in ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LSF_SIM_HOME",
                                       "LSF_SIM_MINUTE", "LSF_SIM_KILL_DELAY", "LSF_SIM_UNITS") if k in os.environ}
    with open(os.path.join(job_dir(home, seq), "env.json"), "w") as fh:
        json.dump(env, fh)
    monitor = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_monitor", str(seq)],
                               env={**os.environ, "LSF_SIM_HOME": home}, start_new_session=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(job_dir(home, seq), "monitor.pid"), "w") as fh:
        fh.write(str(monitor.pid))
    where = f"queue <{queue}>" if queue else "default queue <normal>"
    print(f"Job <{seq}> is submitted to {where}.")
    return 0


# -- the monitor (sbatchd's part) -----------------------------------------------------------------
def lsf_monitor(seq: int) -> int:
    home = sim_home("LSF_SIM_HOME", "lsfsim")
    jdir = job_dir(home, seq)
    job = load(home, seq)
    delete = os.path.join(jdir, "delete")
    if os.path.exists(delete):                   # killed while pending
        job.update({"STAT": "EXIT", "EXIT_REASON": "TERM_OWNER: job killed by owner", "PEND_REASON": "",
                    "FINISH_TIME": lsf_time(time.time()) + " L"})
        save(home, seq, job)
        return 0
    with open(os.path.join(jdir, "env.json")) as fh:
        env = json.load(fh)
    env.update({"LSB_JOBID": str(seq), "LSB_JOBNAME": job["JOB_NAME"], "LSB_QUEUE": job["QUEUE"]})
    out = open(job["_out"], "ab") if job["_out"] else subprocess.DEVNULL
    err = open(job["_err"], "ab") if job["_err"] else subprocess.DEVNULL
    start = time.time()
    proc = subprocess.Popen(["/bin/bash", os.path.join(jdir, "script.sh")], cwd=job["_cwd"], env=env,
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    with open(os.path.join(jdir, "job.pid"), "w") as fh:
        fh.write(str(proc.pid))
    job.update({"STAT": "RUN", "PEND_REASON": "", "EXEC_HOST": socket.gethostname(), "START_TIME": lsf_time(start)})
    save(home, seq, job)
    delay = float(os.environ.get("LSF_SIM_KILL_DELAY", "1"))
    reason, signals, next_at, max_rss, last = None, [], 0.0, 0, 0.0
    scale = 60.0 / minute()
    while proc.poll() is None:
        now = time.time()
        rss = session_usage(proc.pid)[0]
        max_rss = max(max_rss, rss)
        if reason is None:
            if os.path.exists(delete):
                reason, signals = "TERM_OWNER: job killed by owner", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
            elif job["_limit_s"] is not None and now - start > job["_limit_s"]:
                reason, signals = ("TERM_RUNLIMIT: job killed after reaching LSF run time limit",
                                   [signal.SIGUSR2, signal.SIGKILL])
            elif job["_mem"] and rss > job["_mem"]:
                reason, signals = ("TERM_MEMLIMIT: job killed after reaching LSF memory usage limit",
                                   [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
        if signals and now >= next_at:
            _killpg(proc.pid, signals.pop(0))
            next_at = now + delay
        if now - last >= 0.5:
            job.update({"RUN_TIME": f"{int((now - start) * scale)} second(s)", "MAX_MEM": f"{max_rss // 1024**2} Mbytes"})
            save(home, seq, job)
            last = now
        time.sleep(POLL)
    _killpg(proc.pid, signal.SIGKILL)            # LSF ends every process of the job with it
    end = time.time()
    code = proc.returncode
    code = 128 - code if code < 0 else code      # a signal n shows as 128 + n
    job.update({"STAT": "DONE" if code == 0 and reason is None else "EXIT",
                "EXIT_CODE": "" if code == 0 else str(code), "EXIT_REASON": reason or "",
                "RUN_TIME": f"{int((end - start) * scale)} second(s)", "MAX_MEM": f"{max_rss // 1024**2} Mbytes",
                "FINISH_TIME": lsf_time(end) + " L"})
    save(home, seq, job)
    return 0


# -- bjobs and bkill -------------------------------------------------------------------------------
def bjobs(argv: list[str]) -> int:
    home = sim_home("LSF_SIM_HOME", "lsfsim")
    fields, as_json, ids, i = None, False, [], 0
    while i < len(argv):
        if argv[i] == "-o":
            fields, i = argv[i + 1].split(), i + 2
            continue
        if argv[i] == "-json":
            as_json = True
        elif not argv[i].startswith("-"):
            ids.append(argv[i])
        i += 1
    if not (fields and as_json):
        sys.stderr.write("lsfsim: only `bjobs -o \"fields\" -json [-a] ID...` is simulated\n")
        return 2
    records, rc = [], 0
    for job_id in ids:
        try:
            job = load(home, int(job_id))
        except (OSError, ValueError):
            records.append({"JOBID": job_id, "ERROR": f"Job <{job_id}> is not found"})
            rc = 255
            continue
        records.append({f.upper(): job.get(f.upper(), "") for f in fields})
    print(json.dumps({"COMMAND": "bjobs", "JOBS": len(records), "RECORDS": records}, indent=2))
    return rc


def bkill(argv: list[str]) -> int:
    home = sim_home("LSF_SIM_HOME", "lsfsim")
    rc = 0
    for job_id in [a for a in argv if not a.startswith("-")]:
        try:
            job = load(home, int(job_id))
        except (OSError, ValueError):
            sys.stderr.write(f"Job <{job_id}>: No matching job found\n")
            rc = 255
            continue
        if job["STAT"] in ("DONE", "EXIT"):
            sys.stderr.write(f"Job <{job_id}>: Job has already finished\n")
            rc = 255
            continue
        with open(os.path.join(job_dir(home, int(job_id)), "delete"), "w") as fh:
            fh.write(os.environ.get("USER", "root"))
        print(f"Job <{job_id}> is being terminated")
    return rc


def main(argv: list[str]) -> int:
    command, args = os.path.basename(argv[0]), argv[1:]
    if command == "_monitor" or (command == "lsfsim.py" and args[:1] == ["_monitor"]):
        return lsf_monitor(int(args[-1]))
    handler = {"bsub": bsub, "bjobs": bjobs, "bkill": bkill}.get(command)
    if handler is None:
        sys.stderr.write(f"lsfsim: unknown command {command!r}\n")
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
