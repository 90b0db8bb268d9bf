"""Evidence about a worker's death -> a verdict: cause, blame, explanation.

Pure and table-driven. Evidence arrives in pieces (our own intent, the connection, the
nanny's exit report at once; batch accounting and log tails later); `diagnose` is simply
called again with more evidence and may refine the verdict. The causes are the stable
strings of DESIGN.md's table; only `memory-*` and `crash` blame the running task.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

CAUSES = ("retired", "walltime", "memory-batch", "memory-nanny", "crash", "startup", "cancelled",
          "preempted", "node-failure", "connection-lost", "heartbeat-lost", "unknown")
BLAMED = frozenset({"memory-batch", "memory-nanny", "crash"})
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})


@dataclass
class Evidence:
    """Everything known about one death. Missing pieces are None."""

    intent: str | None = None              # we asked it to leave: "retire", "scale-down", "down"
    connection: str | None = None          # "closed", "heartbeat-lost", "goodbye"
    nanny: dict | None = None              # the nanny's exit report
    accounting: dict | None = None         # AccountingRecord as a dict (filled in by the batch layer)
    log_tail: list[str] = field(default_factory=list)
    executing: list[str] = field(default_factory=list)
    registered: bool = True                # False: the job ended before its worker joined


@dataclass
class Verdict:
    cause: str
    blame: bool
    text: str
    evidence: list[str] = field(default_factory=list)


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _fmt_bytes(n) -> str:
    if not n:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return "?"


def _running(ev: Evidence) -> str:
    if not ev.executing:
        return "while idle"
    shown = ", ".join(repr(k) for k in ev.executing[:3])
    return f"while running {shown}{' ...' if len(ev.executing) > 3 else ''}"


# Each rule: (name, predicate over evidence, builder of (cause, text)). First match wins;
# order encodes which evidence is stronger (our intent > kernel/nanny facts > timing).
def _nanny(ev):
    return ev.nanny or {}


RULES = [
    ("intent", lambda ev: ev.intent is not None,
     lambda ev: ("retired", f"asked to leave ({ev.intent})")),
    ("goodbye", lambda ev: ev.connection == "goodbye" and not _nanny(ev).get("killed_by_nanny"),
     lambda ev: ("retired", "the worker closed itself cleanly")),
    ("nanny-memory", lambda ev: _nanny(ev).get("killed_by_nanny"),
     lambda ev: ("memory-nanny",
                 f"the nanny stopped the worker {_running(ev)}: memory reached "
                 f"{_fmt_bytes(_nanny(ev).get('peak_rss'))}, over its budget of "
                 f"{_fmt_bytes(_nanny(ev).get('memory_budget'))} "
                 f"({_fmt_bytes(_nanny(ev).get('memory_limit'))} memory_limit)")),
    ("cgroup-oom", lambda ev: _nanny(ev).get("cgroup_oom"),
     lambda ev: ("memory-batch",
                 f"the kernel's OOM killer ended the worker {_running(ev)} in its memory cgroup "
                 f"(peak RSS {_fmt_bytes(_nanny(ev).get('peak_rss'))})")),
    ("crash-signal", lambda ev: _nanny(ev).get("signal") in CRASH_SIGNALS,
     lambda ev: ("crash", f"the worker died of {_nanny(ev)['signal']} "
                          f"({signal_name(_nanny(ev)['signal'])}) {_running(ev)}")),
    ("exit-nonzero", lambda ev: (_nanny(ev).get("exit_code") or 0) not in (0,) and ev.executing
     and _nanny(ev).get("signal") is None,
     lambda ev: ("crash", f"the worker process exited with code {_nanny(ev)['exit_code']} {_running(ev)}")),
    ("external-signal", lambda ev: _nanny(ev).get("signal") is not None,
     lambda ev: ("unknown", f"the worker was killed by {signal_name(_nanny(ev)['signal'])} from outside "
                            f"(not by its nanny, no OOM recorded in its cgroup) {_running(ev)}")),
    ("heartbeat", lambda ev: ev.connection == "heartbeat-lost",
     lambda ev: ("heartbeat-lost", f"the worker stopped answering heartbeats {_running(ev)}")),
    ("connection", lambda ev: ev.connection == "closed",
     lambda ev: ("connection-lost", f"the connection to the worker closed {_running(ev)}")),
]


def diagnose(ev: Evidence) -> Verdict:
    """Decide the cause of a death from the evidence gathered so far."""
    facts = _facts(ev)
    for _name, applies, build in RULES:
        if applies(ev):
            cause, text = build(ev)
            return Verdict(cause, cause in BLAMED and bool(ev.executing), text, facts)
    return Verdict("unknown", False, "no evidence about this death", facts)


def _facts(ev: Evidence) -> list[str]:
    out = []
    n = ev.nanny
    if n:
        how = f"signal {n['signal']} ({signal_name(n['signal'])})" if n.get("signal") else f"exit code {n.get('exit_code')}"
        out.append(f"nanny: worker pid {n.get('pid')} ended with {how}, peak RSS {_fmt_bytes(n.get('peak_rss'))}"
                   + (", killed by the nanny over its memory budget" if n.get("killed_by_nanny") else "")
                   + (", cgroup OOM kill recorded" if n.get("cgroup_oom") else ""))
    if ev.connection:
        out.append(f"connection: {ev.connection}")
    return out
