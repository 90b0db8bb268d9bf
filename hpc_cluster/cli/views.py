"""How the cluster commands (cli/cluster.py) show things: pure formatting of the daemon's
job table and the scheduler's death records, so the look is tested without a cluster.

Death records are being extended (more evidence, more fields): read every field with
.get() and show what is there.
"""

from __future__ import annotations

import textwrap
import time
from collections import deque
from pathlib import Path

from ..units import format_memory

from ..protocol.messages import Cause

LIVE = ("pending", "running")


def dur(seconds) -> str:
    """12s, 3m05s, 1h02m, 2d03h; '-' for unknown."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def mem(nbytes) -> str:
    """Decimal units, as users write them in configs (memory: 16GB): '16GB', '1.5GB', '300MB'."""
    return format_memory(nbytes, decimal=True, significant=2, sep="", unknown="-")


def fmt_clock(t) -> str:
    if not t:
        return "-"
    lt = time.localtime(t)
    same_day = time.localtime().tm_yday == lt.tm_yday
    return time.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M:%S", lt)


def pending_state(row: dict) -> str:
    """'pending', 'pending (Resources)', 'pending (requeued, BeginTime)'."""
    why = ["requeued"] if row.get("requeued") else []
    if row.get("reason") and row["reason"] != "None":
        why.append(row["reason"])
    return "pending" + (f" ({', '.join(why)})" if why else "")


def shown_state(row: dict) -> str | None:
    """A job row's state as shown: `retired` for a job that ended because we retired it (the
    daemon's `retired`: its batch end state, a leftover OOM mark, would contradict its deaths)."""
    return Cause.RETIRED.value if row.get("ended_retired") and row.get("state") not in LIVE else row.get("state")


def job_event(row: dict) -> str:
    """One line for a job's state: 'job 123: pending (Resources)', 'job 123: running on vm'."""
    state, jid = shown_state(row), row.get("job_id")
    if state == "pending":
        return f"job {jid}: {pending_state(row)}"
    if state == "running":
        node = row.get("node")
        return f"job {jid}: running" + (f" on {node}" if node else "") + \
            (" (retiring)" if row.get("retiring") else "")
    raw = row.get("raw_state")
    extra = f" ({raw})" if raw and raw.lower() != str(state) and state != Cause.RETIRED else ""
    return f"job {jid}: {state}{extra}"


def status_line(live: list[dict], connected: int, want: int, elapsed: float) -> str:
    pending = sum(r["state"] == "pending" for r in live)
    running = sum(r["state"] == "running" for r in live)
    return (f"{connected}/{want} workers connected; jobs: {pending} pending, {running} running; "
            f"{elapsed:.0f} s")


def memory_cell(row: dict) -> str:
    """'2GB', or with its workers connected '1.2GB of 2GB, 3.4GB spilled, 1 paused'."""
    text = mem(row.get("memory"))
    if row.get("memory_used") is not None and row.get("state") in LIVE:
        text = f"{mem(row['memory_used'])} of {text}"
        if row.get("spilled"):
            text += f", {mem(row['spilled'])} spilled"
        if row.get("paused"):
            text += f", {row['paused']} paused"
    return text


# A state cell longer than this (SLURM's 'ReqNodeNotAvail, UnavailableNodes:...' lists nodes)
# would widen the whole table past a terminal: it is cut, and said whole under the table.
STATE_WIDTH = 40
WORKERS_WIDTH = 30
NOTE_WIDTH = 100


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 4] + "... "


def _workers_cell(names: list[str]) -> str:
    """'w-0,w-1', or for many '5 workers: w-0,w-1,...'."""
    text = ",".join(names) or "-"
    if len(text) <= WORKERS_WIDTH:
        return text
    shown = []
    for n in names:
        if shown and len(",".join(shown + [n])) > WORKERS_WIDTH - 12:
            break
        shown.append(n)
    return f"{len(names)} workers: {','.join(shown)},..."


def aligned(lines: list[tuple[str, ...]]) -> str:
    """Rows of cells (the head first) as columns, two spaces apart, no trailing blanks."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def jobs_table(rows: list[dict], max_finished: int = 10) -> str:
    """Live jobs, then the last `max_finished` finished ones, as an aligned table."""
    live = [r for r in rows if r.get("state") in LIVE]
    done = [r for r in rows if r.get("state") not in LIVE]
    hidden = max(0, len(done) - max_finished)
    done = done[hidden:] if max_finished > 0 else []
    if not live and not done:
        return "no jobs" + (f" ({hidden} finished not shown)" if hidden else "")
    head = ("JOB", "STATE", "WORKERS", "NODE", "UPTIME", "TIME LEFT", "MEMORY")
    lines, notes = [head], []
    for r in live + done:
        state = shown_state(r) or "?"
        if state == "pending":
            state = pending_state(r)
        elif state not in LIVE and state != Cause.RETIRED and r.get("raw_state"):
            state += f" ({r['raw_state']})"
        if r.get("retiring") and r.get("state") in LIVE:
            state += ", retiring"
        if len(state) > STATE_WIDTH:
            notes.append(textwrap.fill(f"job {r.get('job_id')}: {state}", NOTE_WIDTH, subsequent_indent="    ",
                                       break_on_hyphens=False))
            state = _cut(state, STATE_WIDTH).rstrip() + " (below)"
        lines.append((str(r.get("job_id")), state, _workers_cell(r.get("worker_names") or []), r.get("node") or "-",
                      dur(r.get("uptime")), dur(r.get("time_left")), memory_cell(r)))
    text = aligned(lines)
    if notes:
        text += "\n" + "\n".join(notes)
    if hidden:
        text += f"\n({hidden} older finished job(s) not shown; --finished K shows more)"
    return text


def pool_line(name: str, pool: dict, rows: list[dict]) -> str:
    """'pool bigmem: 1 core(s), 64GB, walltime 1h00m, queue bigmem, max 2 jobs; target 1, 1 in the queue, 1 worker(s)'."""
    live = [r for r in rows if r.get("state") in LIVE]
    spec = [f"{pool.get('cores')} core(s)", mem(pool.get("memory")), f"walltime {dur(pool.get('walltime'))}"]
    if (pool.get("nodes") or 1) > 1:           # cores and memory are per node then
        spec[:2] = [f"{pool['nodes']} nodes per job", f"{pool.get('processes') or 1} worker(s), "
                    f"{pool.get('cores')} core(s) and {mem(pool.get('memory'))} on each"]
    elif (pool.get("processes") or 1) > 1:
        spec.insert(1, f"{pool['processes']} workers per job")
    if pool.get("queue"):
        spec.append(f"queue {pool['queue']}")
    if pool.get("max_jobs") is not None:
        spec.append(f"max {pool['max_jobs']} job(s)")
    if pool.get("escalation_only"):
        spec.append("escalation only")
    state = [f"target {pool.get('target')}", f"{len(live)} in the queue",
             f"{sum(len(r.get('workers') or []) for r in live)} worker(s)"]
    if pool.get("demand_jobs"):
        state.append(f"work waiting for {pool['demand_jobs']} job(s)")
    adaptive = pool.get("adaptive")
    if adaptive:
        state.append(f"adaptive {adaptive[0]}..{'no limit' if adaptive[1] is None else adaptive[1]} jobs")
    return f"pool {name}: {', '.join(spec)}; {', '.join(state)}"


def pools_tables(table: dict, max_finished: int = 10) -> str:
    """The jobs grouped by pool, each under its pool's line (the daemon's table, deploy/daemon/pools.py)."""
    pools = table.get("pools") or {}
    rows = table.get("jobs") or []
    parts = []
    for name, pool in pools.items():
        mine = [r for r in rows if (r.get("pool") or "default") == name]
        parts.append(pool_line(name, pool, mine) + "\n" + indent(jobs_table(mine, max_finished)))
    return "\n\n".join(parts)


def indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def print_deaths(deaths: list[dict], out, detail: bool, tail: int = 20) -> None:
    for d in deaths:
        who = d.get("name") or d.get("worker") or "?"
        blame = d.get("blame")
        blamed = "blamed on its task" if blame else ("not blamed" if blame is not None else "blame ?")
        line = f"  {fmt_clock(d.get('time'))}  {who}  {d.get('cause', Cause.UNKNOWN)}  {blamed}"
        if d.get("pool") and d["pool"] != "default":
            line += f"  (pool {d['pool']})"
        if not detail:
            print(f"{line}  {d.get('text') or ''}".rstrip(), file=out)
            for text in _escalations(d):
                print(f"      -> {text}", file=out)
            continue
        print(f"\n{line}", file=out)
        where = [f"address {d['worker']}"] if d.get("worker") and d.get("worker") != who else []
        if d.get("job_id") and str(d["job_id"]) not in who:
            where.append(f"job {d['job_id']}")
        if where:
            print(f"    {', '.join(where)}", file=out)
        if d.get("text"):
            print(f"    {d['text']}", file=out)
        if d.get("advice"):
            print(f"    what to do: {d['advice']}", file=out)
        for text in _escalations(d):
            print(f"    escalation: {text}", file=out)
        if d.get("executing"):
            print(f"    executing: {', '.join(map(str, d['executing']))}", file=out)
        queued = [k for k in d.get("processing") or [] if k not in (d.get("executing") or [])]
        if queued:
            print(f"    also queued there (not charged): {len(queued)} task(s)", file=out)
        evidence = d.get("evidence") or []
        if isinstance(evidence, dict):
            evidence = [f"{k}: {v}" for k, v in evidence.items()]
        if evidence:
            print("    evidence:", file=out)
            for fact in evidence:
                print(f"      - {fact}", file=out)
        log = list(d.get("log_tail") or [])[-tail:] if tail > 0 else []
        if log:
            print(f"    last {len(log)} log line(s):", file=out)
            for ln in log:
                print(f"      | {str(ln).rstrip()}", file=out)


def _escalations(d: dict) -> list[str]:
    """A death's `escalation` text (the scheduler's: "attempt 2 on bigmem (64 GB) after ..."),
    one string or a list of them."""
    esc = d.get("escalation")
    if not esc:
        return []
    return [str(e) for e in esc] if isinstance(esc, (list, tuple)) else [str(esc)]


def tail_lines(path, n: int) -> list[str]:
    if not path:
        return []
    try:
        with open(Path(path).expanduser(), errors="replace") as f:
            return [ln.rstrip("\n") for ln in deque(f, maxlen=max(0, n))]
    except OSError as exc:
        return [f"(cannot read {path}: {exc.strerror})"]
