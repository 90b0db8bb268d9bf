"""Evidence about a worker's death -> a verdict: cause, blame, explanation, advice.

Pure and table-driven. Evidence arrives in pieces: our own intent, the connection and the
nanny's exit report at once; the batch system's accounting record and the job's log tail
seconds later. `diagnose` is simply called again with more evidence and may refine the
verdict. The causes are the stable strings of DESIGN.md's table; only `memory-*` and
`crash` blame the tasks that were executing, and a memory death only when the running task's
own growth explains it, never the results the worker held (see `memory_blame`).
"""

from __future__ import annotations

import math
import re
import signal
from dataclasses import dataclass, field

from ..units import format_memory

from ..protocol.messages import BLAMED_CAUSES, MEMORY_CAUSES, Cause, Op

CAUSES = tuple(Cause)
BLAMED = BLAMED_CAUSES
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})
# A worker's exit code when its reconnect window (--reconnect-window) ended without a scheduler
# (worker/worker.py's EXIT_LOST_SCHEDULER; the scheduler may not import the worker).
EXIT_SCHEDULER_LOST = 4

# What the user should change, per cause: the "fix" part of every explanation.
ADVICE = {
    Cause.RETIRED: "nothing to do: the worker was asked to leave",
    Cause.WALLTIME: "raise walltime= (or the site's walltime), or split the work into shorter tasks",
    Cause.MEMORY_BATCH: "raise memory= (the job's request), use fewer processes= per job, or make the task use less memory",
    Cause.MEMORY_NANNY: "raise memory= / memory_limit (the worker's budget) or memory_terminate_fraction, "
                    "or make the task use less memory",
    Cause.CRASH: "the task killed its worker process: run it with client.recreate_error_locally() or in a "
             "local process to debug, check C extensions and their versions",
    Cause.STARTUP: "the job ended before its worker started: check python=, job_script_prologue and the "
               "environment in the job log (hpc-cluster logs JOB)",
    Cause.CANCELLED: "someone cancelled the job (scancel/qdel); resubmit if that was a mistake",
    Cause.PREEMPTED: "the job was preempted by higher-priority work; use a partition/queue without preemption",
    Cause.NODE_FAILURE: "the node failed; nothing in your code caused it",
    Cause.CONNECTION_LOST: "the worker's connection dropped; check the network and the worker log",
    Cause.SCHEDULER_LOST: "the scheduler was unreachable for longer than the worker's reconnect window (by default "
                      "the larger of 10 minutes and death_timeout): check that the scheduler runs (hpc-cluster "
                      "status) and is reachable from the nodes, or raise reconnect_window (the cluster's setting, "
                      "or --reconnect-window) to ride out longer outages",
    Cause.HEARTBEAT_LOST: "the worker stopped answering (hung process, stopped, or network cut); check the node",
    Cause.UNKNOWN: "no evidence explains this death; look at the worker's log (hpc-cluster logs WORKER)",
}

# Job states in which the batch system, not the job's own content, ended the job.
EXTERNAL_ENDS = frozenset({"timeout", "deadline", "preempted", "node-fail", "boot-fail", "cancelled"})

# Lines in a job's stdout/stderr that tell what ended it.
LOG_PATTERNS = [
    (Cause.WALLTIME, re.compile(r"DUE TO TIME LIMIT|job killed: walltime|PBS: job killed: walltime|"
                            r"exceeded limit .*walltime", re.I)),
    (Cause.PREEMPTED, re.compile(r"DUE TO PREEMPTION", re.I)),
    (Cause.NODE_FAILURE, re.compile(r"DUE TO NODE FAILURE", re.I)),
    (Cause.MEMORY_BATCH, re.compile(r"oom[-_ ]kill event|Out Of Memory|job killed: mem|exceeded memory limit", re.I)),
    (Cause.CRASH, re.compile(r"Segmentation fault|core dumped|Fatal Python error", re.I)),
    (Cause.CANCELLED, re.compile(r"CANCELLED AT \S+\s*\*\*\*", re.I)),
    # Not a cause: the last line of a Python traceback (an ImportError in a job's prologue,
    # an exception in the worker) is shown as evidence.
    ("error", re.compile(r"^\s*(\w+\.)*\w*(Error|Exception)(: .*)?$")),
]


@dataclass
class Evidence:
    """Everything known about one death. Missing pieces are None / empty."""

    intent: str | None = None              # we asked it to leave: "scale-down", "down", "restart"
    connection: str | None = None          # "closed", Cause.HEARTBEAT_LOST, Op.GOODBYE
    nanny: dict | None = None              # the nanny's exit report
    accounting: dict | None = None         # the batch system's AccountingRecord, as a dict
    log_tail: list[str] = field(default_factory=list)
    executing: list[str] = field(default_factory=list)
    registered: bool = True                # False: the job ended before its worker joined
    job_id: str | None = None
    # The worker's memory as the scheduler knew it (evidence.memory_evidence): its limit and
    # fractions, its last report (rss, peak_rss, managed results, spilled), its memory when
    # the oldest running task started (start_rss, start_managed), the cluster's stored results.
    memory: dict | None = None
    # A silent worker's nanny did not answer a ping either: the node, or the network to it,
    # went quiet, not the worker process alone (scheduler/links.py, issue 33).
    nanny_silent: bool = False
    # Seconds after its removal that a silent worker registered again (reattached): the
    # silence was a partition or a pause, and it is over.
    reattached_after: float | None = None
    # The host the worker ran on (its registration): a job over several nodes is judged on
    # that node's part of its accounting (node_view.py).
    host: str | None = None
    # The batch system's accounting failed to answer (slurmdbd down): its error.
    accounting_error: str | None = None
    # The worker ran under a nanny (so a report was to be expected from it).
    had_nanny: bool = False


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


def _sampled_peak(ev: Evidence) -> tuple[int | None, str]:
    """The most any sample saw, and whose name it goes by: the batch system's MaxRSS or the
    nanny's peak RSS, whichever is larger. Both sample (SLURM every 30 s by default, the nanny
    10 times a second), so both are floors; one death record names one figure for them, the
    same in its verdict and its advice (they used to give MaxRSS in one, the nanny's in the other)."""
    max_rss, peak = _acct(ev).get("max_rss"), _nanny(ev).get("peak_rss")
    if max_rss and (not peak or int(max_rss) >= int(peak)):
        return int(max_rss), "MaxRSS"
    return (int(peak), "peak RSS") if peak else (None, "peak RSS")


def _memory_numbers(ev: Evidence) -> str:
    rss, name = _sampled_peak(ev)
    req = _acct(ev).get("requested_memory")
    shown = format_memory(rss) if rss else "not recorded"
    return f"{name} {shown} of {format_memory(req)} requested" if req else f"{name} {shown}"


def _memory_enforcer(ev: Evidence) -> str:
    """Who ended it: the kernel in the job's cgroup when a cgroup OOM is on record (the nanny saw
    one, or the accounting says the job or a step ran out of memory the cgroup way, SLURM's
    OUT_OF_MEMORY); otherwise the batch system's own check (PBS's MOM, Grid Engine's h_vmem)."""
    raw = str(_acct(ev).get("raw_state") or "")
    if _nanny(ev).get("cgroup_oom") or _step_oom(ev) or raw.startswith("OUT_OF_MEMORY") or not ev.accounting:
        return "the kernel's OOM killer fired in its cgroup"
    return f"the batch system's memory check ended the job: {raw}" if raw else "the batch system's memory check"


# Each rule: (predicate over evidence, builder of (cause, text)). First match wins; the
# order says which evidence is stronger: our intent, then the batch system's own verdict
# on the job, then kernel/nanny facts about the process, then log lines, then timing.
RULES = [
    # A job whose worker had joined is pending again: the batch system requeued it (scontrol
    # requeue, preemption with PreemptMode=REQUEUE); it sent the worker SIGTERM, which looks
    # like a clean leave, so this comes first. We never requeue a job ourselves.
    (lambda ev: ev.registered and _acct_state(ev) == "pending",
     lambda ev: (Cause.PREEMPTED, f"{_job(ev)} was requeued by the batch system (scontrol requeue, or "
                                  f"preemption with requeue) {_running(ev)}: it is pending and will start again")),
    (lambda ev: ev.intent is not None,
     lambda ev: (Cause.RETIRED, f"asked to leave ({ev.intent})")),
    # A job that never started its worker is a deployment fault, unless the batch system
    # itself ended it (time limit, preemption, a failed node, a cancel): then that is the cause.
    (lambda ev: not ev.registered and _acct_state(ev) not in EXTERNAL_ENDS,
     lambda ev: (Cause.STARTUP, f"{_job(ev)} ended ({_acct(ev).get('raw_state') or 'finished'}) before its "
                            "worker registered")),
    (lambda ev: _acct_state(ev) in ("timeout", "deadline") or _log_says(ev, Cause.WALLTIME),
     lambda ev: (Cause.WALLTIME, f"{_job(ev)} reached its time limit ({fmt_seconds(_acct(ev).get('time_limit'))}) "
                             f"after {fmt_seconds(_acct(ev).get('elapsed'))} {_running(ev)}")),
    (lambda ev: _acct_state(ev) == "preempted" or _log_says(ev, Cause.PREEMPTED),
     lambda ev: (Cause.PREEMPTED, f"{_job(ev)} was preempted by the batch system {_running(ev)}")),
    (lambda ev: _acct_state(ev) in ("node-fail", "boot-fail") or _log_says(ev, Cause.NODE_FAILURE),
     lambda ev: (Cause.NODE_FAILURE, f"{_job(ev)}'s node {_acct(ev).get('node') or ''} failed {_running(ev)}"
                 + ("" if ev.connection != Cause.HEARTBEAT_LOST else
                    ", after the worker had fallen silent (it never came back)" if ev.reattached_after is None else
                    f", after the worker had fallen silent; it came back {ev.reattached_after:.0f} s later, "
                    "once the batch system had declared the node failed (its job is gone)"))),
    (lambda ev: _nanny(ev).get("killed_by_nanny"),
     lambda ev: (Cause.MEMORY_NANNY,
                 f"the nanny stopped the worker {_running(ev)}: memory reached "
                 f"{format_memory(_nanny(ev).get('peak_rss') or None)}, over its budget of "
                 f"{format_memory(_nanny(ev).get('memory_budget') or None)} "
                 f"({format_memory(_nanny(ev).get('memory_limit') or None)} memory_limit)")),
    (lambda ev: _nanny(ev).get("cgroup_oom") or _acct_state(ev) == "out-of-memory" or _step_oom(ev)
     or (_log_says(ev, Cause.MEMORY_BATCH) and _nanny(ev).get("signal") in (None, 9)),
     lambda ev: (Cause.MEMORY_BATCH, f"the batch system's memory limit ended the worker {_running(ev)} "
                                 f"({_memory_enforcer(ev)}; {_memory_numbers(ev)})")),
    (lambda ev: _acct_state(ev) == "cancelled",
     lambda ev: (Cause.CANCELLED, f"{_job(ev)} was cancelled" + (f" by uid {_acct(ev)['cancelled_by']}"
                                                             if _acct(ev).get("cancelled_by") else "")
                 + f" {_running(ev)}")),
    (lambda ev: _nanny(ev).get("signal") in CRASH_SIGNALS or (not ev.nanny and _acct(ev).get("signal") in CRASH_SIGNALS),
     lambda ev: (Cause.CRASH, f"the worker died of signal {_nanny(ev).get('signal') or _acct(ev).get('signal')} "
                          f"({signal_name(_nanny(ev).get('signal') or _acct(ev).get('signal'))}) {_running(ev)}"
                          + (f", in {site}" if (site := crash_site(ev.log_tail, 1)) else ""))),
    (lambda ev: ev.connection == Op.GOODBYE,
     lambda ev: (Cause.RETIRED, "the worker closed itself cleanly")),
    # The worker left because it could not reach us: whatever it was running, that is not the
    # task's doing (a paused or dead scheduler, a network cut), so before the exit-code rules.
    (lambda ev: _nanny(ev).get("exit_code") == EXIT_SCHEDULER_LOST and _nanny(ev).get("signal") is None
     or (not ev.nanny and _acct(ev).get("exit_code") == EXIT_SCHEDULER_LOST and not _acct(ev).get("signal")),
     lambda ev: (Cause.SCHEDULER_LOST, f"the worker lost the scheduler and gave up when its reconnect window "
                                   f"(--reconnect-window) ended {_running(ev)}")),
    (lambda ev: (_nanny(ev).get("exit_code") or 0) != 0 and _nanny(ev).get("signal") is None and ev.executing,
     lambda ev: (Cause.CRASH, f"the worker process exited with code {_nanny(ev)['exit_code']} {_running(ev)}")),
    # No nanny: the worker is the batch step's process, so the job's own exit code is the
    # worker's. A job that failed with a non-zero code while running a task was ended by it.
    (lambda ev: not ev.nanny and ev.executing and _acct_state(ev) == "failed"
     and (_acct(ev).get("exit_code") or 0) != 0,
     lambda ev: (Cause.CRASH, f"the worker process (the job's batch step) exited with code "
                          f"{_acct(ev)['exit_code']} {_running(ev)}")),
    # The scheduler lost its heartbeat and asked the nanny to end it: the SIGKILL is ours.
    (lambda ev: _nanny(ev).get("unresponsive"),
     lambda ev: (Cause.HEARTBEAT_LOST, f"the worker stopped answering heartbeats {_running(ev)}; its nanny found "
                                   f"the process {_nanny(ev)['unresponsive'].get('status', '?')} and ended it")),
    (lambda ev: _nanny(ev).get("signal") is not None,
     lambda ev: (Cause.UNKNOWN, f"the worker was killed by {signal_name(_nanny(ev)['signal'])} from outside "
                            f"(not by its nanny, no OOM recorded in its cgroup) {_running(ev)}")),
    # No report from a nanny, and the job's own process ended by a signal (FAILED 0:9): killed
    # from outside, the nanny itself if the worker had one (the job's main process).
    (lambda ev: not ev.nanny and _acct_state(ev) == "failed" and _acct(ev).get("signal"),
     lambda ev: (Cause.UNKNOWN, f"{_job(ev)}'s main process (the nanny, or the worker without one) was killed "
                            f"by {signal_name(_acct(ev)['signal'])} from outside: the batch system records "
                            f"{_acct(ev).get('raw_state')} {_acct(ev).get('exit_code') or 0}:{_acct(ev)['signal']}, "
                            f"not its memory limit {_running(ev)}")),
    (lambda ev: ev.connection == Cause.HEARTBEAT_LOST,
     lambda ev: (Cause.HEARTBEAT_LOST, f"the worker stopped answering heartbeats {_running(ev)}" + _silence(ev))),
    (lambda ev: ev.connection == "closed",
     lambda ev: (Cause.CONNECTION_LOST, f"the connection to the worker closed {_running(ev)}")),
]


def _silence(ev: Evidence) -> str:
    """What followed a worker's silence: it came back (a partition or a pause that ended), or
    its nanny was silent too (the node or the network to it, not the worker process)."""
    node = _acct(ev).get("node")
    running = _acct_state(ev) == "running"
    if ev.reattached_after is not None:
        return (f"; it came back {ev.reattached_after:.0f} s later and was reattached"
                + (" (its job was RUNNING throughout)" if running else "")
                + f": the network to its node{' ' + node if node else ''} was cut, or the node paused, "
                  "and it recovered")
    if ev.nanny_silent:
        return (f"; its nanny{' on ' + node if node else ''} did not answer either"
                + (" while the job was still RUNNING" if running else "")
                + ": the node or the network to it, not the worker process")
    return ""


def _advice(ev: Evidence, cause: str) -> str:
    if cause == Cause.STARTUP:
        return _refusal(ev)
    if cause == Cause.HEARTBEAT_LOST and ev.reattached_after is not None:
        node = _acct(ev).get("node")
        return (f"nothing to do: nothing was lost and no task was charged; if it happens again, ask your "
                f"admins about the network of node {node or '(see the accounting line)'}")
    return ADVICE[cause]


# How a worker that refuses to start says why, in its last lines (worker/__main__.py and
# engines/dask_worker.py: a version mismatch, a bad flag, no scheduler in the cluster file).
WORKER_SAYS = "hpc-cluster worker: "


def _refusal(ev: Evidence) -> str:
    """A startup death's fix: the worker's own refusal when it gave one, else the general advice."""
    said = next((line for line in reversed(ev.log_tail) if WORKER_SAYS in line), None)
    if said is None:
        return ADVICE[Cause.STARTUP]
    return f"the worker said: {said.split(WORKER_SAYS, 1)[1].strip()}"


def diagnose(ev: Evidence) -> Verdict:
    """Decide the cause of a death from the evidence gathered so far."""
    facts = facts_of(ev)
    for applies, build in RULES:
        if applies(ev):
            cause, text = build(ev)
            blame = cause in BLAMED and bool(ev.executing)
            if cause in MEMORY_CAUSES:
                picture = memory_picture(ev, cause)
                blame = blame and picture.charged is not False
                return Verdict(cause, blame, text + picture.story(blame, bool(ev.executing)),
                               facts + memory_facts(ev), memory_advice(picture, cause, blame))
            return Verdict(cause, blame, text, facts, _advice(ev, cause))
    return Verdict(Cause.UNKNOWN, False, "no evidence about this death", facts, ADVICE[Cause.UNKNOWN])


# -- memory deaths: what the running task allocated vs what the worker held ------------------
# A memory death is charged to the running task(s) only when their own growth (from the
# oldest one's start to the death, less results stored meanwhile) explains it: at least as
# much as the stored results the worker held in memory, and at least this share of its
# limit. Results are the user's (persist, scatter) or the cluster's (inputs of other tasks),
# never the running task's: a task that grew by a few MiB in a worker full of them is a
# victim, and failing it would fail good work (issue 13: a 32 MB random chunk got a
# TaskMemoryError in workers full of persisted results). Below a tenth of the limit a
# task's growth is within the noise of a process's own memory (a fresh worker with numpy
# takes ~100 MiB), too little to say it needs a bigger worker.
TASK_MIN_SHARE = 0.1
# Spilling's default target when a worker does not say (dask's distributed.worker.memory.target).
DEFAULT_TARGET = 0.6


@dataclass
class MemoryPicture:
    """The numbers of one memory death (bytes; None where unknown)."""

    limit: int | None = None          # the worker's memory_limit (or the job's request)
    request: int | None = None        # the job's memory request, as its accounting says
    at_death: int | None = None       # what the worker process had when it was ended (at least)
    sampled: int | None = None        # the most a sample saw (_sampled_peak, the record's figure)
    sampled_name: str = "peak RSS"
    growth: int | None = None         # what the running task(s) added since the oldest started
    start_rss: int | None = None      # the process when that task started
    other: int | None = None          # memory at that start that was not stored results
    held: int | None = None           # stored results in memory at the end (last report)
    spilled: int | None = None        # stored results on disk
    stored_total: int | None = None   # results all workers held
    fractions: dict = field(default_factory=dict)
    charged: bool | None = None       # None: not enough known to tell (charged, as before)

    def story(self, blame: bool, executing: bool) -> str:
        """What the verdict's text adds: how much the task grew and what the worker held."""
        held = (f"it held {_size(self.held)} of stored results in memory"
                + (f" ({_size(self.spilled)} more on disk)" if self.spilled else "")) if self.held else ""
        if not executing or self.growth is None:
            return f"; {held}" if held else ""
        grew = f"the running task grew by {'' if blame else 'only '}{_size(self.growth)} " \
               f"(from {_size(self.start_rss)} when it started)"
        if blame:
            return f"; {grew}" + (f"; {held}" if held else "")
        if self.held and self.held >= (self.other or 0):
            return f"; {held}, and {grew}: not the task's doing"
        return f"; {grew}, and {_size(self.other)} of other memory (not results) was in use then: not the task's doing"


def memory_picture(ev: Evidence, cause: str) -> MemoryPicture:
    m, n, a = ev.memory or {}, _nanny(ev), _acct(ev)
    p = MemoryPicture(limit=m.get("limit") or n.get("memory_limit") or a.get("requested_memory"),
                      request=a.get("requested_memory"),
                      held=m.get("managed"), spilled=m.get("spilled") or None,
                      stored_total=m.get("stored_total"), fractions=m.get("fractions") or {})
    # The nanny samples the process 10 times a second; without it, the worker's own reports
    # (every heartbeat), and the job's MaxRSS only when the worker is the whole job.
    seen = [n.get("peak_rss")] if ev.nanny else [m.get("peak_rss"), m.get("rss")]
    if not ev.nanny and not any(seen):
        seen.append(a.get("max_rss"))
    if cause == Cause.MEMORY_BATCH and m.get("limit"):
        # The kernel ends a process when its cgroup is full, and the worker's memory_limit is
        # at most its cgroup's: samples taken before a fast allocation undercount it. Where the
        # job's own request is smaller (Grid Engine's h_vmem is asked apart from memory=), the
        # job ended at that request, so that is the floor.
        seen.append(min(m["limit"], p.request) if p.request else m["limit"])
    p.at_death = max((int(x) for x in seen if x), default=None)
    p.sampled, p.sampled_name = _sampled_peak(ev)
    if p.sampled is None:
        p.sampled = max((int(x) for x in (m.get("peak_rss"), m.get("rss")) if x), default=None)
        p.sampled_name = "its last report"
    start_rss, start_managed = m.get("start_rss"), m.get("start_managed")
    if p.at_death is None or start_rss is None or not ev.executing:
        return p
    p.start_rss, p.other = start_rss, max(0, start_rss - (start_managed or 0))
    # Results stored (or spilled, freeing memory) since the task started are not its growth.
    p.growth = max(0, p.at_death - start_rss - ((p.held or 0) - (start_managed or 0)))
    p.charged = p.growth >= (p.held or 0) and p.growth >= TASK_MIN_SHARE * (p.limit or 0)
    return p


# Sizes to ask for: decimal, as users write them (memory='3GB'), rounded up to a round number.
_ROUND = (1, 1.5, 2, 3, 4, 5, 6, 8, 10)


def ask_for(nbytes: float) -> str:
    """'3GB', '600MB', '1.5GB': at least `nbytes`, rounded up to a round size."""
    exp = 10 ** max(0, math.floor(math.log10(max(nbytes, 1))))
    step = next(r for r in _ROUND if r * exp >= nbytes)
    size = step * exp
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}B"


def _size(n) -> str:
    return format_memory(n)


def memory_advice(p: MemoryPicture, cause: str, blame: bool) -> str:
    """The fix for a memory death, with a number in it."""
    limit = p.limit or p.at_death
    if not limit:
        return ADVICE[cause]              # nothing known of its memory: no number to give
    if blame or (p.growth is None and not p.held):
        # The task needs more than it got. It was stopped while still growing, so what it
        # reached is a floor: ask for a quarter more than that (over the nanny's fraction)
        # and at least half again the current limit.
        terminate = p.fractions.get("terminate") or 0.95
        need = ((p.other or 0) + p.growth) / terminate if p.growth is not None else 0
        size = ask_for(max(1.25 * need, 1.5 * limit))
        reached = f"the worker reached {_size(p.at_death)}"
        if p.sampled and p.sampled < p.at_death:       # the floor of a full cgroup, above any sample
            reached = (f"the worker filled its {_size(p.at_death)} limit (its last allocation came between two "
                       f"samples: {p.sampled_name} {_size(p.sampled)})")
        elif p.sampled and p.sampled > p.at_death:     # the job's MaxRSS: the worker's and the rest
            reached += f"; the job's {p.sampled_name} {_size(p.sampled)} counts its other processes too"
        grew = (f"the running task grew by {_size(p.growth)} ({reached})" if p.growth is not None else reached)
        if cause == Cause.MEMORY_BATCH and p.request and p.request < limit:
            # The batch system enforced a request below the workers' budget (Grid Engine's
            # resource_spec h_vmem, a site's default): that request is what to raise.
            return (f"{grew}; the job's memory request, what the batch system enforced, was {_size(p.request)}, "
                    f"below the workers' memory_limit of {_size(limit)}: raise the job's request (on Grid Engine "
                    f"resource_spec='h_vmem=...', or 'h_vmem={{memory}}' to ask for memory=) to '{ask_for(1.5 * p.request)}'"
                    " or more, or make the task use less memory")
        if cause == Cause.MEMORY_BATCH:
            return (f"{grew}; memory= gives {_size(limit)} per worker: raise memory= to '{size}' or more "
                    "per worker process (the job's request is shared by its processes), or make the task "
                    "use less memory")
        return (f"{grew}, over {terminate:.0%} of its memory_limit of {_size(limit)}: raise memory_limit "
                f"to '{size}' or more per worker (memory= '{size}' per worker process on a batch cluster) or "
                "memory_terminate_fraction, or make the task use less memory")
    if p.held and p.held >= (p.other or 0):
        f = p.fractions
        target = f.get("target") or DEFAULT_TARGET
        total = max(p.stored_total or 0, p.held + (p.spilled or 0))
        workers = math.ceil(total / (target * limit))
        if not f:
            spill = "spill results to disk (memory_target_fraction, memory_spill_fraction), "
        elif not (f.get("target") or f.get("spill")):
            spill = ("turn spilling on (memory_target_fraction: 0.6, memory_spill_fraction: 0.7; this worker "
                     "had both false), ")
        else:
            spill = "spilling did not keep up (check the free space of the workers' local_directory), "
        return (f"stored results filled the worker ({_size(p.held)} in memory), not the running task: {spill}"
                f"use at least {workers} workers of {_size(limit)} (the cluster holds {_size(total)} of results, "
                f"and {target:.0%} of a worker's memory is for results), or persist less (client.persist and "
                "dask.persist keep every chunk)")
    return (f"the worker's memory was neither stored results ({_size(p.held or 0)}) nor the running task's "
            f"growth ({_size(p.growth or 0)}): {_size(p.other)} was in use when the task started "
            "(libraries, memory earlier tasks did not give back to the OS, or a leak); restart the workers "
            f"(client.restart()) or raise memory_limit to '{ask_for(1.5 * limit)}' or more")


def memory_facts(ev: Evidence) -> list[str]:
    """The worker's own memory reports, as evidence of a memory death (other deaths do not
    need them)."""
    m = ev.memory or {}
    if m.get("rss") is None:
        return []
    return [f"memory: the worker's last report: {_size(m['rss'])}"
            + (f" of {_size(m['limit'])} memory_limit" if m.get("limit") else "")
            + f", {_size(m.get('managed') or 0)} of results in memory, {_size(m.get('spilled') or 0)} "
              f"spilled to disk ({m.get('spilled_count') or 0} results)" + (", paused" if m.get("paused") else "")
            + (f"; {_size(m['start_rss'])} when the running task started"
               if m.get("start_rss") is not None and ev.executing else "")]


def facts_of(ev: Evidence) -> list[str]:
    """The evidence in one line per source, as the user will read it."""
    out = []
    n = ev.nanny
    if n:
        how = (f"signal {n['signal']} ({signal_name(n['signal'])})" if n.get("signal")
               else f"exit code {n.get('exit_code')}")
        out.append(f"nanny: worker pid {n.get('pid')} ended with {how}, peak RSS {format_memory(n.get('peak_rss') or None)}"
                   + (", killed by the nanny over its memory budget" if n.get("killed_by_nanny") else "")
                   + (", cgroup OOM kill recorded" if n.get("cgroup_oom") else "")
                   + (f", ended by the nanny after the scheduler lost its heartbeat (process "
                      f"{n['unresponsive'].get('status', '?')})" if n.get("unresponsive") else ""))
    if ev.nanny_silent:
        out.append("nanny: did not answer the scheduler's ping either (no order to end the worker was sent)")
    if ev.reattached_after is not None:
        out.append(f"reconnection: the worker registered again {ev.reattached_after:.0f} s after it was "
                   "removed, with its results (reattached)")
    if ev.accounting_error and not ev.accounting:
        out.append(f"accounting: not available ({ev.accounting_error}); this verdict rests on the other "
                   "evidence and is corrected if the accounting, once back, says otherwise")
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


def peak_memory(ev: Evidence) -> int | None:
    """The most the worker process was seen to hold: the nanny's samples (that process alone),
    else the batch system's MaxRSS, else the worker's own last reports. A memory verdict moves
    the task to a pool of peak x margin (pools.py)."""
    m = ev.memory or {}
    seen = (_nanny(ev).get("peak_rss"), _acct(ev).get("max_rss"), m.get("peak_rss"), m.get("rss"))
    return next((int(x) for x in seen if x), None)


def needs_accounting(ev: Evidence) -> bool:
    """Would the batch record still change the verdict? (Then keep asking for it.)"""
    return ev.job_id is not None and ev.intent is None and (ev.accounting is None or not ev.accounting.get("final"))
