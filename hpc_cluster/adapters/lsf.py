"""IBM Spectrum LSF (and Platform LSF): bsub, bjobs, bkill.

LSF keeps a finished job in `bjobs -a` for CLEAN_PERIOD (an hour by default), with the
termination reason the diagnosis needs (`EXIT_REASON`: TERM_RUNLIMIT, TERM_MEMLIMIT,
TERM_OWNER ...), its exit code, run time, run limit, memory limit and peak memory. So one
command, `bjobs -a -o "<fields>" -json ID ...`, answers both status and accounting. After
CLEAN_PERIOD only bhist/bacct know the job; we do not read them yet (docs/lsf.md).

No LSF was installable here: the parsers are tested on outputs captured from public
documentation and other projects' tests (tests/unit/adapters/fixtures/lsf/SOURCES.md), and the
command cycle on a simulator (tests/helpers/lsf_sim/). Pure parsers; commands go through the runner.
"""

from __future__ import annotations

import json
import math
import re
from typing import Sequence

from .base import (AccountingRecord, BatchAdapter, BatchError, JobSpec, JobStatus, check_env_names,
                   clock_seconds, kept_directives)
from .options import AdapterOption
from ..units import WalltimeReading

# The bjobs -o fields we read, in one call (LSF 10.1 names; -json prints them upper case).
BJOBS_FIELDS = ("jobid stat exit_code exit_reason pend_reason run_time runtimelimit max_mem memlimit "
                "exec_host start_time finish_time")
COMMAND_TIMEOUT = 60.0

# STAT -> our states. EXIT needs its EXIT_REASON (below); ZOMBI is a job whose host stopped
# answering while LSF killed it.
_STATES = {
    "PEND": "pending", "PSUSP": "pending", "WAIT": "pending", "PROV": "pending",
    "RUN": "running", "USUSP": "running", "SSUSP": "running",      # suspended: the worker lives, frozen
    "DONE": "completed", "ZOMBI": "node-fail", "UNKWN": "unknown",
}
# Termination reasons (IBM: "Termination reasons displayed by bacct, bhist, and bjobs"),
# by the word before the colon. What is not here is a plain failure with its exit code.
_TERM = {
    "TERM_RUNLIMIT": "timeout", "TERM_MEMLIMIT": "out-of-memory", "TERM_SWAP": "out-of-memory",
    "TERM_OWNER": "cancelled", "TERM_ADMIN": "cancelled", "TERM_FORCE_OWNER": "cancelled",
    "TERM_FORCE_ADMIN": "cancelled", "TERM_REQUEUE_OWNER": "cancelled", "TERM_REQUEUE_ADMIN": "cancelled",
    "TERM_BUCKET_KILL": "cancelled",
    "TERM_PREEMPT": "preempted", "TERM_DEADLINE": "deadline",
    "TERM_ZOMBIE": "node-fail", "TERM_SLURM": "node-fail", "TERM_REMOVE_HUNG_JOB": "node-fail",
    "TERM_ORPHAN_SYSTEM": "node-fail", "TERM_RC": "preempted", "TERM_REQUEUE_RC": "preempted",
}
_OWNER_KILLS = {"TERM_OWNER", "TERM_FORCE_OWNER", "TERM_REQUEUE_OWNER"}
_BSUB_RE = re.compile(r"Job <(\d+)> is submitted")
_NOT_FOUND_RE = re.compile(r"Job <(\d+(?:\[\d+\])?)> is not found")
_MEM_RE = re.compile(r"^([0-9]*\.?[0-9]+)\s*([KMGTPE]?)(?:bytes|B)?$", re.I)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5, "E": 1024**6}
LSF_UNITS = ("kb", "mb", "gb", "tb", "pb", "eb")


# -- values -----------------------------------------------------------------------------------
def parse_lsf_memory(text: str | None, default_unit: str = "") -> int | None:
    """Bytes for bjobs' sizes: '5.2 Gbytes', '522 MBytes', '0 Mbytes', '2 G', '1000 M' (LSF
    prints binary units). A bare number is in `default_unit` (LSF_UNIT_FOR_LIMITS), else None."""
    text = (text or "").strip().split("/")[0].strip()
    if not text or text == "-":
        return None
    m = _MEM_RE.match(text)
    if not m:
        return None
    unit = m.group(2).upper() or default_unit[:1].upper()
    if not m.group(2) and not default_unit:
        return None
    return int(float(m.group(1)) * _UNITS[unit])


def parse_lsf_duration(text: str | None, bare: str = "seconds") -> int | None:
    """Seconds for bjobs' times: '16038 second(s)', '00:00:01', '00:10:00' and RUNTIMELIMIT's
    '1440.0' (minutes: `bare='minutes'`, as bsub -W and the limit are minutes); '600.0/hostA'
    (a limit normalized to a host) is the number before the slash."""
    text = (text or "").strip().split("/")[0].strip()
    if not text or text == "-":
        return None
    m = re.match(r"^(\d+(?:\.\d+)?)\s*(?:second\(s\)|seconds?|s)?$", text)
    if m:
        return int(round(float(m.group(1)) * (60 if bare == "minutes" and "second" not in text else 1)))
    return clock_seconds(text)


def lsf_walltime(seconds: int) -> str:
    """bsub -W's hours:minutes for a walltime in seconds, rounded up to whole minutes (LSF has
    no seconds), spelled as dask-jobqueue's default '00:30': 5400 -> '01:30', 59 -> '00:01'."""
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def lsf_memory(nbytes: int, units: str) -> str:
    """bsub -M's number for `nbytes` in `units` (LSF_UNIT_FOR_LIMITS: kb ... eb), rounded up,
    in powers of 1000 as dask-jobqueue's lsf_format_bytes_ceil writes it (LSF reads them as
    powers of 1024, so the limit is a little above memory=, never below)."""
    unit = (units or "kb").lower()
    if unit not in LSF_UNITS:
        raise BatchError(f"lsf_units={units!r}: use one of {', '.join(LSF_UNITS)} (LSF_UNIT_FOR_LIMITS in lsf.conf)")
    return str(math.ceil(nbytes / 1000 ** (LSF_UNITS.index(unit) + 1)))


def lsf_format_bytes_ceil(n: int, lsf_units: str = "mb") -> str:
    """lsf_memory under dask-jobqueue's name and signature (dask_jobqueue.lsf.lsf_format_bytes_ceil,
    units named by their first letter: 'mb', 'G'), so code written against that module, and
    dask-jobqueue's own test_lsf.py run on ours, find it here."""
    return lsf_memory(n, lsf_units.lower()[:1] + "b")


# -- bsub and bjobs ----------------------------------------------------------------------------
def parse_bsub(text: str) -> str:
    """The job id of 'Job <123> is submitted to queue <normal>.' (or '... to default queue')."""
    m = _BSUB_RE.search(text)
    if not m:
        raise BatchError(f"bsub printed no job id (expected 'Job <N> is submitted to queue <...>'): {text.strip()!r}")
    return m.group(1)


def _signal(exit_code: int | None) -> int | None:
    # LSF reports a job ended by a signal as 128 + the signal (bjobs -l: 'Exited with exit code 130').
    return exit_code - 128 if exit_code is not None and 128 < exit_code < 128 + 65 else None


def classify_bjobs(stat: str, exit_reason: str = "", exit_code: int | None = None) -> str:
    """Our state for STAT and, for EXIT, the termination reason. Pure; table in docs/lsf.md."""
    stat = stat.strip().upper()
    if stat != "EXIT":
        return _STATES.get(stat, "unknown")
    reason = exit_reason.split(":", 1)[0].strip().upper()
    return _TERM.get(reason, "failed")


def parse_bjobs_json(text: str) -> list[dict]:
    """The RECORDS of `bjobs -o ... -json`, each a dict of upper-case field -> text. A record
    with ERROR (an id LSF no longer knows) is kept: its JOBID and ERROR say so."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        first = text.strip().splitlines()[:1]
        raise BatchError(f"bjobs -json printed something that is not JSON ({exc}); first line: {first}. "
                         "Is this LSF 10.1 or later (-json)?") from None
    if not isinstance(data, dict) or not isinstance(data.get("RECORDS"), list):
        raise BatchError(f"bjobs -json printed no RECORDS list: keys {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    out = []
    for rec in data["RECORDS"]:
        if not isinstance(rec, dict) or not str(rec.get("JOBID", "")).strip():
            raise BatchError(f"a bjobs record without JOBID: {str(rec)[:200]}")
        out.append({str(k).upper(): "" if v is None else str(v) for k, v in rec.items()})
    return out


def _int(text: str) -> int | None:
    m = re.match(r"^\s*(-?\d+)\s*$", text or "")
    return int(m.group(1)) if m else None


def _raw(rec: dict) -> str:
    return "\n".join(f"{k}: {v}" for k, v in rec.items() if v not in ("", "-"))


def bjobs_status(rec: dict) -> JobStatus:
    """A bjobs record as the queue's word on the job now."""
    stat = rec.get("STAT", "")
    if rec.get("ERROR"):
        return JobStatus(rec["JOBID"], "unknown", rec["ERROR"])
    code = _int(rec.get("EXIT_CODE", ""))
    state = classify_bjobs(stat, rec.get("EXIT_REASON", ""), code)
    raw = stat + (f" ({rec['EXIT_REASON']})" if rec.get("EXIT_REASON") else "")
    return JobStatus(job_id=rec["JOBID"], state=state, raw_state=raw, node=_host(rec.get("EXEC_HOST")),
                     reason=(rec.get("PEND_REASON") or "").strip().rstrip(";") or None,
                     elapsed=parse_lsf_duration(rec.get("RUN_TIME")),
                     time_limit=parse_lsf_duration(rec.get("RUNTIMELIMIT"), bare="minutes"))


def _host(text: str | None) -> str | None:
    # '4*hostA:hostB' or 'tbi-cn019:tbi-cn019': the first host, without the slot count.
    first = (text or "").split(":")[0].strip()
    if not first or first == "-":
        return None
    return first.split("*")[-1] or None


def bjobs_accounting(rec: dict, units: str = "") -> AccountingRecord | None:
    """A bjobs record as an accounting record (None for an id LSF no longer knows)."""
    if rec.get("ERROR"):
        return None
    st = bjobs_status(rec)
    reason = (rec.get("EXIT_REASON") or "").strip()
    code = _int(rec.get("EXIT_CODE", ""))
    if code is None and rec.get("STAT", "").upper() == "DONE":
        code = 0                                      # DONE is exit 0; bjobs leaves the field empty
    term = reason.split(":", 1)[0].strip().upper()
    return AccountingRecord(
        job_id=st.job_id, state=st.state, raw_state=st.raw_state, exit_code=code, signal=_signal(code),
        cancelled_by="the job's owner" if term in _OWNER_KILLS else ("an LSF administrator" if "ADMIN" in term else None),
        elapsed=st.elapsed, time_limit=st.time_limit,
        requested_memory=parse_lsf_memory(rec.get("MEMLIMIT"), units),
        max_rss=parse_lsf_memory(rec.get("MAX_MEM"), units), node=st.node,
        start=(rec.get("START_TIME") or None), end=(rec.get("FINISH_TIME") or None), raw=_raw(rec))


def check_lsf_units(key, v):
    if not isinstance(v, str) or v.strip().lower() not in LSF_UNITS:
        raise ValueError(f"{key}={v!r} must be one of {', '.join(LSF_UNITS)}: LSF_UNIT_FOR_LIMITS in your lsf.conf")
    return v.strip().lower()


def lsf_conf_path(environ) -> str:
    """Where lsf.conf is, as dask-jobqueue's lsf_detect_units looks: $LSF_ENVDIR (or $LSF_CONFDIR), else /etc."""
    return (environ.get("LSF_ENVDIR") or environ.get("LSF_CONFDIR") or "/etc").rstrip("/") + "/lsf.conf"


def parse_lsf_conf_units(text: str | None) -> str:
    """LSF_UNIT_FOR_LIMITS in lsf.conf's text, as 'kb' ... 'eb': the last setting wins; 'kb'
    (LSF's default) without one, or without the file (None)."""
    for line in reversed((text or "").splitlines()):
        key, _, value = line.strip().partition("=")
        if key.strip() == "LSF_UNIT_FOR_LIMITS" and value.strip():
            unit = value.strip().strip("\"'").lower()[:1] + "b"
            if unit in LSF_UNITS:
                return unit
    return "kb"


# -- the adapter -------------------------------------------------------------------------------
class LSFAdapter(BatchAdapter):
    name = "lsf"
    running_state = "RUN"
    template_name = "lsf.sh.j2"
    submit_command = "bsub"
    cancel_command = "bkill"
    cluster_name = "LSFCluster"
    cluster_doc = """Workers as LSF jobs (bsub), joining one scheduler that explains their deaths.

    dask-jobqueue's LSFCluster, keyword for keyword: `project` is bsub's -P (our `account`),
    `walltime` is read as bsub -W reads it ('00:30' is half an hour, '90' is 90 minutes).
    Verified on outputs captured from public sources and on a simulator, not a real LSF (docs/lsf.md)."""
    native_keywords = {"project": "account"}          # dask-jobqueue's LSFCluster: bsub -P
    # bsub -W is [hours:]minutes: '30' is 30 minutes and '00:30' half an hour (dask-jobqueue's
    # LSF default). Seconds are not LSF's; 'HH:MM:SS' is read as ours, rounded up to minutes.
    walltime_reading = WalltimeReading(
        "LSF", "LSF's -W forms: minutes ('30'), 'HH:MM' ('01:30' is 90 minutes), 'HH:MM:SS' (rounded up "
        "to whole minutes), or units like '90m', '1h30m', '2d'", bare_minutes=True, hours_minutes=True)
    keywords = (
        AdapterOption("ncpus", "int > 0", "bsub -n, instead of cores", example=8, instead="cores"),
        AdapterOption("mem", "size", "the bsub -M memory limit, instead of memory", example="16GB", instead="memory"),
        AdapterOption("lsf_units", "kb|mb|gb|tb|pb|eb", "the unit of -M (LSF_UNIT_FOR_LIMITS); unset: read from "
                      "$LSF_ENVDIR/lsf.conf, else kb", check=check_lsf_units, example="mb"),
        AdapterOption("use_stdin", "bool", "submit with `bsub < script` (true) or `bsub script`", default=True,
                      elsewhere="ignore"),
    )

    @classmethod
    def job_options(cls, options: dict, read_text, environ: dict) -> dict:
        # As dask-jobqueue: without lsf_units, the site's lsf.conf says (read where hpc-cluster
        # runs; with ssh: give lsf_units, as dask-jobqueue has the same limit).
        out = dict(options)
        if "lsf_units" not in out:
            out["lsf_units"] = parse_lsf_conf_units(read_text(lsf_conf_path(environ)))
        return out

    # dask-jobqueue's LSF keywords arrive as JobSpec.batch_options (ncpus, mem, lsf_units: the
    # script's) and through configure() (use_stdin: how bsub is called, `bsub < script` by default,
    # `bsub script` where a site's LSF cannot read stdin; the file is written where the runner runs).

    # -- rendering ---------------------------------------------------------------------------
    def template_context(self, spec: JobSpec) -> dict:
        check_env_names(spec.env)
        if spec.resource_spec:
            raise BatchError("resource_spec is a PBS/SGE setting; on LSF ask for resources with "
                             "job_extra_directives=['-R \"rusage[mem=4000]\"']")
        if spec.job_cpu or spec.job_mem:
            raise BatchError("job_cpu and job_mem are SLURM settings; on LSF use ncpus= (bsub -n) and mem= (bsub -M)")
        opts = spec.batch_options
        ncpus = opts.get("ncpus") or spec.cores
        # deploy/batch_options.py fills lsf_units in from lsf.conf; without it, LSF's own default.
        units = opts.get("lsf_units") or self.options.get("lsf_units") or "kb"
        mem = lsf_memory(opts.get("mem") or spec.memory, units)
        # dask-jobqueue's LSFJob header, in its order and spelling (each with no other spelling).
        ours = [(f"#BSUB -J {spec.job_name}",)]
        if spec.log_directory:
            log_dir = spec.log_directory.rstrip("/")
            ours += [(f"#BSUB -e {log_dir}/{spec.job_name}-%J.err",), (f"#BSUB -o {log_dir}/{spec.job_name}-%J.out",)]
        if spec.queue:
            ours.append((f"#BSUB -q {spec.queue}",))
        if spec.account:
            ours.append((f'#BSUB -P "{spec.account}"',))
        ours.append((f"#BSUB -n {ncpus}",))
        if ncpus > 1:
            ours.append(('#BSUB -R "span[hosts=1]"',))      # all slots on one host: one worker job
        ours.append((f"#BSUB -M {mem}",))
        ours.append((f"#BSUB -W {lsf_walltime(spec.walltime)}",))
        if spec.working_directory:
            ours.append((f"#BSUB -cwd {spec.working_directory}",))
        extra = [d if d.lstrip().startswith("#BSUB") else f"#BSUB {d.strip()}" for d in spec.extra_directives]
        return {"directives": kept_directives(ours, spec.directives_skip) + extra}

    # -- commands ----------------------------------------------------------------------------
    def _run(self, argv: list[str], input: str | None = None):
        return self.runner.run(argv, input=input, timeout=COMMAND_TIMEOUT, check=False)

    def submit(self, script: str) -> str:
        if self.options.get("use_stdin", True):
            result = self._run(["bsub"], input=script)
        else:
            path = self._write_script(script)
            try:
                result = self._run(["bsub", path])
            finally:
                self.runner.run(["rm", "-f", path], check=False)
        if result.returncode != 0 or not _BSUB_RE.search(result.stdout):
            raise BatchError(f"bsub refused the job (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()}")
        return parse_bsub(result.stdout)

    def _write_script(self, script: str) -> str:
        made = self.runner.run(["mktemp", "-t", "hpc-cluster-XXXXXX.sh"], check=False)
        path = made.stdout.strip()
        if made.returncode != 0 or not path:
            raise BatchError(f"use_stdin=False: could not make a file for the job script: {made.stderr.strip()}")
        wrote = self.runner.run(["sh", "-c", 'cat > "$1"', "sh", path], input=script, check=False)
        if wrote.returncode != 0:
            raise BatchError(f"use_stdin=False: could not write {path}: {wrote.stderr.strip()}")
        return path

    def cancel(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        result = self._run(["bkill", *job_ids])
        if result.returncode == 0:
            return
        # bkill of a finished job: 'Job <5>: Job has already finished' (exit 255).
        problems = [line for line in (result.stdout + "\n" + result.stderr).splitlines()
                    if line.strip() and "already finished" not in line and "is being terminated" not in line
                    and not _NOT_FOUND_RE.search(line)]
        if problems:
            raise BatchError(f"bkill {' '.join(job_ids)} failed (exit {result.returncode}): {'; '.join(problems)}")

    def _bjobs(self, job_ids: Sequence[str]) -> dict[str, dict]:
        ids = list(dict.fromkeys(job_ids))
        result = self._run(["bjobs", "-a", "-o", BJOBS_FIELDS, "-json", *ids])
        text = result.stdout.strip()
        if not text:
            # Every id unknown: older LSF prints only 'Job <N> is not found' on stderr.
            if result.returncode != 0 and not _NOT_FOUND_RE.search(result.stderr):
                raise BatchError(f"bjobs failed (exit {result.returncode}): {result.stderr.strip()}")
            return {}
        return {rec["JOBID"]: rec for rec in parse_bjobs_json(text)}

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        if not job_ids:
            return {}
        records = self._bjobs(job_ids)
        return {i: bjobs_status(records[i]) if i in records else JobStatus(i, "unknown", "")
                for i in dict.fromkeys(job_ids)}

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord]:
        if not job_ids:
            return {}
        units = self.options.get("lsf_units") or ""     # how bjobs prints a bare number, if it does
        out = {}
        for job_id, rec in self._bjobs(job_ids).items():
            record = bjobs_accounting(rec, units)
            if record is not None:
                out[job_id] = record
        return out
