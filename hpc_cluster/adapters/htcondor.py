"""HTCondor: condor_submit, condor_q, condor_rm, condor_history.

A job is a submit description (templates/htcondor.sub.j2) handed to condor_submit on stdin;
the job script runs as `/bin/sh -c '<script>'`, as dask-jobqueue runs it. HTCondor has no
walltime: we add one as a periodic_remove expression on our own attribute
HpcClusterWalltime, so a removal that names it is a timeout. A job over its memory is not
ended but *held* (HoldReasonCode 34, "Job has gone over cgroup memory limit ..."); a held job
never runs again by itself, so we report it out-of-memory (or failed, for other holds) and
remove it, keeping the hold's reason. Finished jobs leave condor_q for condor_history.

No HTCondor was installable here: the parsers are tested on outputs captured from public
sources (tests/unit/adapters/fixtures/htcondor/SOURCES.md). Pure parsers; commands go through the runner.
"""

from __future__ import annotations

import json
import math
import re
from typing import Sequence

from .base import (AccountingRecord, BatchAdapter, BatchError, JobSpec, JobStatus, check_env_names,
                   kept_directives)
from .options import AdapterOption

# What we ask condor_q and condor_history for (-attributes): the diagnosis's fields.
ATTRIBUTES = ("ClusterId,ProcId,JobStatus,ExitCode,ExitBySignal,ExitSignal,HoldReason,HoldReasonCode,"
              "LastHoldReason,LastHoldReasonCode,RemoveReason,RemoteWallClockTime,RequestMemory,MemoryUsage,"
              "ResidentSetSize,DaskWorkerMemory,HpcClusterWalltime,RemoteHost,LastRemoteHost,"
              "JobCurrentStartDate,CompletionDate,EnteredCurrentStatus,LastRejMatchReason")
COMMAND_TIMEOUT = 120.0           # condor_history reads the history file: it can take a while
_WALLTIME_ATTR = "HpcClusterWalltime"
_MEMORY_HOLD_CODE = 34            # JobOutOfResources (the starter's cgroup memory hold)
_USER_HOLD_CODE = 1               # condor_hold
_SUBMIT_RE = re.compile(r"(\d+) job\(s\) submitted to cluster (\d+)")
_RM_BY_RE = re.compile(r"condor_rm \(by user ([^)\s]+)\)")
_MEMORY_TEXT = re.compile(r"memory limit|out-of-memory|out of memory|over memory", re.I)
_USAGE_RE = re.compile(r"(?:Last measured usage|Peak usage): (\d+) megabytes")
_LIMIT_RE = re.compile(r"memory limit of (\d+) megabytes")
_STATUS_NAMES = {1: "Idle", 2: "Running", 3: "Removed", 4: "Completed", 5: "Held", 6: "Transferring Output",
                 7: "Suspended"}
MiB = 2**20


# -- the submit description ------------------------------------------------------------------------
def quote_argument_string(text: str) -> str:
    """`text` as one argument in HTCondor's "new" arguments syntax, without the surrounding double
    quotes: wrapped in single quotes, a ' doubled, a " doubled, and `$(` (a submit macro)
    written `$(DOLLAR)(`."""
    return "'" + condor_literal(text).replace("'", "''").replace('"', '""') + "'"


def condor_literal(text: str) -> str:
    """A value condor_submit must not expand: `$(` begins a macro, `$(DOLLAR)` is a literal $."""
    return text.replace("$(", "$(DOLLAR)(")


def environment_string(env: dict) -> str:
    """HTCondor's new environment syntax: NAME='value' separated by spaces, ' and " doubled."""
    return " ".join(f"{k}='{condor_literal(str(v)).replace(chr(39), chr(39) * 2).replace(chr(34), chr(34) * 2)}'"
                    for k, v in env.items())


# -- condor_submit and the ads ---------------------------------------------------------------------
def parse_condor_submit(text: str) -> str:
    """The job id ('42.0', as dask-jobqueue names it) of '1 job(s) submitted to cluster 42.'"""
    m = _SUBMIT_RE.search(text)
    if not m:
        raise BatchError(f"condor_submit printed no cluster id (expected 'N job(s) submitted to cluster C.'): "
                         f"{text.strip()!r}")
    return f"{m.group(2)}.0"


def parse_ads_json(text: str, what: str = "condor_q -json") -> list[dict]:
    """The job ads of `condor_q -json` / `condor_history -json`: a JSON list (nothing at all when
    no job matches). Each must have ClusterId, ProcId and JobStatus."""
    if not text.strip():
        return []
    try:
        ads = json.loads(text)
    except ValueError as exc:
        first = text.strip().splitlines()[:1]
        raise BatchError(f"{what} printed something that is not JSON ({exc}); first line: {first}") from None
    if not isinstance(ads, list):
        raise BatchError(f"{what} printed JSON that is not a list of job ads: {type(ads).__name__}")
    for ad in ads:
        if not isinstance(ad, dict) or not {"ClusterId", "ProcId", "JobStatus"} <= set(ad):
            raise BatchError(f"{what}: a job ad without ClusterId/ProcId/JobStatus: {str(ad)[:200]}; "
                             "ask for them with -attributes")
    return ads


def ad_id(ad: dict) -> str:
    return f"{ad['ClusterId']}.{ad['ProcId']}"


def _number(value) -> float | None:
    # condor -json prints an unevaluated expression as "\/Expr(...)\/": not a number we can use.
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _hold(ad: dict) -> tuple[str, int | None]:
    """The hold's reason and code: the current one, else the last one (a removed job's)."""
    if ad.get("HoldReason"):
        return str(ad["HoldReason"]), ad.get("HoldReasonCode")
    return str(ad.get("LastHoldReason") or ""), ad.get("LastHoldReasonCode")


def memory_hold(reason: str, code) -> bool:
    return code == _MEMORY_HOLD_CODE or bool(_MEMORY_TEXT.search(reason or ""))


def classify_ad(ad: dict) -> tuple[str, int | None]:
    """(state, signal) for one job ad. Pure; the table is in docs/htcondor.md."""
    status = ad.get("JobStatus")
    signal = int(ad["ExitSignal"]) if ad.get("ExitBySignal") is True and _number(ad.get("ExitSignal")) else None
    if status in (1,):
        return "pending", None
    if status in (2, 6, 7):
        return "running", None
    reason, code = _hold(ad)
    if status == 5:
        if code == _USER_HOLD_CODE:
            return "pending", None                     # condor_hold: it waits for condor_release
        return ("out-of-memory" if memory_hold(reason, code) else "failed"), signal
    if status == 4:
        if signal is not None:
            return "failed", signal
        return ("completed" if ad.get("ExitCode") == 0 else "failed"), None
    if status == 3:
        removed = str(ad.get("RemoveReason") or "")
        if reason and memory_hold(reason, code):
            return "out-of-memory", signal          # held over its memory, then removed (by us)
        if _WALLTIME_ATTR in removed:
            return "timeout", signal                # our walltime's periodic_remove
        if "condor_rm" in removed:
            return "cancelled", signal
        return "failed", signal                     # a site's policy: its words are in raw_state
    return "unknown", None


def _raw_state(ad: dict) -> str:
    status = ad.get("JobStatus")
    name = _STATUS_NAMES.get(status, f"JobStatus {status}")
    reason, code = _hold(ad)
    parts = [name]
    if status in (3, 5) and reason:
        parts.append(f"hold {code}: {reason}" if code is not None else f"hold: {reason}")
    if status == 3 and ad.get("RemoveReason"):
        parts.append(f"removed: {ad['RemoveReason']}")
    if status == 4:
        parts.append(f"signal {ad.get('ExitSignal')}" if ad.get("ExitBySignal") is True
                     else f"exit code {ad.get('ExitCode')}")
    return "; ".join(parts)


def _host(ad: dict) -> str | None:
    host = ad.get("RemoteHost") or ad.get("LastRemoteHost")
    return str(host).rsplit("@", 1)[-1] if host else None


def ad_status(ad: dict) -> JobStatus:
    state, _ = classify_ad(ad)
    elapsed = _number(ad.get("RemoteWallClockTime"))
    limit = _number(ad.get(_WALLTIME_ATTR))
    return JobStatus(job_id=ad_id(ad), state=state, raw_state=_raw_state(ad), node=_host(ad),
                     reason=(ad.get("LastRejMatchReason") or None) if state == "pending" else None,
                     elapsed=int(elapsed) if elapsed is not None else None,
                     time_limit=int(limit) if limit is not None else None)


def ad_accounting(ad: dict) -> AccountingRecord:
    """A job ad as an accounting record, with the numbers the diagnosis quotes."""
    state, signal = classify_ad(ad)
    reason, _ = _hold(ad)
    requested = _number(ad.get("RequestMemory"))
    requested_bytes = int(requested * MiB) if requested is not None else None
    if requested_bytes is None and _number(ad.get("DaskWorkerMemory")) is not None:
        requested_bytes = int(ad["DaskWorkerMemory"])
    limit = _LIMIT_RE.search(reason)
    if requested_bytes is None and limit:
        requested_bytes = int(limit.group(1)) * MiB
    usage = _number(ad.get("MemoryUsage"))
    rss = int(usage * MiB) if usage is not None else None
    if rss is None and _number(ad.get("ResidentSetSize")) is not None:
        rss = int(ad["ResidentSetSize"]) * 1024          # KiB
    used = _USAGE_RE.search(reason)
    if used:
        rss = max(rss or 0, int(used.group(1)) * MiB)
    elapsed = _number(ad.get("RemoteWallClockTime"))
    start, end = _number(ad.get("JobCurrentStartDate")), _number(ad.get("CompletionDate"))
    if elapsed is None and start and end:
        elapsed = end - start
    code = ad.get("ExitCode") if isinstance(ad.get("ExitCode"), int) and ad.get("ExitBySignal") is not True else None
    by = _RM_BY_RE.search(str(ad.get("RemoveReason") or ""))
    limit_s = _number(ad.get(_WALLTIME_ATTR))
    return AccountingRecord(
        job_id=ad_id(ad), state=state, raw_state=_raw_state(ad), exit_code=code, signal=signal,
        cancelled_by=by.group(1) if by and state == "cancelled" else None,
        elapsed=int(elapsed) if elapsed is not None else None, time_limit=int(limit_s) if limit_s else None,
        requested_memory=requested_bytes, max_rss=rss, node=_host(ad),
        start=str(int(start)) if start else None, end=str(int(end)) if end else None,
        raw="\n".join(f"{k} = {json.dumps(v)}" for k, v in ad.items()))


# -- the adapter ------------------------------------------------------------------------------------
class HTCondorAdapter(BatchAdapter):
    name = "htcondor"
    running_state = "Running"
    template_name = "htcondor.sub.j2"
    submit_command = "condor_submit"
    cancel_command = "condor_rm"
    title = "HTCondor"
    cluster_name = "HTCondorCluster"
    cluster_doc = """Workers as HTCondor jobs (condor_submit), joining one scheduler that explains their deaths.

    dask-jobqueue's HTCondorCluster, keyword for keyword: `disk` is required (request_disk),
    `job_extra_directives` is a dict of submit-description commands (a list of 'key = value'
    strings works too), `submit_command_extra` and `cancel_command_extra` go to condor_submit and
    condor_rm. The walltime is enforced by a periodic_remove expression, which HTCondor has no
    keyword for. Verified on outputs captured from public sources and on a simulator, not a real
    HTCondor (docs/htcondor.md)."""
    keywords = (
        AdapterOption("disk", "size", "request_disk per job (required there, as in dask-jobqueue)", example="1GB"),
        AdapterOption("submit_command_extra", "list of str", "extra arguments to condor_submit, e.g. "
                      "['-name', 'schedd.example.org']", default=[], elsewhere="ignore"),
        AdapterOption("cancel_command_extra", "list of str", "extra arguments to condor_rm (and condor_q/"
                      "condor_history), e.g. ['-name', 'schedd.example.org']", default=[], elsewhere="ignore"),
    )

    @classmethod
    def resolve_options(cls, values: dict, environ: dict) -> dict:
        if values.get("disk") is None:
            # As dask-jobqueue's HTCondorCluster: request_disk has no sensible default.
            raise ValueError("HTCondor needs the disk each job asks for: give disk='1 GB' (request_disk), as "
                             "dask-jobqueue's HTCondorCluster requires")
        return {}

    def __init__(self, runner=None):
        super().__init__(runner)
        self._held: dict[str, AccountingRecord] = {}    # held jobs we removed, as they were when held

    # -- rendering ----------------------------------------------------------------------------------
    def template_context(self, spec: JobSpec) -> dict:
        check_env_names(spec.env)
        for given, name in ((spec.resource_spec, "resource_spec"), (spec.job_cpu, "job_cpu"), (spec.job_mem, "job_mem")):
            if given:
                raise BatchError(f"{name} is not an HTCondor setting; add submit commands with "
                                 "job_extra_directives={'request_gpus': '1'}")
        disk = spec.batch_options.get("disk") or self.options.get("disk")
        if not disk:
            raise BatchError("HTCondor needs the disk each job asks for: give disk='1 GB' (request_disk)")
        # dask-jobqueue's HTCondorJob header, in its order and names; the requests are written as
        # numbers (not expressions over MY.DaskWorker*), so condor_q -json prints them as numbers.
        # batch_name is the job's own name, NAME-<index>, as dask-jobqueue's HTCondorJob writes its
        # `name` there (not job_name): condor_q's BATCH_NAME then names the workers the job runs.
        batch_name = f"{spec.worker_name}-{spec.worker_index}" if spec.worker_name else spec.job_name
        ours = [
            ('MY.DaskWorkerName = "htcondor--$F(MY.JobId)--"', "MY.DaskWorkerName"),
            (f"batch_name = {condor_literal(batch_name)}", "batch_name"),
            (f"RequestCpus = {spec.cores}", "RequestCpus"),
            (f"RequestMemory = {math.ceil(spec.memory / MiB)}", "RequestMemory"),
            (f"RequestDisk = {math.ceil(int(disk) / 1024)}", "RequestDisk"),
            ('MY.JobId = "$(ClusterId).$(ProcId)"', "MY.JobId"),
            (f"MY.DaskWorkerCores = {spec.cores}", "MY.DaskWorkerCores"),
            (f"MY.DaskWorkerMemory = {spec.memory}", "MY.DaskWorkerMemory"),
            (f"MY.DaskWorkerDisk = {int(disk)}", "MY.DaskWorkerDisk"),
            # HTCondor has no walltime: remove the job once it has run this long (checked every
            # PERIODIC_EXPR_INTERVAL, 60 s by default, so it ends up to a minute late).
            (f"MY.{_WALLTIME_ATTR} = {spec.walltime}", f"MY.{_WALLTIME_ATTR}"),
            (f"periodic_remove = (JobStatus == 2) && (time() - JobCurrentStartDate > {_WALLTIME_ATTR})",
             "periodic_remove"),
        ]
        if spec.account:
            ours.append((f"accounting_group = {spec.account}", "accounting_group"))
        # HTCondor has no queues: `queue` (a single word here) would be the submit command that
        # queues the job, so a queue= setting is left out (docs/htcondor.md).
        if spec.log_directory:
            log_dir = spec.log_directory.rstrip("/")
            ours += [(f"LogDirectory = {log_dir}", "LogDirectory"),
                     ("Output = $(LogDirectory)/worker-$F(MY.JobId).out", "Output"),
                     ("Error = $(LogDirectory)/worker-$F(MY.JobId).err", "Error"),
                     ("Log = $(LogDirectory)/worker-$(ClusterId).log", "Log"),
                     ("Stream_Output = True", "Stream_Output"), ("Stream_Error = True", "Stream_Error")]
        if spec.working_directory:
            ours.append((f"initialdir = {spec.working_directory}", "initialdir"))
        # Later commands win in a submit description: the user's extras override ours, as
        # dask-jobqueue's dict update does.
        extra = [d.strip() for d in spec.extra_directives]
        return {"directives": kept_directives(ours, spec.directives_skip) + extra,
                "environment": environment_string(spec.env), "arguments": "-c " + quote_argument_string(
                    "; ".join(self.job_lines(spec))).replace("$(DOLLAR)(ClusterId).$(DOLLAR)(ProcId)",
                                                           "$(ClusterId).$(ProcId)")}

    def job_lines(self, spec: JobSpec) -> list[str]:
        """The job script, one command a line; run by /bin/sh -c joined with '; '."""
        lines = ["export HPC_CLUSTER_JOB_START=$(date +%s)",      # first: the prologue counts
                 f"export HPC_CLUSTER_JOB_WALLTIME={spec.walltime}",
                 "export HPC_CLUSTER_JOB_ID=$(ClusterId).$(ProcId)",   # condor_submit fills these in
                 f"export HPC_CLUSTER_WORKER_INDEX={spec.worker_index}"]
        if spec.prologue:
            lines += ["set -e", *spec.prologue, "set +e"]
        if spec.epilogue:
            lines += [spec.worker_command, "HPC_CLUSTER_WORKER_STATUS=$?", *spec.epilogue,
                      "exit $HPC_CLUSTER_WORKER_STATUS"]
        else:
            lines.append(f"exec {spec.worker_command}")      # the job's own exit status is the worker's
        return lines

    # -- commands ------------------------------------------------------------------------------------
    def _run(self, argv: list[str], input: str | None = None):
        return self.runner.run(argv, input=input, timeout=COMMAND_TIMEOUT, check=False)

    def _extra(self, key: str) -> list[str]:
        return [str(a) for a in self.options.get(key) or []]

    def submit(self, script: str) -> str:
        result = self._run(["condor_submit", *self._extra("submit_command_extra")], input=script)
        if result.returncode != 0:
            raise BatchError(f"condor_submit refused the job (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()}")
        return parse_condor_submit(result.stdout)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        result = self._run(["condor_rm", *self._extra("cancel_command_extra"), *job_ids])
        if result.returncode == 0:
            return
        # 'Job 42.0 not found' / 'Couldn't find/remove all jobs matching constraint': already gone.
        problems = [line for line in (result.stdout + "\n" + result.stderr).splitlines()
                    if line.strip() and "not found" not in line and "Couldn't find/remove all jobs" not in line
                    and "marked for removal" not in line and "already" not in line]
        if problems:
            raise BatchError(f"condor_rm {' '.join(job_ids)} failed (exit {result.returncode}): {'; '.join(problems)}")

    def _queue(self, ids: list[str]) -> dict[str, dict]:
        result = self._run(["condor_q", *self._extra("cancel_command_extra"), "-json", "-attributes", ATTRIBUTES, *ids])
        if result.returncode != 0:
            raise BatchError(f"condor_q failed (exit {result.returncode}): {result.stderr.strip()}")
        return {ad_id(ad): ad for ad in parse_ads_json(result.stdout, "condor_q -json")}

    def _history(self, ids: list[str]) -> dict[str, dict]:
        """condor_history, one id a call (-limit 1: it stops at the job's record)."""
        out = {}
        for job_id in ids:
            result = self._run(["condor_history", *self._extra("cancel_command_extra"), "-json", "-limit", "1",
                                "-attributes", ATTRIBUTES, job_id])
            if result.returncode != 0:
                raise BatchError(f"condor_history {job_id} failed (exit {result.returncode}): {result.stderr.strip()}")
            for ad in parse_ads_json(result.stdout, "condor_history -json"):
                if ad_id(ad) == job_id:
                    out[job_id] = ad
        return out

    def _retire_held(self, ad: dict) -> None:
        """A job held for anything but condor_hold never runs again by itself: remember it as it
        was (its hold's reason, its memory numbers), then remove it."""
        job_id = ad_id(ad)
        if job_id not in self._held:
            self._held[job_id] = ad_accounting(ad)
            self.cancel([job_id])

    def _ads(self, job_ids: Sequence[str]) -> dict[str, dict]:
        ids = list(dict.fromkeys(job_ids))
        ads = self._queue(ids)
        for ad in ads.values():
            if ad.get("JobStatus") == 5 and classify_ad(ad)[0] != "pending":
                self._retire_held(ad)
        ads.update(self._history([i for i in ids if i not in ads and i not in self._held]))
        return ads

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        if not job_ids:
            return {}
        ads = self._ads(job_ids)
        out = {}
        for job_id in dict.fromkeys(job_ids):
            held = self._held.get(job_id)
            if held is not None:
                out[job_id] = JobStatus(job_id, held.state, held.raw_state, node=held.node, elapsed=held.elapsed,
                                        time_limit=held.time_limit)
            else:
                out[job_id] = ad_status(ads[job_id]) if job_id in ads else JobStatus(job_id, "unknown", "")
        return out

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord]:
        if not job_ids:
            return {}
        ads = self._ads(job_ids)
        out = {}
        for job_id in dict.fromkeys(job_ids):
            if job_id in self._held:
                out[job_id] = self._held[job_id]
            elif job_id in ads:
                out[job_id] = ad_accounting(ads[job_id])
        return out
