"""A command-level PBS simulator: `qsub`, `qstat`, `qdel` over a state directory.

State lives in $PBS_SIM_HOME (one directory per job: job.json, the script, pids). qsub
starts a detached monitor per job that runs the script in its own session and enforces
what a MOM enforces: walltime (Exit_status -29), memory as the RSS of the job's
processes (-27), and qdel (SIGTERM, then SIGKILL after a kill delay; the shell's death
by SIGTERM is recorded as 256+15 = 271 with substate 91, as OpenPBS does).

qstat prints the formats captured from real systems (tests/unit/adapters/fixtures/pbs):
`qstat -x -f -F json` like OpenPBS 22.05 and `qstat -f` text with tab-indented
continuation lines. PBS_SIM_FLAVOR=torque makes it behave like Torque instead: no -F
(rejected as an invalid option), completed jobs in state C with `exit_status`, and
Torque's codes (-11 walltime, -10 memory).

Deliberate differences from a real PBS: the job's PATH is the submitter's PATH (so test
jobs find the same python), output files are written directly rather than staged, and
limits are checked every 0.1 s instead of every MOM poll cycle. PBS_SIM_KILL_DELAY sets
the seconds between SIGTERM and SIGKILL (default 2; real PBS defaults to 10).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qstat_format import SERVER, as_torque, format_full, format_json, format_table  # noqa: E402
from simstate import directives, job_dir, load, next_seq, save, sim_home  # noqa: E402

POLL = 0.1


# -- state (the layout the three simulators share: simstate.py) ---------------------------
def flavor() -> str:
    return os.environ.get("PBS_SIM_FLAVOR", "openpbs").lower()


# qstat prints attributes in the server's order, not in the order they were set.
ORDER = ["Job_Name", "Job_Owner", "resources_used", "job_state", "queue", "server",
         "Account_Name", "Checkpoint", "ctime", "Error_Path", "exec_host", "exec_vnode",
         "Hold_Types", "Join_Path", "Keep_Files", "Mail_Points", "mtime", "Output_Path",
         "Priority", "qtime", "Rerunable", "Resource_List", "stime", "obittime", "session_id",
         "jobdir", "substate", "Variable_List", "comment", "etime", "run_count", "Exit_status",
         "Submit_arguments", "history_timestamp", "project", "Submit_Host"]


def save_job(home: str, seq: int, job: dict) -> None:
    """simstate.save with the attributes in qstat's order (the record is printed as stored)."""
    rank = {k: i for i, k in enumerate(ORDER)}
    save(home, seq, dict(sorted(job.items(), key=lambda kv: rank.get(kv[0], len(ORDER)))), indent=1)


def pbs_time(t: float) -> str:
    return time.asctime(time.localtime(t))      # what ctime(3) prints, as PBS does


def hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def parse_hms(text: str) -> int:
    seconds = 0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def parse_size(text: str) -> int:
    """PBS sizes are 1024-based: 16gb, 300mb, 1024kb, 4b, 2kw (words are 8 bytes)."""
    t = text.strip().lower()
    word = 8 if t.endswith("w") else 1
    t = t.rstrip("bw")
    scale = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}.get(t[-1:], 1)
    return int(t.rstrip("kmgtp")) * scale * word


def job_ids(home: str) -> list[int]:
    jobs = os.path.join(home, "jobs")
    return sorted(int(n) for n in os.listdir(jobs) if n.isdigit())


def find(home: str, job_id: str) -> int | None:
    seq_text = job_id.split(".", 1)[0]
    if not seq_text.isdigit() or ("." in job_id and job_id.split(".", 1)[1] != SERVER):
        return None
    seq = int(seq_text)
    return seq if os.path.exists(os.path.join(job_dir(home, seq), "job.json")) else None


# -- qsub ----------------------------------------------------------------------------
_WITH_ARG = set("NloeqAjWvmMPSa")


def parse_options(argv: list[str], opts: dict) -> list[str]:
    """Fill opts from qsub options; returns the operands left over."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return argv[i:]
        flag, rest = arg[1], arg[2:]
        if flag in _WITH_ARG:
            if not rest:
                i += 1
                if i >= len(argv):
                    raise ValueError(f"option requires an argument -- '{flag}'")
                rest = argv[i]
            if flag == "l":
                opts.setdefault("l", []).append(rest)
            else:
                opts[flag] = rest
        else:
            opts[flag] = True
        i += 1
    return []


def resource_list(specs: list[str]) -> dict:
    res: dict = {}
    for spec in specs:
        for item in spec.split(","):
            if "=" not in item:
                continue
            key, value = item.split("=", 1)
            res[key.strip()] = value.strip()
    select = res.get("select")
    if select:
        chunks = select.split(":")
        count = int(chunks[0]) if chunks[0].isdigit() else 1
        for part in chunks[1:] if chunks[0].isdigit() else chunks:
            k, _, v = part.partition("=")
            if k == "ncpus":
                res["ncpus"] = int(v) * count
            elif k == "mem":
                res["mem"] = f"{parse_size(v) * count // 1024}kb" if count > 1 else v
        res["nodect"] = count
        res.setdefault("place", "pack")
    nodes = res.get("nodes")
    if nodes and "ppn=" in nodes:
        res.setdefault("ncpus", int(nodes.split("ppn=")[1].split(":")[0]))
    res.setdefault("ncpus", 1)
    return dict(sorted(res.items(), key=lambda kv: kv[0].lower()))


def qsub(argv: list[str]) -> int:
    home = sim_home("PBS_SIM_HOME", "pbssim")
    opts: dict = {}
    try:
        cli = {}
        operands = parse_options(argv, cli)
        script = (open(operands[0]).read() if operands and operands[0] not in ("-", "--")
                  else sys.stdin.read())
        parse_options(directives(script, "#PBS"), opts)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"qsub: {exc}\n")
        return 2
    for key, value in cli.items():      # the command line wins over directives
        if key == "l":
            opts.setdefault("l", []).extend(value)
        else:
            opts[key] = value
    name = opts.get("N", "STDIN" if not operands else os.path.basename(operands[0]))
    if not name[:1].isalpha() or any(c.isspace() for c in name) or len(name) > 236:
        sys.stderr.write("qsub: illegal -N value\n")
        return 2
    res = resource_list(opts.get("l", []))
    for key in ("walltime", "mem"):
        try:
            if key in res:
                (parse_hms if key == "walltime" else parse_size)(res[key])
        except ValueError:
            sys.stderr.write(f"qsub: Illegal attribute or resource value Resource_List.{key}\n")
            return 2
    seq = next_seq(home)
    job_id = f"{seq}.{SERVER}"
    now = time.time()
    host = socket.gethostname()
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "root"
    workdir = os.getcwd()
    os.makedirs(job_dir(home, seq))
    with open(os.path.join(job_dir(home, seq), "script.sh"), "w") as fh:
        fh.write(script)

    def out_path(flag: str, suffix: str) -> str:
        given = opts.get(flag)
        if given is None:
            return f"{host}:{workdir}/{name}.{suffix}{seq}"
        path = given.split(":", 1)[1] if ":" in given and not given.startswith("/") else given
        path = os.path.join(workdir, path)
        if path.endswith("/") or os.path.isdir(path):
            path = os.path.join(path, f"{name}.{suffix}{seq}")
        return f"{host}:{os.path.normpath(path)}"

    held = bool(opts.get("h"))
    job = {
        "Job_Name": name, "Job_Owner": f"{user}@{host}",
        "job_state": "H" if held else "Q", "queue": opts.get("q", "workq"), "server": SERVER,
        "Checkpoint": "u", "ctime": pbs_time(now),
        "Error_Path": out_path("e", "e"), "Hold_Types": "u" if held else "n",
        "Join_Path": opts.get("j", "n"), "Keep_Files": "n", "Mail_Points": "a",
        "mtime": pbs_time(now), "Output_Path": out_path("o", "o"), "Priority": 0,
        "qtime": pbs_time(now), "Rerunable": "False", "Resource_List": res,
        "substate": 20 if held else 10,
        "Variable_List": {"PBS_O_HOME": os.environ.get("HOME", "/"),
                          "PBS_O_LOGNAME": user, "PBS_O_PATH": os.environ.get("PATH", ""),
                          "PBS_O_SHELL": os.environ.get("SHELL", "/bin/bash"),
                          "PBS_O_WORKDIR": workdir, "PBS_O_SYSTEM": "Linux",
                          "PBS_O_QUEUE": opts.get("q", "workq"), "PBS_O_HOST": host},
        "etime": pbs_time(now), "project": "_pbs_project_default", "Submit_Host": host,
    }
    if argv:
        job["Submit_arguments"] = " ".join(argv)
    if "A" in opts:
        job["Account_Name"] = opts["A"]
    save_job(home, seq, job)
    env = dict(os.environ) if opts.get("V") else {k: os.environ[k] for k in (
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "PBS_SIM_HOME", "PBS_SIM_FLAVOR",
        "PBS_SIM_KILL_DELAY") if k in os.environ}
    with open(os.path.join(job_dir(home, seq), "env.json"), "w") as fh:
        json.dump(env, fh)
    if not held:
        start_monitor(home, seq)
    print(job_id)
    return 0


def start_monitor(home: str, seq: int) -> None:
    monitor = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "_monitor", str(seq)],
        env={**os.environ, "PBS_SIM_HOME": home}, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(job_dir(home, seq), "monitor.pid"), "w") as fh:
        fh.write(str(monitor.pid))


# -- the monitor (the MOM's part) ------------------------------------------------------
def session_usage(sid: int) -> tuple[int, int, float]:
    """(rss bytes, vsz bytes, cpu seconds) summed over the processes of session `sid`."""
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    rss = vsz = 0
    cpu = 0.0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:            # field 6 of stat: session id
                continue
            with open(f"/proc/{name}/statm") as fh:
                size, resident = (int(x) for x in fh.read().split()[:2])
        except (OSError, IndexError, ValueError):
            continue
        rss += resident * page
        vsz += size * page
        cpu += sum(int(x) for x in fields[11:15]) / tick
    return rss, vsz, cpu


def _append(path: str, text: str) -> None:
    try:
        with open(path, "a") as fh:
            fh.write(text)
    except OSError:
        pass


def pbs_monitor(seq: int) -> int:
    home = sim_home("PBS_SIM_HOME", "pbssim")
    jdir = job_dir(home, seq)
    job = load(home, seq)
    if os.path.exists(os.path.join(jdir, "delete")):
        # Deleted while still queued: OpenPBS keeps it in history with no Exit_status.
        now = time.time()
        job.update({"job_state": "F", "substate": 91, "mtime": pbs_time(now),
                    "history_timestamp": int(now)})
        save_job(home, seq, job)
        return 0
    with open(os.path.join(jdir, "env.json")) as fh:
        env = json.load(fh)
    res = job["Resource_List"]
    host = socket.gethostname()
    ncpus = int(res.get("ncpus", 1))
    job_id = f"{seq}.{SERVER}"
    workdir = job["Variable_List"]["PBS_O_WORKDIR"]
    nodefile = os.path.join(jdir, "nodefile")
    with open(nodefile, "w") as fh:
        fh.write(f"{host}\n")
    env.update({
        "PBS_JOBID": job_id, "PBS_JOBNAME": job["Job_Name"], "PBS_O_WORKDIR": workdir,
        "PBS_O_HOST": job["Variable_List"]["PBS_O_HOST"], "PBS_QUEUE": job["queue"],
        "PBS_O_QUEUE": job["queue"], "PBS_O_HOME": job["Variable_List"]["PBS_O_HOME"],
        "PBS_O_PATH": job["Variable_List"]["PBS_O_PATH"], "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_NODEFILE": nodefile, "PBS_JOBDIR": env.get("HOME", "/"),
        "NCPUS": str(ncpus), "OMP_NUM_THREADS": str(ncpus), "TMPDIR": "/tmp",
    })
    out_file = job["Output_Path"].split(":", 1)[1]
    err_file = job["Error_Path"].split(":", 1)[1]
    join_oe = job.get("Join_Path") == "oe"
    start = time.time()
    with open(out_file, "ab") as out, open(err_file if not join_oe else out_file, "ab") as err:
        proc = subprocess.Popen(["/bin/bash", os.path.join(jdir, "script.sh")],
                                cwd=env.get("HOME", "/"), env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
    with open(os.path.join(jdir, "job.pid"), "w") as fh:
        fh.write(str(proc.pid))
    job.update({"job_state": "R", "substate": 42, "stime": pbs_time(start),
                "mtime": pbs_time(start), "exec_host": f"{host}/0*{ncpus}",
                "exec_vnode": f"({host}:ncpus={ncpus})", "session_id": proc.pid,
                "jobdir": env.get("HOME", "/"), "run_count": 1,
                "comment": f"Job run at {time.strftime('%a %b %d at %H:%M', time.localtime(start))}"
                           f" on ({host}:ncpus={ncpus})"})
    used = {"cpupercent": 0, "cput": "00:00:00", "mem": "0kb", "ncpus": ncpus, "vmem": "0kb",
            "walltime": "00:00:00"}
    job["resources_used"] = used
    save_job(home, seq, job)

    wall_limit = parse_hms(res["walltime"]) if "walltime" in res else None
    mem_limit = parse_size(res["mem"]) if "mem" in res else None
    kill_delay = float(os.environ.get("PBS_SIM_KILL_DELAY", "2"))
    reason = None            # 'walltime' | 'mem' | 'qdel'
    kill_at = None
    max_rss = max_vsz = 0
    cpu = 0.0
    last_save = 0.0
    delete_marker = os.path.join(jdir, "delete")
    while proc.poll() is None:
        now = time.time()
        rss, vsz, cpu_now = session_usage(proc.pid)
        max_rss, max_vsz, cpu = max(max_rss, rss), max(max_vsz, vsz), max(cpu, cpu_now)
        elapsed = int(now - start)
        if reason is None:
            if os.path.exists(delete_marker):
                reason, kill_at = "qdel", now + kill_delay
                _killpg(proc.pid, signal.SIGTERM)
            elif wall_limit is not None and now - start > wall_limit:
                reason, kill_at = "walltime", now + kill_delay
                _append(err_file, f"=>> PBS: job killed: walltime {elapsed + 1} exceeded limit "
                                  f"{wall_limit}\n")
                _killpg(proc.pid, signal.SIGTERM)
            elif mem_limit is not None and rss > mem_limit:
                # Memory can grow faster than a kill delay: no grace period here.
                reason = "mem"
                _append(err_file, f"=>> PBS: job killed: mem {rss // 1024}kb exceeded limit "
                                  f"{mem_limit // 1024}kb\n")
                _killpg(proc.pid, signal.SIGKILL)
        elif kill_at is not None and now >= kill_at:
            _killpg(proc.pid, signal.SIGKILL)
            kill_at = None
        if now - last_save >= 0.5:
            used.update({"walltime": hms(now - start), "mem": f"{max_rss // 1024}kb",
                         "vmem": f"{max_vsz // 1024}kb", "cput": hms(cpu),
                         "cpupercent": int(100 * cpu / max(now - start, 1e-3))})
            job["mtime"] = pbs_time(now)
            save_job(home, seq, job)
            last_save = now
        time.sleep(POLL)
    _killpg(proc.pid, signal.SIGKILL)   # PBS ends every process of the job with it
    end = time.time()
    code = proc.returncode
    status = 256 - code if code < 0 else code    # died of signal n -> 256 + n, as the MOM records
    torque = flavor() == "torque"
    if reason == "walltime":
        status = -11 if torque else -29
    elif reason == "mem":
        status = -10 if torque else -27
    used.update({"walltime": hms(end - start), "mem": f"{max_rss // 1024}kb",
                 "vmem": f"{max_vsz // 1024}kb", "cput": hms(cpu)})
    substate = 91 if reason == "qdel" else (92 if status == 0 else 93)
    ending = {91: "terminated", 92: "finished", 93: "failed"}[substate]
    job.update({"job_state": "F", "substate": substate, "mtime": pbs_time(end),
                "obittime": pbs_time(end), "Exit_status": status,
                "comment": f"{job['comment']} and {ending}", "history_timestamp": int(end)})
    save_job(home, seq, job)
    return 0


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- qdel ------------------------------------------------------------------------------
def qdel(argv: list[str]) -> int:
    home = sim_home("PBS_SIM_HOME", "pbssim")
    rc = 0
    user = os.environ.get("USER") or "root"
    for job_id in [a for a in argv if not a.startswith("-")]:
        seq = find(home, job_id)
        if seq is None:
            sys.stderr.write(f"qdel: Unknown Job Id {job_id}\n")
            rc = 153
            continue
        job = load(home, seq)
        if job["job_state"] == "F":
            sys.stderr.write(f"qdel: Job has finished {job_id}\n")
            rc = 35
            continue
        if job["job_state"] == "H":     # no monitor runs for a held job; end it here
            now = time.time()
            job.update({"job_state": "F", "substate": 91, "mtime": pbs_time(now),
                        "history_timestamp": int(now)})
            save_job(home, seq, job)
            continue
        with open(os.path.join(job_dir(home, seq), "delete"), "w") as fh:
            fh.write(f"{user}@{socket.gethostname()}\n")
    return rc


# -- qstat -----------------------------------------------------------------------------
def qstat(argv: list[str]) -> int:
    home = sim_home("PBS_SIM_HOME", "pbssim")
    torque = flavor() == "torque"
    history = full = False
    fmt = None
    ids: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-F":
            if torque:
                sys.stderr.write("qstat: invalid option -- 'F'\nusage: qstat [-f [-1]] "
                                 "[-W site_specific] [-x] [ job_identifier... | destination... ]\n")
                return 2
            i += 1
            fmt = argv[i] if i < len(argv) else None
            if fmt != "json":
                sys.stderr.write("qstat: only -F json is simulated\n")
                return 2
        elif arg.startswith("-") and len(arg) > 1:
            for flag in arg[1:]:
                history |= flag == "x"
                full |= flag == "f"
        else:
            ids.append(arg)
        i += 1
    rc = 0
    shown: dict[str, dict] = {}
    wanted = ids or [f"{seq}.{SERVER}" for seq in job_ids(home)]
    for job_id in wanted:
        seq = find(home, job_id)
        if seq is None:
            sys.stderr.write(f"qstat: Unknown Job Id {job_id}\n")
            rc = 153
            continue
        job = load(home, seq)
        # Torque shows completed jobs (C) without -x; OpenPBS only with -x.
        if job["job_state"] == "F" and not history and not torque:
            if ids:
                sys.stderr.write(f"qstat: {seq}.{SERVER} Job has finished, use -x or -H to "
                                 f"obtain historical job information\n")
                rc = 35
            continue
        shown[f"{seq}.{SERVER}"] = as_torque(job) if torque else job
    if fmt == "json":
        sys.stdout.write(format_json(shown))
    elif full:
        sys.stdout.write("".join(format_full(k, v) for k, v in shown.items()))
    elif shown:
        sys.stdout.write(format_table(shown))
    return rc


# -- test helper ------------------------------------------------------------------------
def live_pids(home: str) -> list[int]:
    """The job and monitor processes of this simulator home still alive (zombies are not)."""
    live = []
    jobs = os.path.join(home, "jobs")
    for name in (os.listdir(jobs) if os.path.isdir(jobs) else []):
        for pidfile in ("job.pid", "monitor.pid"):
            try:
                with open(os.path.join(jobs, name, pidfile)) as fh:
                    pid = int(fh.read())
                with open(f"/proc/{pid}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except (OSError, ValueError, IndexError):
                continue
            if state != "Z":
                live.append(pid)
    return live


def cleanup(home: str) -> None:
    """Kill every monitor and job process group this simulator home started."""
    jobs = os.path.join(home, "jobs")
    if not os.path.isdir(jobs):
        return
    for name in os.listdir(jobs):
        for pidfile, group in (("job.pid", True), ("monitor.pid", False)):
            try:
                with open(os.path.join(jobs, name, pidfile)) as fh:
                    pid = int(fh.read())
                with open(f"/proc/{pid}/stat") as fh:
                    sid = int(fh.read().rsplit(")", 1)[1].split()[3])
            except (OSError, ValueError, IndexError):
                continue
            if sid != pid:          # not the session we started: the pid was reused
                continue
            try:
                if group:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def main(argv: list[str]) -> int:
    command, args = os.path.basename(argv[0]), argv[1:]
    if command == "pbssim.py" and args:
        command, args = args[0], args[1:]
    if command == "_monitor":
        return pbs_monitor(int(args[0]))
    handler = {"qsub": qsub, "qstat": qstat, "qdel": qdel}.get(command)
    if handler is None:
        sys.stderr.write(f"pbssim: unknown command {command!r}\n")
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
