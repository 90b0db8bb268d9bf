"""`hpc-cluster down`: stop a cluster (its daemon retires the workers and cancels the jobs) and
confirm nothing is left; for a cluster whose daemon died, cancel the jobs its journal names.
A daemon in a scheduler job (scheduler_in_job) that does not answer has its job cancelled."""

from __future__ import annotations

import os
import signal
import time

from ..deploy.launch import control, daemon_running
from ..lifeline import alive
from ..deploy.daemon.scheduler_job import job_ids
from ..protocol.clusterfile import cluster_file_for
from ..protocol.messages import Op
from .lookup import (FAILED, OK, check_name, _liveness, _not_found, _remove_leftovers, cluster_names,
                     find_cluster, journal_jobs)
from .views import job_event


def cmd_down(args, out, err) -> int:
    if args.all:
        names = cluster_names()
        if not names:
            raise _not_found(None)
    else:
        if args.name is None:
            names = [find_cluster(None)[0]]
        else:
            check_name(args.name)
            if not cluster_file_for(args.name).exists():
                raise _not_found(args.name)
            names = [args.name]
    return max(_down_one(n, args.timeout, out, err) for n in names)


def _down_one(name: str, timeout: float, out, err) -> int:
    state, info = _liveness(name)
    pid = (info or {}).get("pid")
    if state != "running":
        if state == "starting":
            print(f"cluster {name!r} is still starting (no daemon pid yet); try again in a moment",
                  file=err)
            return FAILED
        left = journal_jobs(name) if state == "stopped" else []
        cancelled = _cancel_left(info or {}, left, err) if left else True
        _remove_leftovers(name)
        print(f"cluster {name!r} was not running (its daemon{f', pid {pid},' if pid else ''} is gone); "
              f"removed its stale cluster file{' and journal' if state == 'stopped' else ''}. "
              + (f"Cancelled the {len(left)} job(s) its journal named: {', '.join(left)}" if left and cancelled
                 else "Jobs it left behind, if any, show in `squeue --me` / `qstat -u $USER`"), file=out)
        return OK if cancelled else FAILED
    path = cluster_file_for(name)
    print(f"stopping cluster {name!r} (daemon pid {pid}): retiring workers, cancelling jobs ...",
          file=out, flush=True)
    table = None
    in_job = job_ids(info, path)             # a daemon in a scheduler job (scheduler_in_job)
    try:
        table = control(path, Op.SHUTDOWN, timeout=timeout)
    except Exception as exc:
        if in_job:
            # scancel's SIGTERM, far from the job's walltime, is a shutdown: the daemon ends its jobs.
            print(f"the daemon does not answer ({exc}); cancelling its scheduler job(s) {', '.join(in_job)}",
                  file=err)
            _cancel_left(info, in_job, err)
        else:
            print(f"the daemon does not answer ({exc}); sending it SIGTERM", file=err)
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    while daemon_running(info, path) if in_job else alive(int(pid), info.get("pid_started")):
        if time.monotonic() > deadline:
            stop = f"scancel {' '.join(in_job)}" if in_job else f"kill {pid}"
            print(f"the daemon ({'scheduler job ' + ', '.join(in_job) if in_job else f'pid {pid}'}) is still "
                  f"running after {timeout:g} s; stop it with `{stop}` and check the queue for its jobs", file=err)
            return FAILED
        time.sleep(1.0 if in_job else 0.1)
    if table is None and in_job:
        left = journal_jobs(name)              # a daemon killed before it could end its jobs
        if left and _cancel_left(info, left, err):
            print(f"cancelled the {len(left)} worker job(s) its journal named: {', '.join(left)}", file=err)
    leftovers = _remove_leftovers(name)     # the daemon removes its cluster file; the plan is ours
    if path in leftovers:
        print(f"removed the cluster file the daemon left behind: {path}", file=err)
    if table is None:
        print(f"cluster {name!r} is down (daemon gone, cluster file removed); could not read its "
              "final job states: check `squeue --me` / `qstat -u $USER`", file=out)
        return FAILED
    rows = table.get("jobs") or []
    for r in rows:
        print("  " + job_event(r), file=out)
    left = [r["job_id"] for r in rows if r["state"] in ("pending", "running", "unknown")]
    if left:
        cancel = "scancel" if info.get("batch") == "slurm" else "qdel"
        print(f"these jobs may still be in the queue: {', '.join(left)}; cancel them with "
              f"`{cancel} {' '.join(left)}`", file=err)
        return FAILED
    print(f"cluster {name!r} is down: {len(rows)} job(s) ended, daemon gone, cluster file removed",
          file=out)
    return OK


def _cancel_left(info: dict, job_ids: list[str], err) -> bool:
    """Cancel the jobs a dead daemon left (its journal's), with the batch system's own command."""
    from ..adapters import get_adapter
    from ..adapters.base import BatchError
    try:
        adapter = get_adapter(info.get("batch") or "")
    except ValueError:                    # 'local', or a plugin no longer installed
        adapter = None
    cancel = getattr(adapter, "cancel_command", "") or "the batch system's cancel command"
    if info.get("ssh") or adapter is None:
        print(f"cancel its jobs with `{cancel} {' '.join(job_ids)}`", file=err)
        return False
    try:
        adapter.cancel(job_ids)
        return True
    except BatchError as exc:
        print(f"could not cancel {', '.join(job_ids)} ({exc}); cancel them with `{cancel} {' '.join(job_ids)}`",
              file=err)
        return False
