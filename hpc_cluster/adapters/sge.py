"""Grid Engine (Son of Grid Engine 8.x, and its SGE 6.2 / OGS relatives): qsub, qstat, qdel, qacct.

`qstat -xml` knows only jobs still in the queue; once a job ends, `qacct -j ID` (the
accounting file) is the only record of how: `failed` (did the shepherd start it, did a limit
end it), `exit_status` (128 + n for a signal), `ru_wallclock`, `maxvmem`, and `category`, the
-l requests (h_rt, h_vmem) the job ran under. Which limit ended a job is not written down
(failed 37 is "h_rt, h_cpu, or h_vmem"), so it is read off the numbers: see classify_qacct and
docs/sge.md. The parsers are pure and tested on outputs captured from a real gridengine 8.1.9
(tests/unit/adapters/fixtures/sge/, tests/batch/sge/capture_fixtures.py).
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from typing import Sequence

from .base import (RESOURCE_SPEC, AccountingRecord, BatchAdapter, BatchError, JobSpec, JobStatus,
                   check_env_names, clock_seconds, fill_resource_spec, kept_directives)
from ..units import WalltimeReading, format_walltime

# qstat's state letters (a job shows several at once: 'hqw', 'Eqw', 'dr', 'Rr'). Checked in
# this order: an error state wins over the rest, deletion and running over waiting.
_STATE_LETTERS = (
    ("E", "failed"),      # cannot start (an output file it cannot open, a bad shell): stays queued
    ("r", "running"), ("t", "running"),
    ("s", "running"), ("S", "running"), ("T", "running"),   # suspended: the worker lives, frozen
    ("q", "pending"), ("w", "pending"), ("h", "pending"),
)
# `failed` codes (sge_status(5), SGE's execd/shepherd): a job that failed this way never ran
# its script, or its host stopped knowing it.
_NODE_CODES = {19: "node-fail", 21: "node-fail", 25: "node-fail"}   # exit_status lost, job unknown, rescheduled
_LIMIT_CODES = {37, 40, 44}      # qmaster / execd enforced h_rt, h_cpu or h_vmem (40/44: other SGE versions)
_AFTER_JOB = 100                  # "assumedly after job": the job's own end, signals included
_SIGKILL, _SIGTERM = 9, 15
COMMAND_TIMEOUT = 120.0           # qacct reads the whole accounting file: it can take a while

_QSUB_RE = re.compile(r"Your job(?:-array)? (\d+)")
_TERSE_RE = re.compile(r"^(\d+)(?:\.\d+-\d+:\d+)?$")
_NOT_FOUND = re.compile(r"job id \S+ not found|does not exist|Following jobs do not exist", re.I)


# -- values ---------------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^([0-9]*\.?[0-9]+)\s*([KMGTkmgt]?)(B?)$")
_SIZE_SCALE = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4,
               "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_sge_size(text: str | None) -> int | None:
    """Bytes for a Grid Engine size: requests '300M', '1G', '2g' (upper case is 1024-based,
    lower case 1000-based, sge_types(1)) and qacct's '307.492MB', '0.000B' (1024-based)."""
    m = _SIZE_RE.match((text or "").strip())
    if not m:
        return None
    number, unit, b = m.groups()
    if b:                               # qacct prints its own sizes with a B: always binary
        unit = unit.upper()
    return int(float(number) * _SIZE_SCALE[unit])


def parse_sge_time(text: str | None) -> int | None:
    """Seconds for '6s', '6.021s', '6' (qacct) or '0:10:0', '600' (h_rt): [[h:]m:]s."""
    text = (text or "").strip().rstrip("s")
    return clock_seconds(text) if text else None


def parse_category(text: str | None) -> dict[str, str]:
    """The -l requests of qacct's `category`: '-q all.q -l h_rt=600,h_vmem=1G' -> {'h_rt': '600',
    'h_vmem': '1G'}. Only the hard requests: a `-soft` part is not enforced."""
    out: dict[str, str] = {}
    words = (text or "").split()
    soft = False
    for flag, value in zip(words, words[1:] + [""]):
        if flag == "-soft":
            soft = True
        elif flag == "-hard":
            soft = False
        elif flag == "-l" and not soft:
            for item in value.split(","):
                key, _, val = item.partition("=")
                if key:
                    out[key] = val
    return out


def sge_memory(nbytes: int) -> str:
    """An h_vmem value for a number of bytes, rounded up to whole MiB ('2048M'): never less."""
    return f"{max(1, math.ceil(nbytes / 2**20))}M"


# -- qsub and qstat ---------------------------------------------------------------------------
def parse_qsub(text: str) -> str:
    """The job id: 'Your job 12 ("name") has been submitted' or `-terse`'s '12'."""
    m = _QSUB_RE.search(text)
    if m:
        return m.group(1)
    for line in reversed(text.strip().splitlines()):
        m = _TERSE_RE.match(line.strip())
        if m:
            return m.group(1)
    raise BatchError(f"qsub printed no job id: {text.strip()!r}")


def map_qstat_state(code: str) -> str:
    """'r' -> running, 'qw'/'hqw' -> pending, 'Eqw' -> failed, 'dr' -> running; else unknown."""
    for letter, state in _STATE_LETTERS:
        if letter in code:
            return state
    return "unknown"


def _xml(text: str, what: str) -> ET.Element:
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        first = text.strip().splitlines()[:1]
        raise BatchError(f"{what} printed something that is not XML ({exc}); first line: {first}") from None


def parse_qstat_xml(text: str) -> list[JobStatus]:
    """`qstat -xml`: one JobStatus per job, running ones with their host (queue 'all.q@node')."""
    if not text.strip():
        return []
    root = _xml(text, "qstat -xml")
    if root.tag == "unknown_jobs":
        return []
    if root.tag != "job_info":
        raise BatchError(f"qstat -xml printed <{root.tag}>, not <job_info>: is this Grid Engine's qstat?")
    out = []
    for job in root.iter("job_list"):
        job_id = (job.findtext("JB_job_number") or "").strip()
        if not job_id:
            raise BatchError("qstat -xml listed a job without JB_job_number")
        raw = (job.findtext("state") or "").strip()
        queue = (job.findtext("queue_name") or "").strip()
        tasks = (job.findtext("tasks") or "").strip()
        # An array's tasks: a running one is a job_list of its own (<tasks>3</tasks>), pending
        # ones share one (<tasks>4-8:1</tasks>); each is a job to us, named <job>.<task>.
        for element in ([f"{job_id}.{t}" for t in expand_task_range(tasks)] if tasks else [job_id]):
            out.append(JobStatus(job_id=element, state=map_qstat_state(raw), raw_state=raw,
                                 node=queue.split("@", 1)[1] if "@" in queue else None))
    return out


_TASK_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def expand_task_range(text: str) -> list[int]:
    """Grid Engine's task list: '3', '4-8:1', '1-7:2', '1,3-4:1' -> the task numbers."""
    out = []
    for part in text.split(","):
        m = _TASK_RANGE.match(part.strip())
        if not m:
            raise BatchError(f"cannot read the array tasks {text!r} in qstat's output")
        first, last, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        out += list(range(first, last + 1, max(1, step)))
    return out


def parse_qstat_j_error(text: str) -> str | None:
    """Why a job is in error state, from `qstat -j ID`: its 'error reason' line, or None."""
    for line in text.splitlines():
        if line.startswith("error reason"):
            return line.split(":", 1)[1].strip() if ":" in line else line.strip()
    return None


# -- qacct --------------------------------------------------------------------------------------
def classify_qacct(failed: int, exit_status: int | None, *, wallclock: int | None = None,
                   h_rt: int | None = None, maxvmem: int | None = None, h_vmem: int | None = None,
                   h_cpu: bool = False) -> tuple[str, int | None]:
    """(state, signal) for one finished job. Pure; the table is in docs/sge.md.

    A limit kill (failed 37) does not say which limit: the one the job reached is the cause
    (h_rt before h_vmem, as time is measured exactly and vmem by sampling); if none reached
    shows, the only limit the job asked for; else 'failed'. 'assumedly after job' with SIGKILL
    is qdel's signal (SGE keeps no record of who deleted a job)."""
    signal = exit_status - 128 if exit_status is not None and 128 < exit_status < 128 + 65 else None
    if failed in _LIMIT_CODES:
        if h_rt and wallclock is not None and wallclock >= h_rt:
            return "timeout", signal
        if h_vmem and maxvmem is not None and maxvmem >= 0.95 * h_vmem:
            return "out-of-memory", signal
        asked = [state for state, given in (("timeout", h_rt or h_cpu), ("out-of-memory", h_vmem)) if given]
        return (asked[0] if len(asked) == 1 else "failed"), signal
    if failed in _NODE_CODES:
        return _NODE_CODES[failed], signal
    if failed == _AFTER_JOB and signal in (_SIGKILL, _SIGTERM):
        return "cancelled", signal
    if failed not in (0, _AFTER_JOB):
        return "failed", signal             # the shepherd could not start it (prolog, shell, output file ...)
    if exit_status == 0:
        return "completed", None
    return "failed", signal


def _blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith("====="):
            blocks.append({})
            continue
        if not line.strip():
            continue
        if not blocks:
            raise BatchError(f"qacct printed {line.strip()!r} before any '=====' record separator: "
                             "is this Grid Engine's qacct -j?")
        key, _, value = line.partition(" ")
        blocks[-1][key] = value.strip()
    return blocks


def _first_int(text: str | None) -> int | None:
    m = re.match(r"\s*(-?\d+)", text or "")
    return int(m.group(1)) if m else None


def parse_qacct(text: str) -> list[AccountingRecord]:
    """`qacct -j ID` -> records, one per job; a job accounted twice (rescheduled, or an id the
    accounting file holds from before) is its last record."""
    records: dict[str, AccountingRecord] = {}
    for block in _blocks(text):
        job_id = block.get("jobnumber", "").strip()
        if not job_id or "failed" not in block:
            raise BatchError(f"a qacct record without jobnumber/failed: {sorted(block)[:6]}")
        task = block.get("taskid", "undefined")
        if task not in ("undefined", ""):
            job_id = f"{job_id}.{task}"
        failed = _first_int(block["failed"]) or 0
        exit_status = _first_int(block.get("exit_status"))
        requests = parse_category(block.get("category"))
        h_rt = parse_sge_time(requests.get("h_rt") or requests.get("s_rt"))
        h_vmem = parse_sge_size(requests.get("h_vmem"))
        wallclock = parse_sge_time(block.get("ru_wallclock"))
        maxvmem = parse_sge_size(block.get("maxvmem"))
        state, signal = classify_qacct(failed, exit_status, wallclock=wallclock, h_rt=h_rt, maxvmem=maxvmem,
                                       h_vmem=h_vmem, h_cpu="h_cpu" in requests)
        raw = "\n".join(f"{k:<12} {v}" for k, v in block.items())
        records[job_id] = AccountingRecord(
            job_id=job_id, state=state, raw_state=f"failed {block['failed']}; exit_status {block.get('exit_status')}",
            exit_code=exit_status, signal=signal, elapsed=wallclock, time_limit=h_rt,
            requested_memory=h_vmem,
            # Grid Engine measures (and h_vmem limits) virtual memory; qacct's ru_maxrss is the
            # shepherd's own. maxvmem is the number the limit was checked against.
            max_rss=maxvmem, node=block.get("hostname") or None,
            start=block.get("start_time"), end=block.get("end_time"), raw=raw)
    return list(records.values())


# -- the adapter -----------------------------------------------------------------------------------
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def sanitize_job_name(name: str) -> str:
    """Grid Engine job names may not hold '/', ':', '@', '\\', '*', '?' nor start with a digit."""
    clean = _NAME_BAD.sub("-", name.strip()) or "hpc-cluster"
    return clean if not clean[0].isdigit() else "j" + clean


class SGEAdapter(BatchAdapter):
    name = "sge"
    running_state = "r"
    template_name = "sge.sh.j2"
    submit_command = "qsub"
    cancel_command = "qdel"
    cluster_name = "SGECluster"
    # h_rt is [[hours:]minutes:]seconds, like PBS's walltime (sge_types(1): time_specifier).
    walltime_reading = WalltimeReading(
        "SGE", "Grid Engine's h_rt forms: seconds ('3600'), 'MM:SS' ('90:00'), 'HH:MM:SS' (hours may "
        "pass 24), or units like '90m', '1h30m', '2d'")
    keywords = (RESOURCE_SPEC,)
    native_keywords = {"project": "account"}          # dask-jobqueue's SGECluster: qsub -P

    def __init__(self, runner=None):
        super().__init__(runner)
        # Grid Engine writes no accounting for a job deleted before it started, so a job we
        # deleted that leaves the queue without a record ended by that deletion.
        self._deleted: set[str] = set()
        self._errors: dict[str, str] = {}    # job id -> why it was in error state (Eqw), once deleted

    # -- rendering -----------------------------------------------------------------------------
    def template_context(self, spec: JobSpec) -> dict:
        check_env_names(spec.env)
        if spec.job_cpu or spec.job_mem:
            raise BatchError("job_cpu and job_mem are SLURM settings; on Grid Engine ask for slots with "
                             "job_extra_directives=['-pe smp 8'] and memory with resource_spec='h_vmem=...'")
        resources = None
        if spec.resource_spec:
            # As dask-jobqueue's -l line; {memory} etc. may fill it in: 'h_vmem={memory}'.
            resources = fill_resource_spec(spec, sge_memory(spec.memory), "h_vmem={memory}")
        name = sanitize_job_name(spec.job_name)
        # dask-jobqueue's SGEJob header, in its order and spelling.
        ours = [(f"#$ -N {name}",)]
        if spec.queue:
            ours.append((f"#$ -q {spec.queue}",))
        if spec.account:
            ours.append((f"#$ -P {spec.account}",))
        if resources:
            ours.append((f"#$ -l {resources}",))
        ours.append((f"#$ -l h_rt={format_walltime(spec.walltime)}",))
        if spec.log_directory:
            # A directory (trailing slash): Grid Engine names the file <name>.o<job id>.
            log_dir = spec.log_directory.rstrip("/") or ""
            ours += [(f"#$ -e {log_dir}/",), (f"#$ -o {log_dir}/",)]
        ours.append((f"#$ -wd {spec.working_directory}",) if spec.working_directory else ("#$ -cwd",))
        ours.append(("#$ -j y",))
        extra = [d if d.lstrip().startswith("#$") else f"#$ {d.strip()}" for d in spec.extra_directives]
        kept = kept_directives(ours, spec.directives_skip)
        if spec.array_size:
            kept.append(f"#$ -t 1-{spec.array_size}")     # Grid Engine's tasks count from 1
        return {"directives": kept + extra}

    # -- commands --------------------------------------------------------------------------------
    def _run(self, argv: list[str], input: str | None = None):
        return self.runner.run(argv, input=input, timeout=COMMAND_TIMEOUT, check=False)

    supports_arrays = True
    array_index_variable = "SGE_TASK_ID"

    def array_element_ids(self, array_id: str, count: int) -> list[str]:
        """qsub names the array's number ('Your job-array 123.1-4:1'); its tasks are 123.1 .. 123.<count>,
        as qstat's tasks column, qdel and qacct's taskid (parse_qacct) name them."""
        return [f"{array_id}.{i}" for i in range(1, count + 1)]

    def submit(self, script: str) -> str:
        result = self._run(["qsub"], input=script)
        if result.returncode != 0:
            raise BatchError(f"qsub refused the job (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()}")
        return parse_qsub(result.stdout)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        self._deleted.update(job_ids)
        result = self._run(["qdel", *job_ids])
        if result.returncode == 0:
            return
        # qdel says 'denied: job "5" does not exist' (on stdout) of a job that already ended.
        problems = [line for line in (result.stdout + "\n" + result.stderr).splitlines()
                    if line.strip() and not _NOT_FOUND.search(line) and "has deleted" not in line
                    and "registered the job" not in line]
        if problems:
            raise BatchError(f"qdel {' '.join(job_ids)} failed (exit {result.returncode}): {'; '.join(problems)}")

    def _queue(self) -> dict[str, JobStatus]:
        result = self._run(["qstat", "-xml"])
        if result.returncode != 0:
            raise BatchError(f"qstat -xml failed (exit {result.returncode}): {result.stderr.strip()}")
        return {s.job_id: s for s in parse_qstat_xml(result.stdout)}

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Every asked id: the queue's word, else the accounting's (final), else unknown."""
        if not job_ids:
            return {}
        ids = list(dict.fromkeys(job_ids))
        queued = self._queue()
        out = {i: queued[i] for i in ids if i in queued}
        for job_id, st in out.items():
            if st.state == "failed":
                self._retire_error(job_id, st)
        gone = [i for i in ids if i not in queued]
        for job_id, record in self._finished(gone).items():
            out[job_id] = JobStatus(job_id, record.state, record.raw_state, node=record.node,
                                    elapsed=record.elapsed, time_limit=record.time_limit)
        return {i: out.get(i) or JobStatus(i, "unknown", "") for i in ids}

    def _retire_error(self, job_id: str, st: JobStatus) -> None:
        """A job in error state (Eqw) never runs: Grid Engine keeps it queued for an admin to
        clear (qmod -cj). We report it failed, so nothing would delete it later: keep its
        reason (qstat -j) for the accounting, then delete it."""
        if job_id in self._errors:
            return
        reason = parse_qstat_j_error(self._run(["qstat", "-j", job_id]).stdout)
        self._errors[job_id] = f"{st.raw_state}: {reason}" if reason else st.raw_state
        self.cancel([job_id])

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord]:
        """qacct's record of each job that ended; a queued job's state (not final) from qstat;
        a job in error state (Eqw) as failed, with qstat -j's reason."""
        if not job_ids:
            return {}
        ids = list(dict.fromkeys(job_ids))
        queued = self._queue()
        out = {}
        for job_id in ids:
            st = queued.get(job_id)
            if st is not None and st.state == "failed":
                self._retire_error(job_id, st)
            if job_id in self._errors:     # never ran: no accounting will ever say more
                out[job_id] = AccountingRecord(job_id=job_id, state="failed", raw_state=self._errors[job_id],
                                               raw=self._errors[job_id])
            elif st is not None:
                out[job_id] = AccountingRecord(job_id=job_id, state=st.state, raw_state=st.raw_state,
                                               node=st.node, raw=st.raw_state)
        out.update(self._finished([i for i in ids if i not in queued and i not in self._errors]))
        return out

    def _finished(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord]:
        """qacct -j, one job per call (it takes one id); an array task's is `qacct -j JOB -t TASK`."""
        out = {}
        for job_id in job_ids:
            number, dot, task = job_id.partition(".")
            result = self._run(["qacct", "-j", number, "-t", task] if dot else ["qacct", "-j", job_id])
            if result.returncode != 0:
                if not _NOT_FOUND.search(result.stderr):
                    raise BatchError(f"qacct -j {job_id} failed (exit {result.returncode}): {result.stderr.strip()}")
                if job_id in self._deleted:
                    out[job_id] = AccountingRecord(job_id=job_id, state="cancelled", raw_state="deleted before it "
                                                   "started (qdel; Grid Engine keeps no accounting of it)",
                                                   raw=result.stderr.strip())
                continue
            for record in parse_qacct(result.stdout):
                if record.job_id == job_id:
                    out[job_id] = record
        return out
