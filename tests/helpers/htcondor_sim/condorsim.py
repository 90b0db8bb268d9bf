"""A command-level HTCondor simulator: condor_submit, condor_q, condor_rm, condor_history.

State lives in $CONDOR_SIM_HOME, laid out as tests/helpers/pbs_sim's (simstate.py: jobs/<cluster>/job.json,
pids), whose process helpers it reuses. condor_submit reads a submit description (stdin or a file):
`key = value` commands, `+Attr`/`MY.Attr` attributes, the macros $(ClusterId), $(ProcId),
$(DOLLAR), $(name) of an earlier command and $F(name) (quotes stripped), the "new" syntax of
`arguments` and `environment`, one `queue`. A detached monitor runs the executable as local
processes in a session of its own and does what a starter and schedd do, leaving the ads in
the formats of tests/unit/adapters/fixtures/htcondor:

- periodic_remove, evaluated every CONDOR_SIM_PERIODIC seconds (default 1; HTCondor: 60) over
  the job's attributes and time(): SIGTERM, SIGKILL, JobStatus 3 with the RemoveReason HTCondor
  writes ("The job attribute PeriodicRemove expression '...' evaluated to TRUE");
- RequestMemory (MB) over the session's RSS: the cgroup's SIGKILL, then JobStatus 5 (held),
  HoldReasonCode 34 and the starter's "Job has gone over cgroup memory limit of N megabytes.
  Peak usage: M megabytes. ..." message; a held job stays in the queue until condor_rm;
- condor_rm: SIGTERM, then SIGKILL after CONDOR_SIM_KILL_DELAY (default 1 s); JobStatus 3,
  "via condor_rm (by user X)"; a held job's HoldReason becomes its LastHoldReason;
- the end: JobStatus 4 with ExitCode, or ExitBySignal and ExitSignal.

condor_q -json prints the ads of queued (idle, running, held) jobs, condor_history -json those
that left; nothing at all when none match. Deliberate differences: the job's PATH and HOME are
the submitter's (as getenv would give), no file transfer, one job per cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pbs_sim"))
from pbssim import _killpg, cleanup, live_pids, session_usage  # noqa: E402
from simstate import job_dir, load, next_seq, save, sim_home  # noqa: E402

__all__ = ["cleanup", "live_pids", "load", "main"]      # the tests' fixtures use these
POLL = 0.1
_QUEUED = (1, 2, 5)


# -- the submit description ------------------------------------------------------------------------
def expand(value: str, macros: dict) -> str:
    def one(m):
        strip, name = m.group(1) == "F", m.group(2)
        if name.upper() == "DOLLAR":
            return "$"
        got = macros.get(name.lower())
        if got is None:
            return ""                               # condor_submit expands an unknown macro to nothing
        got = expand(got, macros)
        return got.strip('"') if strip else got
    out, i = [], 0
    for m in re.finditer(r"\$(F?)\(([A-Za-z_.][A-Za-z0-9_.]*)\)", value):
        out.append(value[i:m.start()])
        out.append(one(m))
        i = m.end()
    return "".join(out) + value[i:]


def split_new_syntax(text: str) -> list[str]:
    """HTCondor's new syntax inside the double quotes: words, '...' groups, '' and "" doubled."""
    text = text.strip()
    if text.startswith('"') and text.endswith('"'):
        text = text[1:-1].replace('""', '"')
    words, cur, i, quoted, have = [], [], 0, False, False
    while i < len(text):
        c = text[i]
        if c == "'":
            if quoted and text[i + 1:i + 2] == "'":
                cur.append("'")
                i += 2
                continue
            quoted, have = not quoted, True
        elif c.isspace() and not quoted:
            if cur or have:
                words.append("".join(cur))
            cur, have = [], False
        else:
            cur.append(c)
        i += 1
    if quoted:
        raise ValueError("unterminated ' in arguments/environment")
    if cur or have:
        words.append("".join(cur))
    return words


def parse_submit(text: str) -> tuple[dict, dict]:
    """(commands by lower-case name, job attributes from +Attr / MY.Attr)."""
    commands, attrs, queued = {}, {}, False
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.lower() == "queue" or s.lower().startswith("queue "):
            queued = True
            break
        if "=" not in s:
            raise ValueError(f"on Line {n} of submit file: {s!r} is not a valid submit command")
        key, value = (p.strip() for p in s.split("=", 1))
        if key.startswith("+") or key.upper().startswith("MY."):
            attrs[key.lstrip("+").split(".", 1)[-1] if key.upper().startswith("MY.") else key.lstrip("+")] = value
            commands[key.lower()] = value
        else:
            commands[key.lower()] = value
    if not queued:
        raise ValueError("no 'queue' statement in the submit description")
    return commands, attrs


def classad_value(text: str):
    """A literal of a submit value: a number, a boolean, a string; else the text (an expression)."""
    t = text.strip()
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if re.fullmatch(r"-?\d+\.\d*", t):
        return float(t)
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if len(t) >= 2 and t[0] == t[-1] == '"':
        return t[1:-1]
    return t


def evaluate(expr: str, ad: dict, now: float) -> bool:
    """A ClassAd expression of the kinds periodic_remove uses: attributes, numbers, time(),
    comparisons, && || !. An attribute the ad lacks is undefined: the expression is false."""
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", expr)) - {"time"}
    env = {}
    for name in names:
        key = name.split(".", 1)[-1] if name.upper().startswith(("MY.", "TARGET.")) else name
        value = next((v for k, v in ad.items() if k.lower() == key.lower()), None)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        env[name.replace(".", "_")] = value
    # ClassAd time() is whole seconds, as JobCurrentStartDate is: a float `now` made a limit
    # of 2 s fire 1.1 s after a start at x.9 (the walltime test's job then ran "1 s").
    py = expr.replace("&&", " and ").replace("||", " or ").replace("!=", " != ").replace("time()", str(int(now)))
    py = re.sub(r"!(?!=)", " not ", py)
    py = re.sub(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z0-9_]+", lambda m: m.group(0).replace(".", "_"), py)
    try:
        return bool(eval(py, {"__builtins__": {}}, env))      # noqa: S307  (our own test simulator)
    except Exception:
        return False


# -- condor_submit -----------------------------------------------------------------------------------
def condor_submit(argv: list[str]) -> int:
    home = sim_home("CONDOR_SIM_HOME", "condorsim")
    files, skip = [], False
    for a in argv:                               # -name SCHEDD (submit_command_extra): one schedd here
        if skip or a == "-name":
            skip = a == "-name"
        elif not a.startswith("-"):
            files.append(a)
    try:
        text = open(files[0]).read() if files else sys.stdin.read()
        commands, attrs = parse_submit(text)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"\nERROR: {exc}\n")
        return 1
    cluster = next_seq(home)
    macros = {**commands, "clusterid": str(cluster), "cluster": str(cluster), "procid": "0", "process": "0"}
    macros.update({k.lower(): v for k, v in attrs.items()})
    macros.update({f"my.{k.lower()}": v for k, v in attrs.items()})
    ad = {"ClusterId": cluster, "ProcId": 0, "JobStatus": 1, "QDate": int(time.time()),
          "EnteredCurrentStatus": int(time.time()), "Owner": os.environ.get("USER", "root"),
          "LastRejMatchReason": "no match found "}
    for key, value in attrs.items():
        ad[key] = classad_value(expand(value, macros))
    for key in ("RequestCpus", "RequestMemory", "RequestDisk"):
        if key.lower() in commands:
            ad[key] = classad_value(expand(commands[key.lower()], macros))
    if "periodic_remove" in commands:
        ad["PeriodicRemove"] = expand(commands["periodic_remove"], macros)
    try:
        run = {"executable": expand(commands["executable"], macros),
               "arguments": split_new_syntax(expand(commands.get("arguments", ""), macros)),
               "environment": split_new_syntax(expand(commands.get("environment", ""), macros)),
               "output": expand(commands.get("output", ""), macros), "error": expand(commands.get("error", ""), macros),
               "initialdir": expand(commands.get("initialdir", ""), macros) or os.getcwd()}
    except (KeyError, ValueError) as exc:
        sys.stderr.write(f"\nERROR: {exc}\n")
        return 1
    os.makedirs(job_dir(home, cluster))
    save(home, cluster, ad)
    with open(os.path.join(job_dir(home, cluster), "run.json"), "w") as fh:
        json.dump({**run, "env": {k: os.environ[k] for k in ("PATH", "HOME", "USER", "LANG") if k in os.environ}}, fh)
    monitor = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_monitor", str(cluster)],
                               env={**os.environ, "CONDOR_SIM_HOME": home}, start_new_session=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(job_dir(home, cluster), "monitor.pid"), "w") as fh:
        fh.write(str(monitor.pid))
    print(f"Submitting job(s).\n1 job(s) submitted to cluster {cluster}.")
    return 0


# -- the monitor (schedd, shadow and starter) ----------------------------------------------------------
def condor_monitor(cluster: int) -> int:
    home = sim_home("CONDOR_SIM_HOME", "condorsim")
    jdir = job_dir(home, cluster)
    remove_marker = os.path.join(jdir, "remove")
    with open(os.path.join(jdir, "run.json")) as fh:
        run = json.load(fh)
    ad = load(home, cluster)
    if os.path.exists(remove_marker):
        return _removed(home, cluster, ad, open(remove_marker).read().strip())
    env = dict(run["env"])
    for item in run["environment"]:
        key, _, value = item.partition("=")
        env[key] = value
    out = open(run["output"], "ab") if run["output"] else subprocess.DEVNULL
    err = open(run["error"], "ab") if run["error"] else subprocess.DEVNULL
    start = time.time()
    proc = subprocess.Popen([run["executable"], *run["arguments"]], cwd=run["initialdir"], env=env,
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    with open(os.path.join(jdir, "job.pid"), "w") as fh:
        fh.write(str(proc.pid))
    host = socket.gethostname()
    ad.update({"JobStatus": 2, "JobCurrentStartDate": int(start), "EnteredCurrentStatus": int(start),
               "RemoteHost": f"slot1_1@{host}", "NumJobStarts": 1})
    save(home, cluster, ad)
    periodic = float(os.environ.get("CONDOR_SIM_PERIODIC", "1"))
    delay = float(os.environ.get("CONDOR_SIM_KILL_DELAY", "1"))
    limit_mb = ad.get("RequestMemory") if isinstance(ad.get("RequestMemory"), int) else None
    peak, last_check, last_save, ending, kill_at = 0, start, 0.0, None, None
    while proc.poll() is None:
        now = time.time()
        peak = max(peak, session_usage(proc.pid)[0])
        if ending is None:
            if os.path.exists(remove_marker):
                ending = ("rm", open(remove_marker).read().strip())
            elif limit_mb is not None and peak > limit_mb * 2**20:
                ending = ("oom", None)
                _killpg(proc.pid, signal.SIGKILL)              # the cgroup's OOM killer: no grace
            elif ad.get("PeriodicRemove") and now - last_check >= periodic:
                last_check = now
                if evaluate(ad["PeriodicRemove"], {**ad, "JobStatus": 2}, now):
                    ending = ("periodic", ad["PeriodicRemove"])
            if ending and ending[0] != "oom":
                _killpg(proc.pid, signal.SIGTERM)
                kill_at = now + delay
        elif kill_at is not None and now >= kill_at:
            _killpg(proc.pid, signal.SIGKILL)
            kill_at = None
        if now - last_save >= 0.5:
            ad.update({"RemoteWallClockTime": float(int(now - start)), "MemoryUsage": peak // 2**20,
                       "ResidentSetSize": peak // 1024})
            save(home, cluster, ad)
            last_save = now
        time.sleep(POLL)
    _killpg(proc.pid, signal.SIGKILL)
    end = time.time()
    ad = load(home, cluster)
    ad.update({"RemoteWallClockTime": float(round(end - start)), "MemoryUsage": peak // 2**20,
               "ResidentSetSize": peak // 1024, "EnteredCurrentStatus": int(end), "LastRemoteHost": ad.pop("RemoteHost")})
    if ending and ending[0] == "oom":
        ad.update({"JobStatus": 5, "HoldReasonCode": 34, "HoldReasonSubCode": 0,
                   "HoldReason": f"Error from slot1_1@{host}: Job has gone over cgroup memory limit of {limit_mb} "
                                 f"megabytes. Peak usage: {peak // 2**20} megabytes.  Consider resubmitting with a "
                                 "higher request_memory."})
        save(home, cluster, ad)
        return _wait_held(home, cluster)
    if ending and ending[0] == "periodic":
        ad.update({"JobStatus": 3, "RemoveReason": f"The job attribute PeriodicRemove expression '{ending[1]}' "
                                                   "evaluated to TRUE"})
    elif ending and ending[0] == "rm":
        ad.update({"JobStatus": 3, "RemoveReason": f"via condor_rm (by user {ending[1]})"})
    else:
        code = proc.returncode
        ad.update({"JobStatus": 4, "CompletionDate": int(end), "ExitBySignal": code < 0})
        ad.update({"ExitSignal": -code} if code < 0 else {"ExitCode": code})
    save(home, cluster, ad)
    return 0


def _wait_held(home: str, cluster: int) -> int:
    marker = os.path.join(job_dir(home, cluster), "remove")
    while not os.path.exists(marker):
        time.sleep(POLL)
    return _removed(home, cluster, load(home, cluster), open(marker).read().strip())


def _removed(home: str, cluster: int, ad: dict, user: str) -> int:
    if ad.get("HoldReason"):
        ad["LastHoldReason"], ad["LastHoldReasonCode"] = ad.pop("HoldReason"), ad.pop("HoldReasonCode")
        ad.pop("HoldReasonSubCode", None)
    ad.update({"JobStatus": 3, "RemoveReason": f"via condor_rm (by user {user})", "EnteredCurrentStatus": int(time.time())})
    save(home, cluster, ad)
    return 0


# -- condor_q, condor_history, condor_rm ------------------------------------------------------------
def _query(argv: list[str], queued: bool) -> int:
    home = sim_home("CONDOR_SIM_HOME", "condorsim")
    attrs, ids, as_json, limit, i = None, [], False, None, 0
    while i < len(argv):
        a = argv[i]
        if a in ("-attributes", "-af"):
            attrs, i = argv[i + 1].split(","), i + 2
            continue
        if a in ("-limit", "-match"):
            limit, i = int(argv[i + 1]), i + 2
            continue
        if a == "-name":                           # a schedd's name: there is one here
            i += 2
            continue
        if a == "-json":
            as_json = True
        elif not a.startswith("-"):
            ids.append(a)
        i += 1
    if not as_json:
        sys.stderr.write("condorsim: only -json output is simulated\n")
        return 2
    clusters = sorted(int(n) for n in os.listdir(os.path.join(home, "jobs")) if n.isdigit())
    wanted = {int(j.split(".")[0]) for j in ids if j.split(".")[0].isdigit()} if ids else set(clusters)
    ads = []
    for cluster in clusters:
        if cluster not in wanted:
            continue
        try:
            ad = load(home, cluster)
        except (OSError, ValueError):
            continue
        if (ad["JobStatus"] in _QUEUED) == queued:
            ads.append({k: v for k, v in ad.items() if attrs is None or k in attrs})
    ads = ads[:limit] if limit else ads
    if ads:
        print(json.dumps(ads, indent=2))
    return 0


def condor_rm(argv: list[str]) -> int:
    home = sim_home("CONDOR_SIM_HOME", "condorsim")
    rc, user, skip = 0, os.environ.get("USER", "root"), False
    for a in argv:
        if skip or a == "-name":
            skip = a == "-name"
            continue
        cluster = int(a.split(".")[0]) if a.split(".")[0].isdigit() else None
        try:
            ad = load(home, cluster) if cluster is not None else None
        except (OSError, ValueError):
            ad = None
        if ad is None or ad["JobStatus"] not in _QUEUED:
            print(f"Job {a} not found")
            rc = 1
            continue
        with open(os.path.join(job_dir(home, cluster), "remove"), "w") as fh:
            fh.write(user)
        print(f"Job {a} marked for removal")
    return rc


def main(argv: list[str]) -> int:
    command, args = os.path.basename(argv[0]), argv[1:]
    if command == "condorsim.py" and args[:1] == ["_monitor"]:
        return condor_monitor(int(args[1]))
    handler = {"condor_submit": condor_submit, "condor_q": lambda a: _query(a, True),
               "condor_history": lambda a: _query(a, False), "condor_rm": condor_rm}.get(command)
    if handler is None:
        sys.stderr.write(f"condorsim: unknown command {command!r}\n")
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
