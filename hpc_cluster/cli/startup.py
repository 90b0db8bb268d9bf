"""`hpc-cluster up`'s wait: jobs going pending -> running -> worker connected, printed as they
change, until the workers it asked for are in (or the cluster halts, or time runs out)."""

from __future__ import annotations

import time
from pathlib import Path

from ..adapters import adapter_class
from ..deploy.launch import control
from ..protocol.messages import Op
from .lookup import CommandError
from .views import job_event, status_line, tail_lines


def watch_startup(name, path, info, proc, want: int, timeout: float, out) -> None:
    """Print jobs going pending -> running -> worker connected, until `want` workers are in."""
    tty = _isatty(out)
    seen: dict[str, tuple] = {}
    workers_seen: set[str] = set()
    start = time.monotonic()
    last_error = None

    def say(line: str) -> None:
        out.write(("\r\033[K" if tty else "") + line + "\n")
        out.flush()

    while True:
        try:
            table = control(path, Op.JOBS, timeout=60)
        except Exception as exc:
            if proc.poll() is not None:
                log = info.get("daemon_log")
                raise CommandError(f"the cluster daemon exited (code {proc.returncode}) while jobs "
                                   f"were starting; the end of its log ({log}):\n"
                                   + "\n".join(tail_lines(log, 20))) from None
            last_error = exc
            table = None
        if table is not None:
            for row in table["jobs"]:
                key = (row["state"], row.get("reason"), row.get("node"))
                if seen.get(row["job_id"]) != key:
                    seen[row["job_id"]] = key
                    say(job_event(row))
                for w in row.get("worker_names") or []:
                    if w not in workers_seen:
                        workers_seen.add(w)
                        say(f"worker {w} connected (job {row['job_id']})")
            live = [r for r in table["jobs"] if r["state"] in ("pending", "running")]
            connected = sum(len(r.get("workers") or []) for r in live)
            if tty:
                out.write("\r\033[K" + status_line(live, connected, want, time.monotonic() - start))
                out.flush()
            if connected >= want:
                if tty:
                    out.write("\r\033[K")
                say(f"{connected} worker(s) connected in {time.monotonic() - start:.1f} s")
                return
            stuck = _never_starting(live, info.get("batch"))
            if live and len(stuck) == len(live) and connected < want:
                if tty:
                    out.write("\n")
                held = ", ".join(f"job {r['job_id']} ({r.get('reason')})" for r in stuck)
                raise CommandError(
                    f"{connected} of {want} worker(s) connected, and the cluster's jobs will not start "
                    f"until someone acts: {held}. Release a held job (scontrol release JOB), or fix "
                    f"what its reason names (account, QOS, time or node limits), then "
                    f"`hpc-cluster scale {want} {name}`; the cluster is still up (`hpc-cluster down {name}` "
                    f"ends it)")
            if table.get("halted"):
                if tty:
                    out.write("\n")
                raise CommandError(f"the cluster stopped submitting jobs: {table['halted']}\n"
                                   + _last_startup_log(path) +
                                   f"the cluster is still up: fix the cause, then `hpc-cluster scale "
                                   f"{want} {name}`, or `hpc-cluster down {name}`")
        if time.monotonic() - start > timeout:
            if tty:
                out.write("\n")
            why = f" (last error talking to it: {last_error})" if last_error and table is None else ""
            raise CommandError(
                f"only {len(workers_seen)} of {want} worker(s) connected within {timeout:g} s{why}.\n"
                f"The cluster is still up and its jobs stay queued. See why with\n"
                f"  hpc-cluster status {name}        (job states, pending reasons)\n"
                f"  hpc-cluster logs JOB {name}      (a job's stdout/stderr)\n"
                f"  hpc-cluster logs daemon {name}\n"
                f"or wait longer with --timeout, or stop it with `hpc-cluster down {name}`")
        time.sleep(0.5 if time.monotonic() - start < 10 else 1.0)


def _never_starting(live: list[dict], batch: str | None) -> list[dict]:
    """The pending jobs whose reason says they will not start by waiting (a hold, a
    dependency never met, a limit they exceed): `up` would wait its whole timeout on them."""
    try:
        never = adapter_class(batch).never_starts if batch else frozenset()
    except Exception:  # noqa: BLE001  (an adapter that cannot load: nothing known to be stuck)
        return []
    return [r for r in live if r["state"] == "pending" and str(r.get("reason") or "").strip("()") in never]


def _last_startup_log(path: Path) -> str:
    """The newest death's log tail: usually the one line that says what broke."""
    from ..client.client import Client
    try:
        with Client(cluster_file=str(path), timeout=30) as client:
            deaths = [d for d in client.deaths() if d.get("log_tail")]
    except Exception:
        return ""
    if not deaths:
        return ""
    d = max(deaths, key=lambda d: d.get("time") or 0)
    lines = [str(ln).rstrip() for ln in d["log_tail"][-10:]]
    return f"the end of {d.get('name') or 'the last job'}'s log:\n" + "\n".join(f"  | {ln}" for ln in lines) + "\n"


def _isatty(f) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):
        return False
