"""Evidence about a worker's death -> a verdict: cause, blame, explanation, advice.

Pure and table-driven. Evidence arrives in pieces: our own intent, the connection and the
nanny's exit report at once; the batch system's accounting record and the job's log tail
seconds later. `diagnose` is simply called again with more evidence and may refine the
verdict. The causes are the stable strings of DESIGN.md's table; only `memory-*` and
`crash` blame the tasks that were executing.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

CAUSES = ("retired", "walltime", "memory-batch", "memory-nanny", "crash", "startup", "cancelled",
          "preempted", "node-failure", "connection-lost", "heartbeat-lost", "unknown")
BLAMED = frozenset({"memory-batch", "memory-nanny", "crash"})
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})

# What the user should change, per cause: the "fix" part of every explanation.
ADVICE = {
    "retired": "nothing to do: the worker was asked to leave",
    "walltime": "raise walltime= (or the site's walltime), or split the work into shorter tasks",
    "memory-batch": "raise memory= (the job's request), use fewer processes= per job, or make the task use less memory",
    "memory-nanny": "raise memory= / memory_limit (the worker's budget) or memory_terminate_fraction, "
                    "or make the task use less memory",
    "crash": "the task killed its worker process: run it with client.recreate_error_locally() or in a "
             "local process to debug, check C extensions and their versions",
    "startup": "the job ended before its worker started: check python=, job_script_prologue and the "
               "environment in the job log (hpc-cluster logs JOB)",
    "cancelled": "someone cancelled the job (scancel/qdel); resubmit if that was a mistake",
    "preempted": "the job was preempted by higher-priority work; use a partition/queue without preemption",
    "node-failure": "the node failed; nothing in your code caused it",
    "connection-lost": "the worker's connection dropped; check the network and the worker log",
    "heartbeat-lost": "the worker stopped answering (hung process, stopped, or network cut); check the node",
    "unknown": "no evidence explains this death; look at the worker's log (hpc-cluster logs WORKER)",
}

# Job states in which the batch system, not the job's own content, ended the job.
EXTERNAL_ENDS = frozenset({"timeout", "deadline", "preempted", "node-fail", "boot-fail", "cancelled"})

# Lines in a job's stdout/stderr that tell what ended it.
LOG_PATTERNS = [
    ("walltime", re.compile(r"DUE TO TIME LIMIT|job killed: walltime|PBS: job killed: walltime|"
                            r"exceeded limit .*walltime", re.I)),
    ("preempted", re.compile(r"DUE TO PREEMPTION", re.I)),
    ("node-failure", re.compile(r"DUE TO NODE FAILURE", re.I)),
    ("memory-batch", re.compile(r"oom[-_ ]kill event|Out Of Memory|job killed: mem|exceeded memory limit", re.I)),
    ("crash", re.compile(r"Segmentation fault|core dumped|Fatal Python error", re.I)),
    ("cancelled", re.compile(r"CANCELLED AT \S+\s*\*\*\*", re.I)),
    # Not a cause: the last line of a Python traceback (an ImportError in a job's prologue,
    # an exception in the worker) is shown as evidence.
    ("error", re.compile(r"^\s*(\w+\.)*\w*(Error|Exception)(: .*)?$")),
]


@dataclass
class Evidence:
    """Everything known about one death. Missing pieces are None / empty."""

    intent: str | None = None              # we asked it to leave: "scale-down", "down", "restart"
    connection: str | None = None          # "closed", "heartbeat-lost", "goodbye"
    nanny: dict | None = None              # the nanny's exit report
    accounting: dict | None = None         # the batch system's AccountingRecord, as a dict
    log_tail: list[str] = field(default_factory=list)
    executing: list[str] = field(default_factory=list)
    registered: bool = True                # False: the job ended before its worker joined
    job_id: str | None = None


@dataclass
class Verdict:
    cause: str
    blame: bool
    text: str
    evidence: list[str] = field(default_factory=list)
    advice: str = ""


def signal_name(num) -> str:
    try:
        return signal.Signals(int(num)).name
    except (ValueError, TypeError):
        return f"signal {num}"


def fmt_bytes(n) -> str:
    if not n:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return "?"


def fmt_seconds(s) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _running(ev: Evidence) -> str:
    if not ev.executing:
        return "while idle"
    shown = ", ".join(repr(k) for k in ev.executing[:3])
    return f"while running {shown}{' ...' if len(ev.executing) > 3 else ''}"


def _nanny(ev: Evidence) -> dict:
    return ev.nanny or {}


def _acct(ev: Evidence) -> dict:
    return ev.accounting or {}


def _acct_state(ev: Evidence) -> str | None:
    return _acct(ev).get("state")


def _step_oom(ev: Evidence) -> bool:
    """With a nanny the job lives on after a cgroup OOM; only its step says out-of-memory."""
    return any(s.get("state") == "out-of-memory" for s in _acct(ev).get("steps") or [])


def _log_says(ev: Evidence, cause: str) -> str | None:
    pattern = dict(LOG_PATTERNS)[cause]
    return next((line for line in reversed(ev.log_tail) if pattern.search(line)), None)


_STACK_HEAD = re.compile(r"^(Stack|Current thread \S+) \(most recent call first\):")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def crash_site(log_tail: list[str], frames: int = 3) -> str | None:
    """Where a crashed worker was, from the stack Python's faulthandler printed (the worker
    enables it): the innermost frames down to our own task runner, e.g.
    "string_at (ctypes/__init__.py:519) <- parse (mylib/fast.py:42)"."""
    for i in range(len(log_tail) - 1, -1, -1):             # the last crash in the tail
        if _STACK_HEAD.match(log_tail[i]):
            break
    else:
        return None
    shown = []
    for line in log_tail[i + 1:]:
        m = _FRAME.match(line)
        if m is None or m["file"].endswith("hpc_cluster/worker/worker.py"):
            break
        short = "/".join(m["file"].split("/")[-2:])
        shown.append(f"{m['func']} ({short}:{m['line']})")
    return " <- ".join(shown[:frames]) or None


def _job(ev: Evidence) -> str:
    return f"job {ev.job_id or _acct(ev).get('job_id') or '?'}"


def _memory_numbers(ev: Evidence) -> str:
    a = _acct(ev)
    rss = a.get("max_rss") or _nanny(ev).get("peak_rss")
    req = a.get("requested_memory")
    shown = fmt_bytes(rss) if rss else "not recorded"
    name = "MaxRSS" if a.get("max_rss") else "peak RSS"        # sacct's name, or the nanny's
    return f"{name} {shown} of {fmt_bytes(req)} requested" if req else f"{name} {shown}"


# Each rule: (predicate over evidence, builder of (cause, text)). First match wins; the
# order says which evidence is stronger: our intent, then the batch system's own verdict
# on the job, then kernel/nanny facts about the process, then log lines, then timing.
RULES = [
    (lambda ev: ev.intent is not None,
     lambda ev: ("retired", f"asked to leave ({ev.intent})")),
    # A job that never started its worker is a deployment fault, unless the batch system
    # itself ended it (time limit, preemption, a failed node, a cancel): then that is the cause.
    (lambda ev: not ev.registered and _acct_state(ev) not in EXTERNAL_ENDS,
     lambda ev: ("startup", f"{_job(ev)} ended ({_acct(ev).get('raw_state') or 'finished'}) before its "
                            "worker registered")),
    (lambda ev: _acct_state(ev) in ("timeout", "deadline") or _log_says(ev, "walltime"),
     lambda ev: ("walltime", f"{_job(ev)} reached its time limit ({fmt_seconds(_acct(ev).get('time_limit'))}) "
                             f"after {fmt_seconds(_acct(ev).get('elapsed'))} {_running(ev)}")),
    (lambda ev: _acct_state(ev) == "preempted" or _log_says(ev, "preempted"),
     lambda ev: ("preempted", f"{_job(ev)} was preempted by the batch system {_running(ev)}")),
    (lambda ev: _acct_state(ev) in ("node-fail", "boot-fail") or _log_says(ev, "node-failure"),
     lambda ev: ("node-failure", f"{_job(ev)}'s node {_acct(ev).get('node') or ''} failed {_running(ev)}")),
    (lambda ev: _nanny(ev).get("killed_by_nanny"),
     lambda ev: ("memory-nanny",
                 f"the nanny stopped the worker {_running(ev)}: memory reached "
                 f"{fmt_bytes(_nanny(ev).get('peak_rss'))}, over its budget of "
                 f"{fmt_bytes(_nanny(ev).get('memory_budget'))} "
                 f"({fmt_bytes(_nanny(ev).get('memory_limit'))} memory_limit)")),
    (lambda ev: _nanny(ev).get("cgroup_oom") or _acct_state(ev) == "out-of-memory" or _step_oom(ev)
     or (_log_says(ev, "memory-batch") and _nanny(ev).get("signal") in (None, 9)),
     lambda ev: ("memory-batch", f"the batch system's memory limit ended the worker {_running(ev)} "
                                 f"(the kernel's OOM killer fired in its cgroup; {_memory_numbers(ev)})")),
    (lambda ev: _acct_state(ev) == "cancelled",
     lambda ev: ("cancelled", f"{_job(ev)} was cancelled" + (f" by uid {_acct(ev)['cancelled_by']}"
                                                             if _acct(ev).get("cancelled_by") else "")
                 + f" {_running(ev)}")),
    (lambda ev: _nanny(ev).get("signal") in CRASH_SIGNALS or (not ev.nanny and _acct(ev).get("signal") in CRASH_SIGNALS),
     lambda ev: ("crash", f"the worker died of signal {_nanny(ev).get('signal') or _acct(ev).get('signal')} "
                          f"({signal_name(_nanny(ev).get('signal') or _acct(ev).get('signal'))}) {_running(ev)}"
                          + (f", in {site}" if (site := crash_site(ev.log_tail, 1)) else ""))),
    (lambda ev: ev.connection == "goodbye",
     lambda ev: ("retired", "the worker closed itself cleanly")),
    (lambda ev: (_nanny(ev).get("exit_code") or 0) != 0 and _nanny(ev).get("signal") is None and ev.executing,
     lambda ev: ("crash", f"the worker process exited with code {_nanny(ev)['exit_code']} {_running(ev)}")),
    # No nanny: the worker is the batch step's process, so the job's own exit code is the
    # worker's. A job that failed with a non-zero code while running a task was ended by it.
    (lambda ev: not ev.nanny and ev.executing and _acct_state(ev) == "failed"
     and (_acct(ev).get("exit_code") or 0) != 0,
     lambda ev: ("crash", f"the worker process (the job's batch step) exited with code "
                          f"{_acct(ev)['exit_code']} {_running(ev)}")),
    # The scheduler lost its heartbeat and asked the nanny to end it: the SIGKILL is ours.
    (lambda ev: _nanny(ev).get("unresponsive"),
     lambda ev: ("heartbeat-lost", f"the worker stopped answering heartbeats {_running(ev)}; its nanny found "
                                   f"the process {_nanny(ev)['unresponsive'].get('status', '?')} and ended it")),
    (lambda ev: _nanny(ev).get("signal") is not None,
     lambda ev: ("unknown", f"the worker was killed by {signal_name(_nanny(ev)['signal'])} from outside "
                            f"(not by its nanny, no OOM recorded in its cgroup) {_running(ev)}")),
    (lambda ev: ev.connection == "heartbeat-lost",
     lambda ev: ("heartbeat-lost", f"the worker stopped answering heartbeats {_running(ev)}")),
    (lambda ev: ev.connection == "closed",
     lambda ev: ("connection-lost", f"the connection to the worker closed {_running(ev)}")),
]


def diagnose(ev: Evidence) -> Verdict:
    """Decide the cause of a death from the evidence gathered so far."""
    facts = facts_of(ev)
    for applies, build in RULES:
        if applies(ev):
            cause, text = build(ev)
            blame = cause in BLAMED and bool(ev.executing)
            return Verdict(cause, blame, text, facts, ADVICE[cause])
    return Verdict("unknown", False, "no evidence about this death", facts, ADVICE["unknown"])


def facts_of(ev: Evidence) -> list[str]:
    """The evidence in one line per source, as the user will read it."""
    out = []
    n = ev.nanny
    if n:
        how = (f"signal {n['signal']} ({signal_name(n['signal'])})" if n.get("signal")
               else f"exit code {n.get('exit_code')}")
        out.append(f"nanny: worker pid {n.get('pid')} ended with {how}, peak RSS {fmt_bytes(n.get('peak_rss'))}"
                   + (", killed by the nanny over its memory budget" if n.get("killed_by_nanny") else "")
                   + (", cgroup OOM kill recorded" if n.get("cgroup_oom") else "")
                   + (f", ended by the nanny after the scheduler lost its heartbeat (process "
                      f"{n['unresponsive'].get('status', '?')})" if n.get("unresponsive") else ""))
    a = ev.accounting
    if a:
        code = f" {a.get('exit_code')}:{a.get('signal') or 0}" if a.get("exit_code") is not None else ""
        line = f"accounting: job {a.get('job_id')} {a.get('raw_state')}{code}"
        if a.get("state") in ("out-of-memory",) or _step_oom(ev) or a.get("max_rss"):
            line += f", {_memory_numbers(ev)}"
        if a.get("time_limit"):
            line += f", elapsed {fmt_seconds(a.get('elapsed'))} of {fmt_seconds(a.get('time_limit'))} limit"
        if a.get("cancelled_by"):
            line += f", cancelled by uid {a['cancelled_by']}"
        if a.get("node"):
            line += f", node {a['node']}"
        steps = [f"{s.get('step_id')} {s.get('raw_state')}" for s in a.get("steps") or []
                 if s.get("state") not in ("completed", None)]
        if steps:
            line += f" (steps: {', '.join(steps)})"
        out.append(line)
    for cause, _pattern in LOG_PATTERNS:
        hit = _log_says(ev, cause)
        if hit:
            out.append(f"log: {hit.strip()[:200]}")
    site = crash_site(ev.log_tail)
    if site:
        out.append(f"log: crashed in {site}")
    if ev.connection:
        out.append(f"connection: {ev.connection}")
    return out


def needs_accounting(ev: Evidence) -> bool:
    """Would the batch record still change the verdict? (Then keep asking for it.)"""
    return ev.job_id is not None and ev.intent is None and (ev.accounting is None or not ev.accounting.get("final"))
